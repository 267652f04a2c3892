/**
 * What the API server would do to a manifest before anyone runs it: apply
 * the v1 defaults (SetDefaults_* of pkg/apis/core/v1) to a copy, then
 * validate it (the parts of ValidatePod that matter on one node). Decoding
 * is not strict: unknown fields pass; a field of the wrong type is a type
 * error, never a crash. Every reason names its field path, as the API
 * server's do: `spec.containers[1].image: Required value`.
 */
import type { ConfigMap, Pod, Secret } from 'kubernetes-types/core/v1.js';
import type { PodValidation, StoredObject } from './model.js';
import { tryParseQuantity } from './quantity.js';
import { namespacedKey } from '../labels.js';

export { parseMilliQuantity, parseQuantity, tryParseQuantity } from './quantity.js';

export type FieldPath = (string | number)[];
export interface FieldError {
  path: FieldPath;
  message: string;
}

/** The store's and the agent's key for a pod (or any namespaced object). */
export const podKey = namespacedKey;

/** `spec.containers[1].image`; map keys that are not identifiers print as `[key]`. */
export function formatFieldPath(p: FieldPath): string {
  let out = '';
  for (const seg of p) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(seg)) out += out === '' ? seg : `.${seg}`;
    else out += `[${seg}]`;
  }
  return out;
}

/** A value as a reason quotes it: JSON, cut short so a hostile manifest cannot make a huge message. */
export function show(v: unknown): string {
  const text = JSON.stringify(v) ?? String(v);
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

export function typeName(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  return typeof v;
}

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const has = (v: unknown) => v !== undefined && v !== null;

// ---------------------------------------------------------------- types

/** A small schema of the fields the agent reads; fields not listed pass unchecked. */
type Schema =
  | 'string'
  | 'int'
  | 'bool'
  | 'quantity'
  | 'intOrString'
  | 'any'
  | { obj: Record<string, Schema> }
  | { list: Schema }
  | { map: Schema };

const S = 'string' as const;
const I = 'int' as const;
const B = 'bool' as const;
const Q = 'quantity' as const;
const list = (t: Schema): Schema => ({ list: t });
const obj = (fields: Record<string, Schema>): Schema => ({ obj: fields });
const map = (t: Schema): Schema => ({ map: t });

const execAction = obj({ command: list(S) });
const httpGetAction = obj({ path: S, port: 'intOrString', host: S, scheme: S, httpHeaders: list(obj({ name: S, value: S })) });
const tcpSocketAction = obj({ port: 'intOrString', host: S });
const grpcAction = obj({ port: I, service: S });
const probeSchema = obj({
  exec: execAction,
  httpGet: httpGetAction,
  tcpSocket: tcpSocketAction,
  grpc: grpcAction,
  initialDelaySeconds: I,
  timeoutSeconds: I,
  periodSeconds: I,
  successThreshold: I,
  failureThreshold: I,
  terminationGracePeriodSeconds: I,
});
const hookSchema = obj({ exec: execAction, httpGet: httpGetAction, tcpSocket: tcpSocketAction, sleep: obj({ seconds: I }) });
const keySelector = obj({ name: S, key: S, optional: B });
const fieldRef = obj({ apiVersion: S, fieldPath: S });
const resourceFieldRef = obj({ containerName: S, resource: S, divisor: Q });
const seLinuxOptions = obj({ user: S, role: S, type: S, level: S });
const seccompProfile = obj({ type: S, localhostProfile: S });
const containerSchema = obj({
  name: S,
  image: S,
  command: list(S),
  args: list(S),
  workingDir: S,
  ports: list(obj({ name: S, containerPort: I, hostPort: I, protocol: S, hostIP: S })),
  envFrom: list(obj({ prefix: S, configMapRef: obj({ name: S, optional: B }), secretRef: obj({ name: S, optional: B }) })),
  env: list(
    obj({
      name: S,
      value: S,
      valueFrom: obj({ fieldRef, resourceFieldRef, configMapKeyRef: keySelector, secretKeyRef: keySelector }),
    }),
  ),
  resources: obj({ limits: map(Q), requests: map(Q) }),
  restartPolicy: S,
  volumeMounts: list(obj({ name: S, mountPath: S, subPath: S, subPathExpr: S, readOnly: B, mountPropagation: S, recursiveReadOnly: S })),
  livenessProbe: probeSchema,
  readinessProbe: probeSchema,
  startupProbe: probeSchema,
  lifecycle: obj({ postStart: hookSchema, preStop: hookSchema, stopSignal: S }),
  terminationMessagePath: S,
  terminationMessagePolicy: S,
  imagePullPolicy: S,
  securityContext: obj({
    runAsUser: I,
    runAsGroup: I,
    runAsNonRoot: B,
    privileged: B,
    readOnlyRootFilesystem: B,
    allowPrivilegeEscalation: B,
    capabilities: obj({ add: list(S), drop: list(S) }),
    procMount: S,
    seLinuxOptions,
    seccompProfile,
    appArmorProfile: seccompProfile,
  }),
  stdin: B,
  stdinOnce: B,
  tty: B,
});
const keyToPath = obj({ key: S, path: S, mode: I });
const downwardItems = list(obj({ path: S, fieldRef, resourceFieldRef, mode: I }));
const volumeSchema = obj({
  name: S,
  hostPath: obj({ path: S, type: S }),
  emptyDir: obj({ medium: S, sizeLimit: Q }),
  configMap: obj({ name: S, items: list(keyToPath), defaultMode: I, optional: B }),
  secret: obj({ secretName: S, items: list(keyToPath), defaultMode: I, optional: B }),
  downwardAPI: obj({ items: downwardItems, defaultMode: I }),
  projected: obj({
    defaultMode: I,
    sources: list(
      obj({
        configMap: obj({ name: S, items: list(keyToPath), optional: B }),
        secret: obj({ name: S, items: list(keyToPath), optional: B }),
        downwardAPI: obj({ items: downwardItems }),
        serviceAccountToken: obj({ audience: S, expirationSeconds: I, path: S }),
      }),
    ),
  }),
  persistentVolumeClaim: obj({ claimName: S, readOnly: B }),
});
const metadataSchema = obj({ name: S, namespace: S, labels: map(S), annotations: map(S), uid: S, generateName: S });
const podSchema = obj({
  apiVersion: S,
  kind: S,
  metadata: metadataSchema,
  spec: obj({
    volumes: list(volumeSchema),
    initContainers: list(containerSchema),
    containers: list(containerSchema),
    restartPolicy: S,
    terminationGracePeriodSeconds: I,
    activeDeadlineSeconds: I,
    dnsPolicy: S,
    nodeSelector: map(S),
    serviceAccountName: S,
    serviceAccount: S,
    automountServiceAccountToken: B,
    nodeName: S,
    hostNetwork: B,
    hostPID: B,
    hostIPC: B,
    shareProcessNamespace: B,
    securityContext: obj({
      runAsUser: I,
      runAsGroup: I,
      runAsNonRoot: B,
      fsGroup: I,
      supplementalGroups: list(I),
      sysctls: list(obj({ name: S, value: S })),
      fsGroupChangePolicy: S,
      seLinuxOptions,
      seccompProfile,
      appArmorProfile: seccompProfile,
    }),
    hostname: S,
    subdomain: S,
    setHostnameAsFQDN: B,
    hostAliases: list(obj({ ip: S, hostnames: list(S) })),
    dnsConfig: obj({ nameservers: list(S), searches: list(S), options: list(obj({ name: S, value: S })) }),
    enableServiceLinks: B,
    schedulerName: S,
    priority: I,
    priorityClassName: S,
    runtimeClassName: S,
    os: obj({ name: S }),
    imagePullSecrets: list(obj({ name: S })),
    hostUsers: B,
    resources: obj({ limits: map(Q), requests: map(Q) }),
    overhead: map(Q),
    readinessGates: list(obj({ conditionType: S })),
  }),
});
const configMapSchema = obj({ metadata: metadataSchema, data: map(S), binaryData: map(S), immutable: B });
const secretSchema = obj({ metadata: metadataSchema, data: map(S), stringData: map(S), type: S, immutable: B });

function checkTypes(v: unknown, schema: Schema, path: FieldPath, errs: FieldError[]): void {
  if (v === undefined || v === null || schema === 'any') return;
  const wrong = (expected: string): void => {
    errs.push({ path, message: `Invalid type: expected ${expected}, got ${typeName(v)}` });
  };
  if (schema === 'string') {
    if (typeof v !== 'string') wrong('string');
  } else if (schema === 'bool') {
    if (typeof v !== 'boolean') wrong('boolean');
  } else if (schema === 'int') {
    if (typeof v !== 'number') wrong('integer');
    else if (!Number.isSafeInteger(v)) errs.push({ path, message: `Invalid value: ${v}: must be an integer` });
  } else if (schema === 'intOrString') {
    if (typeof v === 'number') {
      if (!Number.isSafeInteger(v)) errs.push({ path, message: `Invalid value: ${v}: must be an integer` });
    } else if (typeof v !== 'string') wrong('integer or string');
  } else if (schema === 'quantity') {
    if (typeof v !== 'string' && typeof v !== 'number') wrong('quantity (string or number)');
    else if (tryParseQuantity(v) === undefined) {
      errs.push({ path, message: `Invalid value: ${show(v)}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'` });
    }
  } else if ('list' in schema) {
    if (!Array.isArray(v)) return wrong('array');
    v.forEach((item, i) => checkTypes(item, schema.list, [...path, i], errs));
  } else if ('map' in schema) {
    if (!isObj(v)) return wrong('object');
    for (const [k, item] of Object.entries(v)) checkTypes(item, schema.map, [...path, k], errs);
  } else {
    if (!isObj(v)) return wrong('object');
    for (const [k, fieldSchema] of Object.entries(schema.obj)) checkTypes(v[k], fieldSchema, [...path, k], errs);
  }
}

// ---------------------------------------------------------------- defaults

/** The tag of an image reference as the kubelet's parser sees it: "latest" when there is neither tag nor digest. */
export function imageTag(image: string): { tag: string; digest: string } {
  let name = image;
  let digest = '';
  const at = name.indexOf('@');
  if (at >= 0) {
    digest = name.slice(at + 1);
    name = name.slice(0, at);
  }
  const colon = name.lastIndexOf(':');
  const tag = colon > name.lastIndexOf('/') ? name.slice(colon + 1) : '';
  return { tag: tag === '' && digest === '' ? 'latest' : tag, digest };
}

/** The pull policy the API server gives a container that names none. */
export function defaultPullPolicy(image: string): 'Always' | 'IfNotPresent' {
  return imageTag(image).tag === 'latest' ? 'Always' : 'IfNotPresent';
}

function setDefault(o: Obj, key: string, value: unknown): void {
  if (o[key] === undefined || o[key] === null || o[key] === '') o[key] = value;
}
const eachObj = (v: unknown, fn: (o: Obj) => unknown) => {
  if (Array.isArray(v)) for (const item of v) if (isObj(item)) fn(item);
};
const ifObj = (v: unknown, fn: (o: Obj) => unknown) => {
  if (isObj(v)) fn(v);
};

function defaultHttpGet(h: Obj): void {
  setDefault(h, 'path', '/');
  setDefault(h, 'scheme', 'HTTP');
}
function defaultProbe(p: Obj): void {
  for (const [k, v] of [['timeoutSeconds', 1], ['periodSeconds', 10], ['successThreshold', 1], ['failureThreshold', 3]] as const) {
    if (p[k] === undefined || p[k] === null || p[k] === 0) p[k] = v;
  }
  ifObj(p.httpGet, defaultHttpGet);
  ifObj(p.grpc, (g) => {
    if (g.service === undefined || g.service === null) g.service = '';
  });
}
function defaultFieldRef(f: Obj): void {
  setDefault(f, 'apiVersion', 'v1');
}
function defaultContainer(c: Obj, hostNetwork: boolean): void {
  // An image that is missing gets IfNotPresent (the API server's parser fails and finds no tag); validation reports it.
  setDefault(c, 'imagePullPolicy', typeof c.image === 'string' && c.image !== '' ? defaultPullPolicy(c.image) : 'IfNotPresent');
  setDefault(c, 'terminationMessagePath', '/dev/termination-log');
  setDefault(c, 'terminationMessagePolicy', 'File');
  eachObj(c.ports, (p) => {
    setDefault(p, 'protocol', 'TCP');
    if (hostNetwork && (p.hostPort === undefined || p.hostPort === 0)) p.hostPort = p.containerPort;
  });
  for (const k of ['livenessProbe', 'readinessProbe', 'startupProbe']) ifObj(c[k], defaultProbe);
  ifObj(c.lifecycle, (l) => {
    for (const k of ['postStart', 'preStop']) ifObj(l[k], (h) => ifObj(h.httpGet, defaultHttpGet));
  });
  eachObj(c.env, (e) => ifObj(e.valueFrom, (vf) => ifObj(vf.fieldRef, defaultFieldRef)));
  // Requests default to limits for every resource that has a limit but no request.
  ifObj(c.resources, (r) => {
    if (!isObj(r.limits)) return;
    if (r.requests === undefined || r.requests === null) r.requests = {};
    if (!isObj(r.requests)) return;
    for (const [k, v] of Object.entries(r.limits)) if (!(k in r.requests)) r.requests[k] = v;
  });
}
function defaultVolume(v: Obj): void {
  const sources = Object.keys(v).filter((k) => VOLUME_SOURCES.has(k) && has(v[k]));
  if (sources.length === 0) v.emptyDir = {};
  ifObj(v.configMap, (s) => setDefault(s, 'defaultMode', 0o644));
  ifObj(v.secret, (s) => setDefault(s, 'defaultMode', 0o644));
  ifObj(v.downwardAPI, (s) => {
    setDefault(s, 'defaultMode', 0o644);
    eachObj(s.items, (i) => ifObj(i.fieldRef, defaultFieldRef));
  });
  ifObj(v.projected, (s) => {
    setDefault(s, 'defaultMode', 0o644);
    eachObj(s.sources, (src) => {
      ifObj(src.serviceAccountToken, (t) => setDefault(t, 'expirationSeconds', 3600));
      ifObj(src.downwardAPI, (d) => eachObj(d.items, (i) => ifObj(i.fieldRef, defaultFieldRef)));
    });
  });
  ifObj(v.hostPath, (h) => {
    if (h.type === undefined || h.type === null) h.type = '';
  });
}

/** Applies the API server's v1 Pod defaults in place; fields of the wrong type are left for validation. */
export function applyPodDefaults(pod: Obj): void {
  if (!isObj(pod.spec)) return;
  const spec = pod.spec;
  setDefault(spec, 'restartPolicy', 'Always');
  setDefault(spec, 'dnsPolicy', 'ClusterFirst');
  setDefault(spec, 'schedulerName', 'default-scheduler');
  if (spec.securityContext === undefined || spec.securityContext === null) spec.securityContext = {};
  if (spec.terminationGracePeriodSeconds === undefined || spec.terminationGracePeriodSeconds === null) spec.terminationGracePeriodSeconds = 30;
  if (spec.enableServiceLinks === undefined || spec.enableServiceLinks === null) spec.enableServiceLinks = true;
  const hostNetwork = spec.hostNetwork === true;
  eachObj(spec.initContainers, (c) => defaultContainer(c, hostNetwork));
  eachObj(spec.containers, (c) => defaultContainer(c, hostNetwork));
  eachObj(spec.volumes, defaultVolume);
}

// ---------------------------------------------------------------- formats

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const QUALIFIED_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const ENV_VAR_NAME = /^[-._a-zA-Z][-._a-zA-Z0-9]*$/;
const CONFIG_KEY = /^[-._a-zA-Z0-9]+$/;
const IANA_SVC_NAME = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;
const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

export function dnsLabelError(v: string): string | undefined {
  if (v.length > 63) return 'must be no more than 63 characters';
  if (!DNS1123_LABEL.test(v)) {
    return "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
  }
  return undefined;
}
export function dnsSubdomainError(v: string): string | undefined {
  if (v.length > 253) return 'must be no more than 253 characters';
  if (!DNS1123_SUBDOMAIN.test(v)) {
    return "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
  }
  return undefined;
}
function qualifiedNameError(v: string): string | undefined {
  const slash = v.indexOf('/');
  const [prefix, name] = slash >= 0 ? [v.slice(0, slash), v.slice(slash + 1)] : ['', v];
  if (slash >= 0 && (prefix === '' || dnsSubdomainError(prefix))) return 'prefix part must be a DNS-1123 subdomain';
  if (name.length === 0 || name.length > 63 || !QUALIFIED_NAME.test(name)) {
    return "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)";
  }
  return undefined;
}
function configKeyError(k: string): string | undefined {
  if (k.length === 0 || k.length > 253) return 'must be between 1 and 253 characters';
  if (!CONFIG_KEY.test(k)) return "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";
  if (k === '.' || k === '..' || k.startsWith('..')) return "must not be '.' or '..' or start with '..'";
  return undefined;
}
export function portNameError(n: string): string | undefined {
  if (n.length > 15) return 'must be no more than 15 characters';
  if (!IANA_SVC_NAME.test(n)) return "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)";
  if (n.includes('--')) return 'must not contain consecutive hyphens';
  if (!/[a-z]/.test(n)) return 'must contain at least one letter (a-z)';
  return undefined;
}
function relativePathError(p: string): string | undefined {
  if (p.startsWith('/')) return 'must be a relative path';
  if (p.split('/').includes('..')) return "must not contain '..'";
  return undefined;
}
/** The API server's check of a seccompProfile: a Localhost one names a file beneath the kubelet's seccomp directory. */
function validateSeccompProfile(p: unknown, path: FieldPath, e: Errors): void {
  ifObj(p, (sp) => {
    e.oneOf([...path, 'type'], sp.type, SECCOMP_TYPES);
    if (sp.type === 'Localhost') {
      if (empty(sp.localhostProfile)) e.add([...path, 'localhostProfile'], 'Required value: must be set when seccomp type is Localhost');
      else {
        const why = relativePathError(sp.localhostProfile as string);
        if (why) e.invalid([...path, 'localhostProfile'], sp.localhostProfile, why);
      }
    } else if (has(sp.localhostProfile)) {
      e.invalid([...path, 'localhostProfile'], sp.localhostProfile, 'can only be set when seccomp type is Localhost');
    }
  });
}
function isIP(s: string): boolean {
  if (/^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$/.test(s)) return true;
  return /^[0-9a-fA-F:.]+$/.test(s) && s.includes(':') && s.split('::').length <= 2;
}

/** Strict standard base64 (as Go's decoder, which skips line breaks). */
export function isBase64(s: string): boolean {
  return BASE64.test(s.replace(/[\r\n]/g, ''));
}

const enumError = (v: unknown, allowed: readonly string[]) =>
  `Unsupported value: ${show(v)}: supported values: ${allowed.map((a) => JSON.stringify(a)).join(', ')}`;

// ---------------------------------------------------------------- validation

const VOLUME_SOURCES = new Set([
  'hostPath', 'emptyDir', 'gcePersistentDisk', 'awsElasticBlockStore', 'gitRepo', 'secret', 'nfs', 'iscsi', 'glusterfs',
  'persistentVolumeClaim', 'rbd', 'flexVolume', 'cinder', 'cephfs', 'flocker', 'downwardAPI', 'fc', 'azureFile',
  'configMap', 'vsphereVolume', 'quobyte', 'azureDisk', 'photonPersistentDisk', 'projected', 'portworxVolume',
  'scaleIO', 'storageos', 'csi', 'ephemeral', 'image',
]);
const HOST_PATH_TYPES = ['', 'DirectoryOrCreate', 'Directory', 'FileOrCreate', 'File', 'Socket', 'CharDevice', 'BlockDevice'] as const;
/**
 * The API sets no number, but a pod is one request (etcd takes 1.5 MiB) and
 * a pod of thousands of containers is an attack on the node, not a workload:
 * each costs the agent a sync step and the runtime a conmon.
 */
export const MAX_POD_CONTAINERS = 100;
const SECCOMP_TYPES = ['Localhost', 'RuntimeDefault', 'Unconfined'] as const;
const RESTART_POLICIES = ['Always', 'OnFailure', 'Never'] as const;
const DNS_POLICIES = ['ClusterFirstWithHostNet', 'ClusterFirst', 'Default', 'None'] as const;
const PULL_POLICIES = ['Always', 'IfNotPresent', 'Never'] as const;
const PROTOCOLS = ['SCTP', 'TCP', 'UDP'] as const;
const TERMINATION_MESSAGE_POLICIES = ['File', 'FallbackToLogsOnError'] as const;
const MOUNT_PROPAGATIONS = ['None', 'HostToContainer', 'Bidirectional'] as const;
const URI_SCHEMES = ['HTTP', 'HTTPS'] as const;
const ENV_FIELD_PATHS = [
  'metadata.name', 'metadata.namespace', 'metadata.uid', 'spec.nodeName', 'spec.serviceAccountName',
  'status.hostIP', 'status.hostIPs', 'status.podIP', 'status.podIPs',
] as const;
const VOLUME_FIELD_PATHS = ['metadata.name', 'metadata.namespace', 'metadata.uid', 'metadata.labels', 'metadata.annotations'] as const;
const RESOURCE_FIELDS = ['limits.cpu', 'limits.memory', 'limits.ephemeral-storage', 'requests.cpu', 'requests.memory', 'requests.ephemeral-storage'] as const;

class Errors {
  readonly list: FieldError[] = [];
  add(path: FieldPath, message: string): void {
    this.list.push({ path, message });
  }
  required(path: FieldPath): void {
    this.add(path, 'Required value');
  }
  invalid(path: FieldPath, value: unknown, why: string): void {
    this.add(path, `Invalid value: ${show(value)}: ${why}`);
  }
  oneOf(path: FieldPath, value: unknown, allowed: readonly string[]): void {
    if (value === undefined || value === null) this.required(path);
    else if (!allowed.includes(value as string)) this.add(path, enumError(value, allowed));
  }
}

const empty = (v: unknown) => v === undefined || v === null || v === '';

/** The checks on an object's name, namespace, labels and annotations, for the API's kinds that have no others here. */
export function metadataErrors(meta: Obj | undefined, namespaced: boolean): FieldError[] {
  const e = new Errors();
  validateMetadata(meta, e, namespaced);
  return e.list;
}

function validateMetadata(meta: Obj | undefined, e: Errors, namespaced = true): void {
  const p: FieldPath = ['metadata'];
  if (!meta || empty(meta.name)) e.required([...p, 'name']);
  else {
    const why = dnsSubdomainError(meta.name as string);
    if (why) e.invalid([...p, 'name'], meta.name, why);
  }
  if (meta && namespaced && !empty(meta.namespace)) {
    const why = dnsLabelError(meta.namespace as string);
    if (why) e.invalid([...p, 'namespace'], meta.namespace, why);
  }
  if (meta && isObj(meta.labels)) {
    for (const [k, v] of Object.entries(meta.labels)) {
      const why = qualifiedNameError(k);
      if (why) e.invalid([...p, 'labels'], k, why);
      if (typeof v === 'string' && (v.length > 63 || !LABEL_VALUE.test(v))) {
        e.invalid([...p, 'labels'], v, "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (at most 63 characters)");
      }
    }
  }
  if (meta && isObj(meta.annotations)) {
    for (const k of Object.keys(meta.annotations)) {
      const why = qualifiedNameError(k.toLowerCase());
      if (why) e.invalid([...p, 'annotations'], k, why);
    }
  }
}

function validatePortNumber(port: unknown, path: FieldPath, e: Errors): void {
  if (typeof port === 'number') {
    if (port < 1 || port > 65535) e.invalid(path, port, 'must be between 1 and 65535, inclusive');
  } else if (typeof port === 'string') {
    const why = portNameError(port);
    if (why) e.invalid(path, port, why);
  } else e.required(path);
}

function validateHandler(h: Obj, path: FieldPath, e: Errors, kinds: readonly string[]): void {
  const set = kinds.filter((k) => has(h[k]));
  if (set.length === 0) e.add(path, 'Required value: must specify a handler type');
  else if (set.length > 1) e.add([...path, set[1]!], 'Forbidden: may not specify more than 1 handler type');
  if (isObj(h.exec) && (!Array.isArray(h.exec.command) || h.exec.command.length === 0)) e.required([...path, 'exec', 'command']);
  if (isObj(h.httpGet)) {
    validatePortNumber(h.httpGet.port, [...path, 'httpGet', 'port'], e);
    e.oneOf([...path, 'httpGet', 'scheme'], h.httpGet.scheme, URI_SCHEMES);
    eachObj(h.httpGet.httpHeaders, (hd) => {
      if (empty(hd.name)) e.required([...path, 'httpGet', 'httpHeaders', 'name']);
    });
  }
  if (isObj(h.tcpSocket)) validatePortNumber(h.tcpSocket.port, [...path, 'tcpSocket', 'port'], e);
  if (isObj(h.grpc)) {
    const port = h.grpc.port;
    if (typeof port !== 'number') e.required([...path, 'grpc', 'port']);
    else if (port < 1 || port > 65535) e.invalid([...path, 'grpc', 'port'], port, 'must be between 1 and 65535, inclusive');
  }
  if (isObj(h.sleep)) {
    const s = h.sleep.seconds;
    if (typeof s !== 'number') e.required([...path, 'sleep', 'seconds']);
    else if (s < 0) e.invalid([...path, 'sleep', 'seconds'], s, 'must be greater than or equal to 0');
  }
}

function validateProbe(p: Obj, path: FieldPath, e: Errors, kind: 'liveness' | 'readiness' | 'startup'): void {
  validateHandler(p, path, e, ['exec', 'httpGet', 'tcpSocket', 'grpc']);
  for (const k of ['initialDelaySeconds', 'timeoutSeconds', 'periodSeconds', 'successThreshold', 'failureThreshold']) {
    const v = p[k];
    if (typeof v === 'number' && v < 0) e.invalid([...path, k], v, 'must be greater than or equal to 0');
  }
  if (typeof p.terminationGracePeriodSeconds === 'number' && p.terminationGracePeriodSeconds <= 0) {
    e.invalid([...path, 'terminationGracePeriodSeconds'], p.terminationGracePeriodSeconds, 'must be greater than 0');
  }
  if (kind !== 'readiness' && typeof p.successThreshold === 'number' && p.successThreshold !== 1) {
    e.invalid([...path, 'successThreshold'], p.successThreshold, 'must be 1');
  }
  if (kind === 'readiness' && has(p.terminationGracePeriodSeconds)) {
    e.add([...path, 'terminationGracePeriodSeconds'], 'Forbidden: must not be set for readinessProbes');
  }
}

function validateResources(r: Obj, path: FieldPath, e: Errors): void {
  const limits = isObj(r.limits) ? r.limits : {};
  const requests = isObj(r.requests) ? r.requests : {};
  for (const [group, list] of [['limits', limits], ['requests', requests]] as const) {
    for (const [name, q] of Object.entries(list)) {
      const why = qualifiedNameError(name);
      if (why) e.invalid([...path, group, name], name, why);
      const v = tryParseQuantity(q);
      if (v !== undefined && v < 0) e.invalid([...path, group, name], q, 'must be greater than or equal to 0');
    }
  }
  for (const [name, req] of Object.entries(requests)) {
    if (!(name in limits)) continue;
    const rv = tryParseQuantity(req);
    const lv = tryParseQuantity(limits[name]);
    if (rv !== undefined && lv !== undefined && rv > lv) {
      e.invalid([...path, 'requests'], req, `must be less than or equal to ${name} limit of ${limits[name]}`);
    }
  }
}

function validateEnv(c: Obj, path: FieldPath, e: Errors): void {
  eachObj(c.env, (env) => {
    const i = (c.env as unknown[]).indexOf(env);
    const p = [...path, 'env', i];
    if (empty(env.name)) e.required([...p, 'name']);
    else if (!ENV_VAR_NAME.test(env.name as string)) {
      e.invalid([...p, 'name'], env.name, "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit");
    }
    if (!isObj(env.valueFrom)) return;
    const vf = env.valueFrom;
    const vp = [...p, 'valueFrom'];
    if (!empty(env.value)) e.add(vp, 'Invalid value: "": may not be specified when `value` is not empty');
    const kinds = ['fieldRef', 'resourceFieldRef', 'configMapKeyRef', 'secretKeyRef'].filter((k) => has(vf[k]));
    if (kinds.length === 0) e.add(vp, 'Invalid value: "": must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`');
    else if (kinds.length > 1) e.add(vp, 'Invalid value: "": may not have more than one field specified at a time');
    ifObj(vf.fieldRef, (f) => {
      const fp = f.fieldPath;
      if (empty(fp)) e.required([...vp, 'fieldRef', 'fieldPath']);
      else if (!ENV_FIELD_PATHS.includes(fp as never) && !/^metadata\.(labels|annotations)\['[^']+'\]$/.test(fp as string)) {
        e.add([...vp, 'fieldRef', 'fieldPath'], enumError(fp, ENV_FIELD_PATHS));
      }
      if (f.apiVersion !== 'v1') e.oneOf([...vp, 'fieldRef', 'apiVersion'], f.apiVersion, ['v1']);
    });
    ifObj(vf.resourceFieldRef, (r) => e.oneOf([...vp, 'resourceFieldRef', 'resource'], r.resource, RESOURCE_FIELDS));
    for (const k of ['configMapKeyRef', 'secretKeyRef']) {
      ifObj(vf[k], (ref) => {
        if (empty(ref.name)) e.required([...vp, k, 'name']);
        if (empty(ref.key)) e.required([...vp, k, 'key']);
        else {
          const why = configKeyError(ref.key as string);
          if (why) e.invalid([...vp, k, 'key'], ref.key, why);
        }
      });
    }
  });
  eachObj(c.envFrom, (src) => {
    const i = (c.envFrom as unknown[]).indexOf(src);
    const p = [...path, 'envFrom', i];
    const kinds = ['configMapRef', 'secretRef'].filter((k) => has(src[k]));
    if (kinds.length === 0) e.add(p, 'Invalid value: "": must specify one of: `configMapRef` or `secretRef`');
    else if (kinds.length > 1) e.add(p, 'Invalid value: "": may not have more than one field specified at a time');
    for (const k of kinds) ifObj(src[k], (ref) => empty(ref.name) && e.required([...p, k, 'name']));
    if (typeof src.prefix === 'string' && src.prefix !== '' && !ENV_VAR_NAME.test(src.prefix)) {
      e.invalid([...p, 'prefix'], src.prefix, 'a valid environment variable name prefix');
    }
  });
}

function validateContainer(c: Obj, path: FieldPath, kind: 'init' | 'app', volumes: Map<string, Obj>, hostNetwork: boolean, e: Errors): void {
  if (empty(c.name)) e.required([...path, 'name']);
  else {
    const why = dnsLabelError(c.name as string);
    if (why) e.invalid([...path, 'name'], c.name, why);
  }
  if (empty(c.image) || (c.image as string).trim() !== c.image) {
    if (empty(c.image)) e.required([...path, 'image']);
    else e.invalid([...path, 'image'], c.image, 'must not have leading or trailing whitespace');
  }
  e.oneOf([...path, 'imagePullPolicy'], c.imagePullPolicy, PULL_POLICIES);
  e.oneOf([...path, 'terminationMessagePolicy'], c.terminationMessagePolicy, TERMINATION_MESSAGE_POLICIES);
  const sidecar = kind === 'init' && c.restartPolicy === 'Always';
  if (has(c.restartPolicy)) {
    if (kind === 'init') e.oneOf([...path, 'restartPolicy'], c.restartPolicy, ['Always']);
    else e.add([...path, 'restartPolicy'], 'Forbidden: may not be set for non-init containers');
  }

  const portNames = new Set<string>();
  eachObj(c.ports, (port) => {
    const p = [...path, 'ports', (c.ports as unknown[]).indexOf(port)];
    const cp = port.containerPort;
    if (typeof cp !== 'number' || cp === 0) e.required([...p, 'containerPort']);
    else if (cp < 1 || cp > 65535) e.invalid([...p, 'containerPort'], cp, 'must be between 1 and 65535, inclusive');
    const hp = port.hostPort;
    if (typeof hp === 'number' && hp !== 0 && (hp < 1 || hp > 65535)) e.invalid([...p, 'hostPort'], hp, 'must be between 1 and 65535, inclusive');
    if (hostNetwork && typeof hp === 'number' && hp !== cp) e.invalid([...p, 'hostPort'], hp, 'must match `containerPort` when `hostNetwork` is true');
    e.oneOf([...p, 'protocol'], port.protocol, PROTOCOLS);
    if (typeof port.name === 'string' && port.name !== '') {
      const why = portNameError(port.name);
      if (why) e.invalid([...p, 'name'], port.name, why);
      if (portNames.has(port.name)) e.add([...p, 'name'], `Duplicate value: ${show(port.name)}`);
      portNames.add(port.name);
    }
    if (typeof port.hostIP === 'string' && port.hostIP !== '' && !isIP(port.hostIP)) {
      e.invalid([...p, 'hostIP'], port.hostIP, 'must be a valid IP address');
    }
  });

  validateEnv(c, path, e);

  const mountPaths = new Set<string>();
  eachObj(c.volumeMounts, (m) => {
    const p = [...path, 'volumeMounts', (c.volumeMounts as unknown[]).indexOf(m)];
    if (empty(m.name)) e.required([...p, 'name']);
    else if (!volumes.has(m.name as string)) e.add([...p, 'name'], `Not found: ${show(m.name)}`);
    if (empty(m.mountPath)) e.required([...p, 'mountPath']);
    else {
      if (mountPaths.has(m.mountPath as string)) e.invalid([...p, 'mountPath'], m.mountPath, 'must be unique');
      mountPaths.add(m.mountPath as string);
    }
    for (const k of ['subPath', 'subPathExpr']) {
      if (typeof m[k] === 'string' && m[k] !== '') {
        const why = relativePathError(m[k] as string);
        if (why) e.invalid([...p, k], m[k], why);
      }
    }
    if (!empty(m.subPath) && !empty(m.subPathExpr)) e.add([...p, 'subPathExpr'], 'Invalid value: subPathExpr and subPath are mutually exclusive');
    if (has(m.mountPropagation)) {
      e.oneOf([...p, 'mountPropagation'], m.mountPropagation, MOUNT_PROPAGATIONS);
      const privileged = isObj(c.securityContext) && c.securityContext.privileged === true;
      if (m.mountPropagation === 'Bidirectional' && !privileged) {
        e.add([...p, 'mountPropagation'], 'Forbidden: Bidirectional mount propagation is available only to privileged containers');
      }
    }
  });

  if (isObj(c.resources)) validateResources(c.resources, [...path, 'resources'], e);
  ifObj(c.securityContext, (sc) => validateSeccompProfile(sc.seccompProfile, [...path, 'securityContext', 'seccompProfile'], e));

  const probeKinds = [['livenessProbe', 'liveness'], ['readinessProbe', 'readiness'], ['startupProbe', 'startup']] as const;
  for (const [field, probeKind] of probeKinds) {
    if (!isObj(c[field])) continue;
    if (kind === 'init' && !sidecar) e.add([...path, field], 'Forbidden: may not be set for init containers without restartPolicy=Always');
    else validateProbe(c[field] as Obj, [...path, field], e, probeKind);
  }
  if (isObj(c.lifecycle)) {
    if (kind === 'init' && !sidecar) e.add([...path, 'lifecycle'], 'Forbidden: may not be set for init containers without restartPolicy=Always');
    else {
      for (const hook of ['postStart', 'preStop']) {
        ifObj(c.lifecycle[hook], (h) => validateHandler(h, [...path, 'lifecycle', hook], e, ['exec', 'httpGet', 'tcpSocket', 'sleep']));
      }
    }
  }
  if (typeof c.terminationMessagePath === 'string' && c.terminationMessagePath !== '' && !c.terminationMessagePath.startsWith('/')) {
    e.invalid([...path, 'terminationMessagePath'], c.terminationMessagePath, 'must be an absolute path');
  }
}

function validateKeyItems(items: unknown, path: FieldPath, e: Errors): void {
  eachObj(items, (it) => {
    const p = [...path, (items as unknown[]).indexOf(it)];
    if (empty(it.key)) e.required([...p, 'key']);
    if (empty(it.path)) e.required([...p, 'path']);
    else {
      const why = relativePathError(it.path as string);
      if (why) e.invalid([...p, 'path'], it.path, why);
    }
    validateMode(it.mode, [...p, 'mode'], e);
  });
}
function validateMode(mode: unknown, path: FieldPath, e: Errors): void {
  if (typeof mode === 'number' && (mode < 0 || mode > 0o777)) e.invalid(path, mode, 'must be a number between 0 and 0777 (octal), both inclusive');
}

function validateVolume(v: Obj, path: FieldPath, e: Errors): void {
  if (empty(v.name)) e.required([...path, 'name']);
  else {
    const why = dnsLabelError(v.name as string);
    if (why) e.invalid([...path, 'name'], v.name, why);
  }
  const sources = Object.keys(v).filter((k) => VOLUME_SOURCES.has(k) && has(v[k]));
  if (sources.length === 0) e.add(path, 'Required value: must specify a volume type');
  else if (sources.length > 1) e.add([...path, sources[1]!], 'Forbidden: may not specify more than 1 volume type');
  ifObj(v.hostPath, (h) => {
    if (empty(h.path)) e.required([...path, 'hostPath', 'path']);
    else if ((h.path as string).split('/').includes('..')) e.invalid([...path, 'hostPath', 'path'], h.path, "must not contain '..'");
    e.oneOf([...path, 'hostPath', 'type'], h.type ?? '', HOST_PATH_TYPES);
  });
  ifObj(v.emptyDir, (d) => {
    if (has(d.medium) && d.medium !== '' && d.medium !== 'Memory' && !/^HugePages(-.+)?$/.test(d.medium as string)) {
      e.add([...path, 'emptyDir', 'medium'], enumError(d.medium, ['', 'Memory', 'HugePages']));
    }
  });
  ifObj(v.configMap, (s) => {
    if (empty(s.name)) e.required([...path, 'configMap', 'name']);
    validateMode(s.defaultMode, [...path, 'configMap', 'defaultMode'], e);
    validateKeyItems(s.items, [...path, 'configMap', 'items'], e);
  });
  ifObj(v.secret, (s) => {
    if (empty(s.secretName)) e.required([...path, 'secret', 'secretName']);
    validateMode(s.defaultMode, [...path, 'secret', 'defaultMode'], e);
    validateKeyItems(s.items, [...path, 'secret', 'items'], e);
  });
  ifObj(v.downwardAPI, (s) => {
    validateMode(s.defaultMode, [...path, 'downwardAPI', 'defaultMode'], e);
    validateDownwardItems(s.items, [...path, 'downwardAPI', 'items'], e);
  });
  ifObj(v.projected, (s) => {
    validateMode(s.defaultMode, [...path, 'projected', 'defaultMode'], e);
    eachObj(s.sources, (src) => {
      const p = [...path, 'projected', 'sources', (s.sources as unknown[]).indexOf(src)];
      const kinds = ['configMap', 'secret', 'downwardAPI', 'serviceAccountToken', 'clusterTrustBundle', 'podCertificate'].filter((k) => has(src[k]));
      if (kinds.length !== 1) e.add(p, kinds.length === 0 ? 'Required value: must specify a projection type' : 'Forbidden: may not specify more than 1 projection type');
      // A valid source of the API (1.34's pod certificates) that this node has no signer for: said as such, not as a missing type.
      if (has(src.podCertificate)) e.add([...p, 'podCertificate'], 'Forbidden: podCertificate projected volumes are not supported by this node (it signs no pod certificates)');
      for (const k of ['configMap', 'secret']) {
        ifObj(src[k], (ref) => {
          if (empty(ref.name)) e.required([...p, k, 'name']);
          validateKeyItems(ref.items, [...p, k, 'items'], e);
        });
      }
      ifObj(src.downwardAPI, (d) => validateDownwardItems(d.items, [...p, 'downwardAPI', 'items'], e));
      ifObj(src.serviceAccountToken, (t) => {
        if (empty(t.path)) e.required([...p, 'serviceAccountToken', 'path']);
        if (typeof t.expirationSeconds === 'number' && t.expirationSeconds < 600) {
          e.invalid([...p, 'serviceAccountToken', 'expirationSeconds'], t.expirationSeconds, 'may not specify a duration less than 10 minutes');
        }
      });
    });
  });
  ifObj(v.persistentVolumeClaim, (c) => empty(c.claimName) && e.required([...path, 'persistentVolumeClaim', 'claimName']));
}
function validateDownwardItems(items: unknown, path: FieldPath, e: Errors): void {
  eachObj(items, (it) => {
    const p = [...path, (items as unknown[]).indexOf(it)];
    if (empty(it.path)) e.required([...p, 'path']);
    else {
      const why = relativePathError(it.path as string);
      if (why) e.invalid([...p, 'path'], it.path, why);
    }
    const refs = ['fieldRef', 'resourceFieldRef'].filter((k) => has(it[k]));
    if (refs.length !== 1) e.add(p, 'Invalid value: "": must specify exactly one of `fieldRef` or `resourceFieldRef`');
    ifObj(it.fieldRef, (f) => {
      const fp = f.fieldPath;
      if (empty(fp)) e.required([...p, 'fieldRef', 'fieldPath']);
      else if (!VOLUME_FIELD_PATHS.includes(fp as never) && !/^metadata\.(labels|annotations)\['[^']+'\]$/.test(fp as string)) {
        e.add([...p, 'fieldRef', 'fieldPath'], enumError(fp, VOLUME_FIELD_PATHS));
      }
    });
    ifObj(it.resourceFieldRef, (r) => {
      if (empty(r.containerName)) e.required([...p, 'resourceFieldRef', 'containerName']);
      e.oneOf([...p, 'resourceFieldRef', 'resource'], r.resource, RESOURCE_FIELDS);
    });
    validateMode(it.mode, [...p, 'mode'], e);
  });
}

/** ValidatePod's checks on an already defaulted pod, as field errors (type errors first, and then only those). */
export function podErrors(pod: Obj): FieldError[] {
  const typeErrs: FieldError[] = [];
  checkTypes(pod, podSchema, [], typeErrs);
  if (typeErrs.length > 0) return typeErrs;
  const e = new Errors();
  validateMetadata(pod.metadata as Obj | undefined, e);
  if (!isObj(pod.spec)) {
    e.required(['spec']);
    return e.list;
  }
  const spec = pod.spec;
  const volumes = new Map<string, Obj>();
  eachObj(spec.volumes, (v) => {
    const p = ['spec', 'volumes', (spec.volumes as unknown[]).indexOf(v)];
    validateVolume(v, p, e);
    if (typeof v.name === 'string' && v.name !== '') {
      if (volumes.has(v.name)) e.add([...p, 'name'], `Duplicate value: ${show(v.name)}`);
      volumes.set(v.name, v);
    }
  });
  const names = new Set<string>();
  for (const [field, kind] of [['initContainers', 'init'], ['containers', 'app']] as const) {
    eachObj(spec[field], (c) => {
      const p = ['spec', field, (spec[field] as unknown[]).indexOf(c)];
      if (typeof c.name === 'string' && c.name !== '') {
        if (names.has(c.name)) e.add([...p, 'name'], `Duplicate value: ${show(c.name)}`);
        names.add(c.name);
      }
      validateContainer(c, p, kind, volumes, spec.hostNetwork === true, e);
    });
  }
  if (!Array.isArray(spec.containers) || spec.containers.length === 0) e.required(['spec', 'containers']);
  const count = (Array.isArray(spec.containers) ? spec.containers.length : 0) + (Array.isArray(spec.initContainers) ? spec.initContainers.length : 0);
  if (count > MAX_POD_CONTAINERS) e.add(['spec', 'containers'], `Too many: ${count}: a pod may have at most ${MAX_POD_CONTAINERS} containers and init containers together`);
  e.oneOf(['spec', 'restartPolicy'], spec.restartPolicy, RESTART_POLICIES);
  e.oneOf(['spec', 'dnsPolicy'], spec.dnsPolicy, DNS_POLICIES);
  if (spec.dnsPolicy === 'None' && !(isObj(spec.dnsConfig) && Array.isArray(spec.dnsConfig.nameservers) && spec.dnsConfig.nameservers.length > 0)) {
    e.add(['spec', 'dnsConfig'], 'Required value: must provide at least one DNS nameserver when `dnsPolicy` is None');
  }
  ifObj(spec.dnsConfig, (d) => {
    const ns = Array.isArray(d.nameservers) ? (d.nameservers as string[]) : [];
    if (ns.length > 3) e.invalid(['spec', 'dnsConfig', 'nameservers'], ns, 'must not have more than 3 nameservers');
    ns.forEach((n, i) => isIP(n) || e.invalid(['spec', 'dnsConfig', 'nameservers', i], n, 'must be a valid IP address'));
    const searches = Array.isArray(d.searches) ? (d.searches as string[]) : [];
    if (searches.length > 32) e.invalid(['spec', 'dnsConfig', 'searches'], searches.length, 'must not have more than 32 search paths');
    searches.forEach((s, i) => {
      const why = dnsSubdomainError(s.replace(/\.$/, ''));
      if (why) e.invalid(['spec', 'dnsConfig', 'searches', i], s, why);
    });
  });
  if (isObj(spec.resources)) validateResources(spec.resources, ['spec', 'resources'], e);
  ifObj(spec.securityContext, (sc) => validateSeccompProfile(sc.seccompProfile, ['spec', 'securityContext', 'seccompProfile'], e));
  const grace = spec.terminationGracePeriodSeconds;
  if (typeof grace === 'number' && grace < 0) e.invalid(['spec', 'terminationGracePeriodSeconds'], grace, 'must be greater than or equal to 0');
  const deadline = spec.activeDeadlineSeconds;
  if (typeof deadline === 'number' && deadline <= 0) e.invalid(['spec', 'activeDeadlineSeconds'], deadline, 'must be between 1 and 2147483647, inclusive');
  for (const k of ['hostname', 'subdomain']) {
    if (typeof spec[k] === 'string' && spec[k] !== '') {
      const why = dnsLabelError(spec[k] as string);
      if (why) e.invalid(['spec', k], spec[k], why);
    }
  }
  eachObj(spec.hostAliases, (a) => {
    const i = (spec.hostAliases as unknown[]).indexOf(a);
    if (typeof a.ip !== 'string' || !isIP(a.ip)) e.invalid(['spec', 'hostAliases', i, 'ip'], a.ip, 'must be valid IP address');
  });
  validateHostUsers(spec, e);
  return e.list;
}

/**
 * A pod in its own user namespace (`hostUsers: false`) shares none of the
 * host's other namespaces, and is a Linux pod: the API server refuses these.
 */
function validateHostUsers(spec: Obj, e: Errors): void {
  if (spec.hostUsers !== false) return;
  for (const k of ['hostNetwork', 'hostPID', 'hostIPC'] as const) {
    if (spec[k] === true) e.add(['spec', k], 'Forbidden: when `hostUsers` is false');
  }
  if (isObj(spec.os) && spec.os.name === 'windows') e.add(['spec', 'hostUsers'], 'Forbidden: cannot be set for a windows pod');
}

/** A deep copy of a stored Pod with the API server's defaults applied, validated. */
export function validatePod(stored: StoredObject): PodValidation {
  const pod = structuredClone(stored.object) as Obj;
  if (stored.apiVersion !== 'v1' || stored.kind !== 'Pod') {
    return { ok: false, reasons: [`kind: Invalid value: "${stored.apiVersion}/${stored.kind}": must be v1/Pod`] };
  }
  if (!isObj(pod.metadata)) pod.metadata = {};
  const meta = pod.metadata as Obj;
  meta.namespace = stored.namespace;
  // As for the kubelet's static pods, the uid comes from the content, never from the file.
  meta.uid = stored.uid;
  applyPodDefaults(pod);
  const errs = podErrors(pod);
  if (errs.length > 0) return { ok: false, reasons: errs.map(formatError) };
  return { ok: true, pod: pod as Pod };
}

function formatError(err: FieldError): string {
  return err.path.length === 0 ? err.message : `${formatFieldPath(err.path)}: ${err.message}`;
}

// ---------------------------------------------------------------- ConfigMap, Secret

export function configMapErrors(cm: Obj): FieldError[] {
  const typeErrs: FieldError[] = [];
  checkTypes(cm, configMapSchema, [], typeErrs);
  if (typeErrs.length > 0) return typeErrs;
  const e = new Errors();
  validateMetadata(cm.metadata as Obj | undefined, e);
  const data = isObj(cm.data) ? cm.data : {};
  const binary = isObj(cm.binaryData) ? cm.binaryData : {};
  for (const k of Object.keys(data)) {
    const why = configKeyError(k);
    if (why) e.invalid(['data'], k, why);
  }
  for (const [k, v] of Object.entries(binary)) {
    const why = configKeyError(k);
    if (why) e.invalid(['binaryData'], k, why);
    if (k in data) e.invalid(['data'], k, 'duplicate of key present in binaryData');
    if (typeof v === 'string' && !isBase64(v)) e.invalid(['binaryData', k], '<binary>', 'illegal base64 data');
  }
  return e.list;
}

export function secretErrors(s: Obj): FieldError[] {
  const typeErrs: FieldError[] = [];
  checkTypes(s, secretSchema, [], typeErrs);
  if (typeErrs.length > 0) return typeErrs;
  const e = new Errors();
  validateMetadata(s.metadata as Obj | undefined, e);
  for (const field of ['data', 'stringData'] as const) {
    const m = isObj(s[field]) ? (s[field] as Obj) : {};
    for (const [k, v] of Object.entries(m)) {
      const why = configKeyError(k);
      if (why) e.invalid([field], k, why);
      // The value is never echoed: it is a secret.
      if (field === 'data' && typeof v === 'string' && !isBase64(v)) e.invalid([field, k], '<secret data>', 'illegal base64 data');
    }
  }
  return e.list;
}

/** A ConfigMap with its defaults (data {}), or the reasons it is invalid. */
export function validateConfigMap(stored: StoredObject): { ok: true; configMap: ConfigMap } | { ok: false; reasons: string[] } {
  const errs = configMapErrors(stored.object);
  if (errs.length > 0) return { ok: false, reasons: errs.map(formatError) };
  const cm = structuredClone(stored.object) as Obj;
  if (!isObj(cm.metadata)) cm.metadata = {};
  (cm.metadata as Obj).namespace = stored.namespace;
  (cm.metadata as Obj).uid = stored.uid;
  if (!has(cm.data)) cm.data = {};
  return { ok: true, configMap: cm as ConfigMap };
}

/** A Secret as the API server stores it: stringData base64-encoded into data (winning), type Opaque by default. */
export function validateSecret(stored: StoredObject): { ok: true; secret: Secret } | { ok: false; reasons: string[] } {
  const errs = secretErrors(stored.object);
  if (errs.length > 0) return { ok: false, reasons: errs.map(formatError) };
  return { ok: true, secret: normalizeSecret(stored) };
}

export function normalizeSecret(stored: StoredObject): Secret {
  const s = structuredClone(stored.object) as Obj;
  if (!isObj(s.metadata)) s.metadata = {};
  (s.metadata as Obj).namespace = stored.namespace;
  (s.metadata as Obj).uid = stored.uid;
  const data: Record<string, string> = {};
  if (isObj(s.data)) for (const [k, v] of Object.entries(s.data)) if (typeof v === 'string') data[k] = v.replace(/[\r\n]/g, '');
  if (isObj(s.stringData)) {
    for (const [k, v] of Object.entries(s.stringData)) if (typeof v === 'string') data[k] = Buffer.from(v, 'utf8').toString('base64');
  }
  delete s.stringData;
  s.data = data;
  if (empty(s.type)) s.type = 'Opaque';
  return s as Secret;
}

/**
 * The checks the manifest loader runs on every object it keeps: v1 Pods
 * (after defaulting), ConfigMaps and Secrets are validated; other kinds
 * are kept as they are for whoever uses them.
 */
export function validateManifestObject(o: Obj): FieldError[] {
  if (o.apiVersion !== 'v1') return [];
  switch (o.kind) {
    case 'Pod': {
      const pod = structuredClone(o);
      applyPodDefaults(pod);
      return podErrors(pod);
    }
    case 'ConfigMap':
      return configMapErrors(o);
    case 'Secret':
      return secretErrors(o);
    default:
      return [];
  }
}
