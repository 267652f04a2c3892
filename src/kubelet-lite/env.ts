/**
 * A container's environment as the kubelet resolves it: envFrom first, then
 * env in order, each value able to refer to the variables before it with
 * $(VAR); ConfigMap and Secret references, the downward API (fieldRef,
 * resourceFieldRef).
 */
import type { ConfigMap, Container, Pod, Secret, Service } from 'kubernetes-types/core/v1.js';
import { ContainerConfigError, type PodContext } from './model.js';
import { hostCapacity, resourceFieldValue, type NodeCapacity } from './resources.js';

// ---------------------------------------------------------------- $(VAR) expansion

/**
 * Expands $(NAME) with `lookup`; `$$` is a literal `$`; a reference lookup
 * does not know stays as written; a `$` before anything else is kept.
 */
export function expand(input: string, lookup: (name: string) => string | undefined): string {
  let out = '';
  let i = 0;
  while (i < input.length) {
    const ch = input[i];
    if (ch !== '$' || i + 1 >= input.length) {
      out += ch;
      i++;
      continue;
    }
    const next = input[i + 1];
    if (next === '$') {
      out += '$';
      i += 2;
    } else if (next === '(') {
      const close = input.indexOf(')', i + 2);
      if (close < 0) {
        out += '$(';
        i += 2;
      } else {
        const name = input.slice(i + 2, close);
        out += lookup(name) ?? `$(${name})`;
        i = close + 1;
      }
    } else {
      out += '$' + next;
      i += 2;
    }
  }
  return out;
}

export function mapLookup(env: Map<string, string>): (name: string) => string | undefined {
  return (name) => env.get(name);
}

// ---------------------------------------------------------------- objects

/** A Secret's data decoded (the API carries it as base64), with stringData over it as the API server merges it. */
export function secretData(s: Secret): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  for (const [k, v] of Object.entries(s.data ?? {})) out.set(k, Buffer.from(String(v), 'base64'));
  const sd = (s as Secret & { stringData?: Record<string, string> }).stringData;
  for (const [k, v] of Object.entries(sd ?? {})) out.set(k, Buffer.from(String(v)));
  return out;
}

/** A ConfigMap's data, then its binaryData (base64 in the API) decoded. */
export function configMapData(cm: ConfigMap): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  for (const [k, v] of Object.entries(cm.data ?? {})) out.set(k, Buffer.from(String(v)));
  for (const [k, v] of Object.entries(cm.binaryData ?? {})) if (!out.has(k)) out.set(k, Buffer.from(String(v), 'base64'));
  return out;
}

// ---------------------------------------------------------------- downward API

/** Go's %q for the strings the downward API writes out (labels and annotations files). */
export function goQuote(s: string): string {
  let out = '"';
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === '"' || ch === '\\') out += '\\' + ch;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\t') out += '\\t';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\x07') out += '\\a';
    else if (ch === '\b') out += '\\b';
    else if (ch === '\f') out += '\\f';
    else if (ch === '\v') out += '\\v';
    else if (c < 0x20 || c === 0x7f) out += '\\x' + c.toString(16).padStart(2, '0');
    else if (c >= 0x80 && c < 0xa0) out += '\\u' + c.toString(16).padStart(4, '0');
    else out += ch;
  }
  return out + '"';
}

/** `k="v"` lines sorted by key, as the downward API renders a whole label or annotation map. */
export function formatMap(m: Record<string, string>): string {
  return Object.keys(m)
    .sort()
    .map((k) => `${k}=${goQuote(m[k])}`)
    .join('\n');
}

const SUBSCRIPT = /^(metadata\.(?:labels|annotations))\['(.*)'\]$/;

/**
 * A pod field by its path, as env fieldRef and downwardAPI volumes select it.
 * `status.*` and `spec.*` are only known at run time, so they come from the context.
 */
export function podFieldValue(ctx: PodContext, fieldPath: string): string {
  const pod = ctx.pod;
  const sub = SUBSCRIPT.exec(fieldPath);
  if (sub) {
    const m = sub[1] === 'metadata.labels' ? pod.metadata?.labels : pod.metadata?.annotations;
    return m?.[sub[2]] ?? '';
  }
  const podIP = pod.spec?.hostNetwork ? ctx.hostIP : (ctx.podIP ?? '');
  switch (fieldPath) {
    case 'metadata.name':
      return pod.metadata?.name ?? '';
    case 'metadata.namespace':
      return pod.metadata?.namespace || 'default';
    case 'metadata.uid':
      return ctx.uid;
    case 'metadata.labels':
      return formatMap(pod.metadata?.labels ?? {});
    case 'metadata.annotations':
      return formatMap(pod.metadata?.annotations ?? {});
    case 'spec.nodeName':
      return ctx.nodeName;
    case 'spec.serviceAccountName':
      return pod.spec?.serviceAccountName ?? '';
    case 'status.hostIP':
    case 'status.hostIPs':
      return ctx.hostIP;
    case 'status.podIP':
    case 'status.podIPs':
      return podIP;
    default:
      throw new ContainerConfigError(`unsupported fieldPath: ${fieldPath}`);
  }
}

/** The container a resourceFieldRef means: its own, or the named one. */
export function resourceContainer(pod: Pod, self: Container | undefined, name: string | undefined): Container {
  if (!name) {
    if (!self) throw new ContainerConfigError('resourceFieldRef needs a containerName here');
    return self;
  }
  const all = [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])];
  const c = all.find((x) => x.name === name);
  if (!c) throw new ContainerConfigError(`container ${name} not found in pod`);
  return c;
}

// ---------------------------------------------------------------- service links

function envName(s: string): string {
  return s.toUpperCase().replace(/-/g, '_');
}

function hostPort(ip: string, port: number): string {
  return ip.includes(':') ? `[${ip}]:${port}` : `${ip}:${port}`;
}

/** The Docker-link-style variables of one Service (FOO_SERVICE_HOST, FOO_PORT_80_TCP_ADDR...). */
export function serviceVariables(svc: Service): Array<[string, string]> {
  const ip = svc.spec?.clusterIP ?? '';
  const ports = svc.spec?.ports ?? [];
  if (!ip || ip === 'None' || !ports.length) return [];
  const prefix = envName(svc.metadata?.name ?? '');
  const out: Array<[string, string]> = [
    [`${prefix}_SERVICE_HOST`, ip],
    [`${prefix}_SERVICE_PORT`, String(ports[0].port)],
  ];
  for (const p of ports) if (p.name) out.push([`${prefix}_SERVICE_PORT_${envName(p.name)}`, String(p.port)]);
  ports.forEach((p, i) => {
    const proto = (p.protocol || 'TCP').toLowerCase();
    const url = `${proto}://${hostPort(ip, p.port)}`;
    if (i === 0) out.push([`${prefix}_PORT`, url]);
    const pp = `${prefix}_PORT_${p.port}_${proto.toUpperCase()}`;
    out.push([pp, url], [`${pp}_PROTO`, proto], [`${pp}_PORT`, String(p.port)], [`${pp}_ADDR`, ip]);
  });
  return out;
}

/**
 * The service variables a pod gets: the `kubernetes` Service of the default
 * namespace always, the Services of its own namespace unless
 * enableServiceLinks is false. Services without a cluster IP give none.
 */
export function serviceEnv(pod: Pod, services: Service[]): Map<string, string> {
  const ns = pod.metadata?.namespace || 'default';
  const links = pod.spec?.enableServiceLinks ?? true;
  const chosen = new Map<string, Service>();
  for (const svc of services) {
    const ip = svc.spec?.clusterIP;
    if (!ip || ip === 'None') continue;
    const name = svc.metadata?.name ?? '';
    const svcNs = svc.metadata?.namespace || 'default';
    if (svcNs === 'default' && name === 'kubernetes') {
      if (!chosen.has(name)) chosen.set(name, svc);
    } else if (svcNs === ns && links) chosen.set(name, svc);
  }
  const out = new Map<string, string>();
  for (const name of [...chosen.keys()].sort()) for (const [k, v] of serviceVariables(chosen.get(name)!)) out.set(k, v);
  return out;
}

/** The Services known from the manifest directory. */
export function servicesFromObjects(ctx: PodContext): Service[] {
  return ctx.objects.list('Service').map((o) => o.object as Service);
}

// ---------------------------------------------------------------- env

const ENV_NAME = /^[-._a-zA-Z][-._a-zA-Z0-9]*$/;

export interface ResolvedEnv {
  /** In the order the container defines them; a redefinition keeps the first one's place. */
  env: Map<string, string>;
  /** envFrom keys skipped because they are not valid variable names (the kubelet reports them in an event). */
  invalidKeys: string[];
  /** The kubelet's event message for each envFrom source with invalid keys. */
  warnings: string[];
}

export function resolveEnv(ctx: PodContext, c: Container, node: NodeCapacity = hostCapacity(), services: Service[] = servicesFromObjects(ctx)): ResolvedEnv {
  const ns = ctx.pod.metadata?.namespace || 'default';
  // Service variables first: the container's own envFrom and env override them, and may refer to them.
  const env = serviceEnv(ctx.pod, services);
  const invalidKeys: string[] = [];
  const warnings: string[] = [];
  const configMap = (name: string, optional: boolean): ConfigMap | undefined => {
    const cm = ctx.objects.configMap(ns, name);
    if (!cm && !optional) throw new ContainerConfigError(`configmap "${name}" not found`);
    return cm;
  };
  const secret = (name: string, optional: boolean): Secret | undefined => {
    const s = ctx.objects.secret(ns, name);
    if (!s && !optional) throw new ContainerConfigError(`secret "${name}" not found`);
    return s;
  };

  for (const from of c.envFrom ?? []) {
    const prefix = from.prefix ?? '';
    let data: Map<string, Buffer> | undefined;
    if (from.configMapRef) {
      const cm = configMap(from.configMapRef.name ?? '', from.configMapRef.optional ?? false);
      // binaryData never reaches the environment.
      if (cm) data = new Map(Object.entries(cm.data ?? {}).map(([k, v]) => [k, Buffer.from(String(v))]));
    } else if (from.secretRef) {
      const s = secret(from.secretRef.name ?? '', from.secretRef.optional ?? false);
      if (s) data = secretData(s);
    }
    if (!data) continue;
    const invalid: string[] = [];
    for (const k of [...data.keys()].sort()) {
      const name = prefix + k;
      if (!ENV_NAME.test(name)) {
        invalid.push(name);
        continue;
      }
      env.set(name, data.get(k)!.toString());
    }
    if (invalid.length) {
      invalidKeys.push(...invalid);
      const what = from.configMapRef ? `configMap ${ns}/${from.configMapRef.name}` : `secret ${ns}/${from.secretRef?.name}`;
      warnings.push(`Keys [${invalid.join(', ')}] from the EnvFrom ${what} were skipped since they are considered invalid environment variable names.`);
    }
  }

  for (const v of c.env ?? []) {
    let value: string | undefined = v.value ?? '';
    if (value !== '') value = expand(value, mapLookup(env));
    else if (v.valueFrom) {
      const src = v.valueFrom;
      if (src.fieldRef) value = podFieldValue(ctx, src.fieldRef.fieldPath);
      else if (src.resourceFieldRef) {
        const target = resourceContainer(ctx.pod, c, src.resourceFieldRef.containerName);
        try {
          value = resourceFieldValue(target, src.resourceFieldRef.resource, src.resourceFieldRef.divisor, node);
        } catch (err) {
          throw new ContainerConfigError((err as Error).message);
        }
      } else if (src.configMapKeyRef) {
        const ref = src.configMapKeyRef;
        const optional = ref.optional ?? false;
        const cm = configMap(ref.name ?? '', optional);
        const data = cm?.data?.[ref.key];
        if (cm && data === undefined && !optional) throw new ContainerConfigError(`couldn't find key ${ref.key} in ConfigMap ${ns}/${ref.name}`);
        value = data === undefined ? undefined : String(data);
      } else if (src.secretKeyRef) {
        const ref = src.secretKeyRef;
        const optional = ref.optional ?? false;
        const s = secret(ref.name ?? '', optional);
        const data = s ? secretData(s).get(ref.key) : undefined;
        if (s && data === undefined && !optional) throw new ContainerConfigError(`couldn't find key ${ref.key} in Secret ${ns}/${ref.name}`);
        value = data?.toString();
      }
    }
    // An optional reference to something missing leaves the variable out altogether.
    if (value !== undefined) env.set(v.name, value);
  }
  return { env, invalidKeys, warnings };
}
