/**
 * A v1 Service as the API server defaults and validates it (SetDefaults_Service,
 * ValidateService), shared by the node's API and the proxy's reading of
 * manifest files, so a Service file is refused for what kubectl apply would
 * be refused for, with the same field paths and messages. Pure: values in,
 * field errors out; a field of the wrong type is an error, never a crash.
 */

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const has = (v: unknown) => v !== undefined && v !== null;

/** One field error, shaped as a Status cause (reason, field, message). */
export interface ServiceFieldError {
  reason: 'FieldValueInvalid' | 'FieldValueRequired' | 'FieldValueForbidden' | 'FieldValueNotSupported' | 'FieldValueDuplicate' | 'FieldValueTooMany';
  field: string;
  message: string;
}

/**
 * A Service's loadBalancerSourceRanges become one firewall rule per range and
 * port; the API server sets no number, so a 3 MiB request could ask for
 * millions of rules. This node takes at most this many rules' worth.
 */
export const MAX_SOURCE_RANGE_RULES = 10_000;

const TYPES = ['ClusterIP', 'ExternalName', 'LoadBalancer', 'NodePort'] as const;
const PROTOCOLS = ['SCTP', 'TCP', 'UDP'] as const;
const AFFINITIES = ['ClientIP', 'None'] as const;
const TRAFFIC_POLICIES = ['Cluster', 'Local'] as const;
const TRAFFIC_DISTRIBUTIONS = ['PreferClose', 'PreferSameNode', 'PreferSameZone'] as const;
const MAX_AFFINITY_SECONDS = 86400;

const DNS1035 = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const QUALIFIED = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const IANA_SVC_NAME = /^[-a-z0-9]+$/;
const IPV4 = /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/;

// The API server's messages (k8s.io/apimachinery/pkg/util/validation), word for word.
const MSG_DNS1035 = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const MSG_DNS1123_LABEL = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const MSG_DNS1123_SUBDOMAIN = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const MSG_QUALIFIED = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const MSG_LABEL_VALUE = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const MSG_PORT_RANGE = 'must be between 1 and 65535, inclusive';
const MSG_CIDR = 'must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)';

/** A value as Go's %q/%v prints it in a message, cut short so a hostile value cannot make a huge message. */
function show(v: unknown): string {
  const text = typeof v === 'number' ? String(v) : (JSON.stringify(v) ?? String(v));
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

export function dns1035Errors(v: string): string[] {
  const out: string[] = [];
  if (v.length > 63) out.push('must be no more than 63 characters');
  if (!DNS1035.test(v)) out.push(MSG_DNS1035);
  return out;
}
export function dns1123LabelErrors(v: string): string[] {
  const out: string[] = [];
  if (v.length > 63) out.push('must be no more than 63 characters');
  if (!DNS1123_LABEL.test(v)) out.push(MSG_DNS1123_LABEL);
  return out;
}
export function dns1123SubdomainErrors(v: string): string[] {
  const out: string[] = [];
  if (v.length > 253) out.push('must be no more than 253 characters');
  if (!DNS1123_SUBDOMAIN.test(v)) out.push(MSG_DNS1123_SUBDOMAIN);
  return out;
}
export function qualifiedNameErrors(v: string): string[] {
  const slash = v.indexOf('/');
  const [prefix, name] = slash >= 0 ? [v.slice(0, slash), v.slice(slash + 1)] : ['', v];
  const out: string[] = [];
  if (slash >= 0) {
    if (prefix === '') out.push('prefix part must be non-empty');
    else for (const m of dns1123SubdomainErrors(prefix)) out.push(`prefix part ${m}`);
  }
  if (name === '') out.push('name part must be non-empty');
  else {
    if (name.length > 63) out.push('name part must be no more than 63 characters');
    if (!QUALIFIED.test(name)) out.push(MSG_QUALIFIED);
  }
  return out;
}
export function labelValueErrors(v: string): string[] {
  const out: string[] = [];
  if (v.length > 63) out.push('must be no more than 63 characters');
  if (!LABEL_VALUE.test(v)) out.push(MSG_LABEL_VALUE);
  return out;
}
/** IANA_SVC_NAME, as a named targetPort must be. */
export function portNameErrors(v: string): string[] {
  const out: string[] = [];
  if (v.length > 15) out.push('must be no more than 15 characters');
  if (!IANA_SVC_NAME.test(v)) out.push('must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)');
  if (v.includes('--')) out.push('must not contain consecutive hyphens');
  if (!/[a-z]/.test(v)) out.push('must contain at least one letter (a-z)');
  if (v.startsWith('-') || v.endsWith('-')) out.push('must not begin or end with a hyphen');
  return out;
}
const isIPv4 = (s: unknown): s is string => typeof s === 'string' && IPV4.test(s);
function isCidr(s: string): boolean {
  const [ip, bits, ...rest] = s.split('/');
  return rest.length === 0 && isIPv4(ip) && bits !== undefined && /^\d{1,2}$/.test(bits) && Number(bits) <= 32;
}

/**
 * The v1 defaults the API server gives a Service (SetDefaults_Service and the
 * strategy's), for one single-stack IPv4 node: ClusterIP, no affinity, TCP
 * ports that target themselves (a targetPort of 0 or "" means the port),
 * cluster-wide traffic policies, node ports for load balancers.
 */
export function applyServiceDefaults(spec: Obj): void {
  const setDefault = (o: Obj, field: string, value: unknown) => {
    if (!has(o[field])) o[field] = value;
  };
  setDefault(spec, 'sessionAffinity', 'None');
  if (spec.sessionAffinity === 'ClientIP') {
    if (!isObj(spec.sessionAffinityConfig)) spec.sessionAffinityConfig = {};
    const c = spec.sessionAffinityConfig as Obj;
    if (!isObj(c.clientIP)) c.clientIP = {};
    setDefault(c.clientIP as Obj, 'timeoutSeconds', 10800);
  }
  setDefault(spec, 'type', 'ClusterIP');
  if (Array.isArray(spec.ports)) {
    for (const p of spec.ports) {
      if (!isObj(p)) continue;
      setDefault(p, 'protocol', 'TCP');
      if (!has(p.targetPort) || p.targetPort === 0 || p.targetPort === '') p.targetPort = p.port;
      // 0 is the API's unset (an int32's zero value): allocate one where the type wants it, none elsewhere.
      if (p.nodePort === 0) delete p.nodePort;
    }
  }
  const externalIPs = Array.isArray(spec.externalIPs) && spec.externalIPs.length > 0;
  if (spec.type === 'NodePort' || spec.type === 'LoadBalancer' || (spec.type === 'ClusterIP' && externalIPs)) setDefault(spec, 'externalTrafficPolicy', 'Cluster');
  if (spec.type === 'LoadBalancer') setDefault(spec, 'allocateLoadBalancerNodePorts', true);
  if (spec.type === 'ExternalName') return;
  setDefault(spec, 'internalTrafficPolicy', 'Cluster');
  // The families a single-stack IPv4 node gives: a selector-less headless Service asks for every family there is.
  const ip = typeof spec.clusterIP === 'string' ? spec.clusterIP : '';
  const selectorless = !isObj(spec.selector) || Object.keys(spec.selector).length === 0;
  setDefault(spec, 'ipFamilyPolicy', ip === 'None' && selectorless ? 'RequireDualStack' : 'SingleStack');
  setDefault(spec, 'ipFamilies', ['IPv4']);
  if (ip !== '' && !Array.isArray(spec.clusterIPs)) spec.clusterIPs = [ip];
}

/** The Service wants a health-check node port: a LoadBalancer whose external traffic stays on the node. */
export const needsHealthCheck = (spec: Obj): boolean => spec.type === 'LoadBalancer' && spec.externalTrafficPolicy === 'Local';

class Errs {
  readonly list: ServiceFieldError[] = [];
  add(reason: ServiceFieldError['reason'], field: string, message: string): void {
    this.list.push({ reason, field, message });
  }
  invalid(field: string, value: unknown, why: string): void {
    this.add('FieldValueInvalid', field, `Invalid value: ${show(value)}: ${why}`);
  }
  required(field: string): void {
    this.add('FieldValueRequired', field, 'Required value');
  }
  forbidden(field: string, why: string): void {
    this.add('FieldValueForbidden', field, `Forbidden: ${why}`);
  }
  oneOf(field: string, value: unknown, allowed: readonly string[]): void {
    if (!has(value) || value === '') this.required(field);
    else if (!allowed.includes(value as string)) this.add('FieldValueNotSupported', field, `Unsupported value: ${show(value)}: supported values: ${allowed.map((a) => JSON.stringify(a)).join(', ')}`);
  }
  each(field: string, value: unknown, check: (v: string) => string[]): void {
    if (typeof value !== 'string') {
      this.invalid(field, value, 'must be a string');
      return;
    }
    for (const m of check(value)) this.invalid(field, value, m);
  }
}

function validateLabels(labels: unknown, field: string, e: Errs): void {
  if (!has(labels)) return;
  if (!isObj(labels)) {
    e.invalid(field, labels, 'must be a map of strings');
    return;
  }
  for (const [k, v] of Object.entries(labels)) {
    for (const m of qualifiedNameErrors(k)) e.invalid(field, k, m);
    if (typeof v !== 'string') e.invalid(`${field}[${k}]`, v, 'must be a string');
    else for (const m of labelValueErrors(v)) e.invalid(field, v, m);
  }
}

export interface ServiceValidationOptions {
  /**
   * Check metadata (name, namespace, labels) too: the API checks its annotations
   * and the rest of its metadata itself; the proxy's manifest files need all.
   */
  metadata?: boolean;
}

/**
 * The API server's ValidateService on a defaulted Service (applyServiceDefaults
 * first). A healthCheckNodePort left for the allocator is not an error here.
 */
export function serviceErrors(svc: Obj, opts: ServiceValidationOptions = {}): ServiceFieldError[] {
  const e = new Errs();
  const meta = isObj(svc.metadata) ? svc.metadata : {};
  if (!has(meta.name) || meta.name === '') e.required('metadata.name');
  else e.each('metadata.name', meta.name, dns1035Errors);
  if (opts.metadata) {
    if (has(meta.namespace) && meta.namespace !== '') e.each('metadata.namespace', meta.namespace, dns1123LabelErrors);
    validateLabels(meta.labels, 'metadata.labels', e);
  }
  if (has(svc.spec) && !isObj(svc.spec)) {
    e.invalid('spec', svc.spec, 'must be an object');
    return e.list;
  }
  const spec = (svc.spec ?? {}) as Obj;
  const type = spec.type;
  const clusterIP = spec.clusterIP;
  const headless = clusterIP === 'None';
  if (has(spec.ports) && !Array.isArray(spec.ports)) {
    e.invalid('spec.ports', spec.ports, 'must be a list');
    return e.list;
  }
  const ports = (spec.ports ?? []) as unknown[];
  if (ports.length === 0 && !headless && type !== 'ExternalName') e.required('spec.ports');

  switch (type) {
    case 'LoadBalancer':
    case 'NodePort':
      if (headless) e.invalid('spec.clusterIPs[0]', 'None', `may not be set to 'None' for ${type} services`);
      break;
    case 'ExternalName': {
      if (has(clusterIP) && clusterIP !== '') e.forbidden('spec.clusterIPs', 'may not be set for ExternalName services');
      else if (Array.isArray(spec.clusterIPs) && spec.clusterIPs.length > 0) e.forbidden('spec.clusterIPs', 'may not be set for ExternalName services');
      if (Array.isArray(spec.ipFamilies) && spec.ipFamilies.length > 0) e.forbidden('spec.ipFamilies', 'may not be set for ExternalName services');
      if (has(spec.ipFamilyPolicy)) e.forbidden('spec.ipFamilyPolicy', 'may not be set for ExternalName services');
      // A CNAME may end with a dot (fully qualified).
      const name = typeof spec.externalName === 'string' ? spec.externalName.replace(/\.$/, '') : spec.externalName;
      if (!has(name) || name === '') e.required('spec.externalName');
      else e.each('spec.externalName', name, dns1123SubdomainErrors);
      break;
    }
  }

  const names = new Set<string>();
  const portKeys = new Set<string>();
  const nodePortKeys = new Set<string>();
  ports.forEach((raw, i) => {
    const f = `spec.ports[${i}]`;
    if (!isObj(raw)) {
      e.invalid(f, raw, 'must be an object');
      return;
    }
    const p = raw;
    if (ports.length > 1 && (!has(p.name) || p.name === '')) e.required(`${f}.name`);
    else if (has(p.name) && p.name !== '') {
      e.each(`${f}.name`, p.name, dns1123LabelErrors);
      if (names.has(String(p.name))) e.add('FieldValueDuplicate', `${f}.name`, `Duplicate value: ${show(p.name)}`);
      names.add(String(p.name));
    }
    if (typeof p.port !== 'number' || !Number.isInteger(p.port) || p.port < 1 || p.port > 65535) e.invalid(`${f}.port`, p.port ?? 0, MSG_PORT_RANGE);
    e.oneOf(`${f}.protocol`, p.protocol, PROTOCOLS);
    const tp = p.targetPort;
    if (typeof tp === 'number') {
      if (!Number.isInteger(tp) || tp < 1 || tp > 65535) e.invalid(`${f}.targetPort`, tp, MSG_PORT_RANGE);
    } else if (typeof tp === 'string') {
      // A quoted number is an IntOrString's string: read as a port name by the API, as a number by kubectl's YAML.
      if (!/^\d+$/.test(tp)) for (const m of portNameErrors(tp)) e.invalid(`${f}.targetPort`, tp, m);
      else if (Number(tp) < 1 || Number(tp) > 65535) e.invalid(`${f}.targetPort`, tp, MSG_PORT_RANGE);
    } else if (has(tp)) e.invalid(`${f}.targetPort`, tp, 'must be a number or a port name');
    if (has(p.appProtocol)) e.each(`${f}.appProtocol`, p.appProtocol, qualifiedNameErrors);
    if (has(p.nodePort) && p.nodePort !== 0) {
      if (typeof p.nodePort !== 'number' || !Number.isInteger(p.nodePort) || p.nodePort < 0) e.invalid(`${f}.nodePort`, p.nodePort, 'must be a number');
      else if (type === 'ClusterIP' || type === 'ExternalName') e.forbidden(`${f}.nodePort`, `may not be used when \`type\` is '${String(type)}'`);
      else {
        const key = `${String(p.protocol)}/${p.nodePort}`;
        if (nodePortKeys.has(key)) e.add('FieldValueDuplicate', `${f}.nodePort`, `Duplicate value: ${p.nodePort}`);
        nodePortKeys.add(key);
      }
    }
    const key = `${String(p.protocol)}/${String(p.port)}`;
    if (portKeys.has(key)) {
      e.add('FieldValueDuplicate', f, `Duplicate value: core.ServicePort{Name:"", Protocol:${JSON.stringify(String(p.protocol ?? ''))}, AppProtocol:(*string)(nil), Port:${Number(p.port) || 0}, TargetPort:intstr.IntOrString{Type:0, IntVal:0, StrVal:""}, NodePort:0}`);
    }
    portKeys.add(key);
  });

  if (has(spec.selector)) validateLabels(spec.selector, 'spec.selector', e);

  e.oneOf('spec.sessionAffinity', spec.sessionAffinity, AFFINITIES);
  if (spec.sessionAffinity === 'ClientIP') {
    const c = spec.sessionAffinityConfig;
    if (!isObj(c)) e.add('FieldValueRequired', 'spec.sessionAffinityConfig', 'Required value: when session affinity type is ClientIP');
    else if (!isObj(c.clientIP)) e.add('FieldValueRequired', 'spec.sessionAffinityConfig.clientIP', 'Required value: when session affinity type is ClientIP');
    else {
      const t = c.clientIP.timeoutSeconds;
      const f = 'spec.sessionAffinityConfig.clientIP.timeoutSeconds';
      if (!has(t)) e.add('FieldValueRequired', f, 'Required value: when session affinity type is ClientIP');
      else if (typeof t !== 'number' || !Number.isInteger(t) || t <= 0 || t > MAX_AFFINITY_SECONDS) e.invalid(f, t, `must be greater than 0 and less than ${MAX_AFFINITY_SECONDS}`);
    }
  } else if (spec.sessionAffinity === 'None' && has(spec.sessionAffinityConfig)) {
    e.forbidden('spec.sessionAffinityConfig', 'must not be set when session affinity is None');
  }

  if (type !== 'ExternalName' && has(clusterIP) && clusterIP !== '' && clusterIP !== 'None' && !isIPv4(clusterIP)) {
    e.invalid('spec.clusterIPs[0]', clusterIP, 'must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)');
  }
  if (has(spec.externalIPs)) {
    if (!Array.isArray(spec.externalIPs)) e.invalid('spec.externalIPs', spec.externalIPs, 'must be a list');
    else spec.externalIPs.forEach((ip, i) => isIPv4(ip) || e.invalid(`spec.externalIPs[${i}]`, ip, 'must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)'));
  }

  e.oneOf('spec.type', type, TYPES);

  const ranges = spec.loadBalancerSourceRanges;
  if (has(ranges)) {
    if (!Array.isArray(ranges)) e.invalid('spec.loadBalancerSourceRanges', ranges, 'must be a list');
    else if (ranges.length > 0) {
      const f = 'spec.LoadBalancerSourceRanges';
      if (type !== 'LoadBalancer') e.forbidden(f, "may only be used when `type` is 'LoadBalancer'");
      const rules = ranges.length * Math.max(1, ports.length);
      if (rules > MAX_SOURCE_RANGE_RULES) {
        e.add('FieldValueTooMany', f, `Too many: ${ranges.length}: must have at most ${Math.floor(MAX_SOURCE_RANGE_RULES / Math.max(1, ports.length))} items (this node writes one firewall rule per source range and port, at most ${MAX_SOURCE_RANGE_RULES})`);
      } else {
        ranges.forEach((r, i) => (typeof r === 'string' && isCidr(r.trim())) || e.invalid(`${f}[${i}]`, r, MSG_CIDR));
      }
    }
  }
  if (has(spec.allocateLoadBalancerNodePorts)) {
    if (type !== 'LoadBalancer') e.forbidden('spec.allocateLoadBalancerNodePorts', "may only be used when `type` is 'LoadBalancer'");
    else if (typeof spec.allocateLoadBalancerNodePorts !== 'boolean') e.invalid('spec.allocateLoadBalancerNodePorts', spec.allocateLoadBalancerNodePorts, 'must be a boolean');
  } else if (type === 'LoadBalancer') e.required('allocateLoadBalancerNodePorts');
  if (has(spec.loadBalancerClass)) {
    if (type !== 'LoadBalancer') e.forbidden('spec.loadBalancerClass', "may only be used when `type` is 'LoadBalancer'");
    else e.each('spec.loadBalancerClass', spec.loadBalancerClass, qualifiedNameErrors);
  }

  const externallyAccessible = type === 'LoadBalancer' || type === 'NodePort' || (type === 'ClusterIP' && Array.isArray(spec.externalIPs) && spec.externalIPs.length > 0);
  if (!externallyAccessible) {
    if (has(spec.externalTrafficPolicy) && spec.externalTrafficPolicy !== '') e.invalid('spec.externalTrafficPolicy', spec.externalTrafficPolicy, 'may only be set for externally-accessible services');
  } else e.oneOf('spec.externalTrafficPolicy', spec.externalTrafficPolicy, TRAFFIC_POLICIES);
  const hc = spec.healthCheckNodePort;
  if (has(hc) && hc !== 0) {
    if (!needsHealthCheck(spec)) e.invalid('spec.healthCheckNodePort', hc, "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'");
    else if (typeof hc !== 'number' || !Number.isInteger(hc) || hc < 1 || hc > 65535) e.invalid('spec.healthCheckNodePort', hc, MSG_PORT_RANGE);
  }
  if (type === 'NodePort' || type === 'LoadBalancer' || type === 'ClusterIP') e.oneOf('spec.internalTrafficPolicy', spec.internalTrafficPolicy, TRAFFIC_POLICIES);
  else if (has(spec.internalTrafficPolicy)) e.oneOf('spec.internalTrafficPolicy', spec.internalTrafficPolicy, TRAFFIC_POLICIES);
  if (has(spec.trafficDistribution)) e.oneOf('spec.trafficDistribution', spec.trafficDistribution, TRAFFIC_DISTRIBUTIONS);
  if (has(spec.publishNotReadyAddresses) && typeof spec.publishNotReadyAddresses !== 'boolean') e.invalid('spec.publishNotReadyAddresses', spec.publishNotReadyAddresses, 'must be a boolean');
  return e.list;
}
