/**
 * Request bodies in the Kubernetes protobuf encoding, which kubectl 1.35's
 * typed commands (`create deployment|job|cronjob|service|configmap|...`,
 * `run`) and client-go's typed clients send: the `k8s\0` magic, a
 * runtime.Unknown envelope naming apiVersion and kind, and the object's
 * message. Decoded here, for the kinds served, into the JSON shape the store
 * takes, by the field table in protobuf-schema.ts (generated from
 * k8s.io/api's .proto files); answers still go out as JSON, which every
 * client accepts. Fields the table does not know are left out, as the API
 * server drops fields its types lack. The reader checks every length
 * against what is left, bounds nesting, and counts every field as it reads
 * it (known or not) against one budget for the body, so a hostile body can
 * only fail to parse, and fails at once.
 */
import { ApiError } from './errors.js';
import { MAX_VALUES } from './patch.js';
import { MESSAGES } from './protobuf-schema.js';
import type { Obj } from './types.js';

export const PROTOBUF_TYPE = 'application/vnd.kubernetes.protobuf';
const MAGIC = Buffer.from([0x6b, 0x38, 0x73, 0x00]);
/** Deeper than any served kind's messages nest (a CronJob's container's probe is about 12). */
const MAX_DEPTH = 40;

/**
 * Go writes every non-pointer field, zero or not, and JSON omits most zero
 * ones; the wire cannot tell the two apart, so a zero is dropped, except in
 * these fields: pointers in Go whose zero means something else than absent
 * (replicas 0 is not the default 1, runAsUser 0 is root, a grace period of 0
 * is immediate).
 */
const KEEP_ZERO = new Set([
  'replicas', 'parallelism', 'completions', 'backoffLimit', 'backoffLimitPerIndex', 'maxFailedIndexes', 'ttlSecondsAfterFinished',
  'successfulJobsHistoryLimit', 'failedJobsHistoryLimit', 'startingDeadlineSeconds', 'revisionHistoryLimit',
  'terminationGracePeriodSeconds', 'gracePeriodSeconds', 'deletionGracePeriodSeconds', 'orphanDependents',
  'runAsUser', 'runAsGroup', 'fsGroup', 'allowPrivilegeEscalation', 'automountServiceAccountToken', 'enableServiceLinks',
  'hostUsers', 'allocateLoadBalancerNodePorts', 'maxUnavailable', 'maxSurge', 'minAvailable', 'defaultMode', 'mode',
  'tolerationSeconds', 'leaseTransitions', 'leaseDurationSeconds', 'ready', 'serving', 'terminating', 'suspend', 'optional',
]);

/** Go structs embedded with `json:",inline"`: their fields are the outer object's in JSON. */
const INLINE = new Set(['volumeSource', 'persistentVolumeSource', 'ephemeralContainerCommon']);

type Field = { no: number; wire: number; varint?: bigint; bytes?: Buffer };
type FieldSpec = { name: string; repeated: boolean; map: boolean; type: string };

function malformed(why: string): ApiError {
  return new ApiError('BadRequest', `the protobuf body could not be decoded: ${why}`);
}

/**
 * Fields read from the whole body so far, at every depth, known to the table
 * or not: counted as each is read, so a body of a million empty fields is
 * refused at the budget's end, not after its list is built.
 */
interface Budget {
  values: number;
}

function tooMany(): ApiError {
  return new ApiError('RequestEntityTooLarge', `the protobuf body holds more than ${MAX_VALUES} values`);
}

function fields(buf: Buffer, budget: Budget): Field[] {
  const out: Field[] = [];
  let i = 0;
  const varint = (): bigint => {
    let v = 0n;
    for (let shift = 0n; shift < 70n; shift += 7n) {
      if (i >= buf.length) throw malformed('truncated varint');
      const b = buf[i++]!;
      v |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return v;
    }
    throw malformed('varint too long');
  };
  const take = (len: number): Buffer => {
    if (len > buf.length - i) throw malformed('length beyond the body');
    const b = buf.subarray(i, i + len);
    i += len;
    return b;
  };
  while (i < buf.length) {
    if (--budget.values < 0) throw tooMany();
    const tag = varint();
    if (tag > 0xffffffffn) throw malformed('field tag out of range');
    const no = Number(tag >> 3n);
    const wire = Number(tag & 7n);
    if (wire === 0) out.push({ no, wire, varint: varint() });
    else if (wire === 2) out.push({ no, wire, bytes: take(Number(varint())) });
    else if (wire === 1) out.push({ no, wire, bytes: take(8) });
    else if (wire === 5) out.push({ no, wire, bytes: take(4) });
    else throw malformed(`wire type ${wire}`);
  }
  return out;
}

/** The table's text for a message, parsed once. */
const parsed = new Map<string, Map<number, FieldSpec>>();
function schema(type: string): Map<number, FieldSpec> | undefined {
  let s = parsed.get(type);
  if (s) return s;
  const text = MESSAGES[type];
  if (text === undefined) return undefined;
  s = new Map();
  for (const item of text.split(' ')) {
    const m = /^(\w+)=(\d+):(\*?)(\{s,)?([^}]+)\}?$/.exec(item)!;
    s.set(Number(m[2]), { name: m[1]!, repeated: m[3] === '*', map: m[4] !== undefined, type: m[5]! });
  }
  parsed.set(type, s);
  return s;
}

const int = (f: Field): number => Number(BigInt.asIntN(64, f.varint!));
const text = (f: Field): string => f.bytes!.toString('utf8');

function rfc3339(seconds: number, micros?: number): string | undefined {
  const d = new Date(seconds * 1000);
  if (Number.isNaN(d.getTime())) throw malformed(`a time of ${seconds} seconds`);
  const base = d.toISOString().slice(0, 19);
  return micros === undefined ? `${base}Z` : `${base}.${String(micros).padStart(6, '0')}Z`;
}

/** Go's time.Duration text (1h2m3.5s, 250ms, 0s), which the JSON form carries. */
function goDuration(ns: number): string {
  if (ns === 0) return '0s';
  const sign = ns < 0 ? '-' : '';
  let n = Math.abs(ns);
  if (n < 1e6) return n < 1e3 ? `${sign}${n}ns` : `${sign}${n / 1e3}µs`;
  if (n < 1e9) return `${sign}${n / 1e6}ms`;
  const h = Math.floor(n / 3.6e12);
  n -= h * 3.6e12;
  const m = Math.floor(n / 6e10);
  n -= m * 6e10;
  const s = `${Number((n / 1e9).toFixed(9))}s`;
  return `${sign}${h > 0 ? `${h}h${m}m` : m > 0 ? `${m}m` : ''}${s}`;
}

function json(raw: Buffer): unknown {
  try {
    return JSON.parse(raw.toString('utf8'));
  } catch {
    throw malformed('an embedded JSON value is not JSON');
  }
}

/** The types whose JSON form is not their fields. */
function special(type: string, buf: Buffer, budget: Budget): unknown {
  const fs = fields(buf, budget);
  const last = (no: number, wire: number) => {
    let found: Field | undefined;
    for (const x of fs) if (x.no === no && x.wire === wire) found = x;
    return found;
  };
  const num = (no: number) => {
    const f = last(no, 0);
    return f ? int(f) : undefined;
  };
  const bytes = (no: number) => last(no, 2)?.bytes;
  switch (type) {
    case 'meta/v1.Time':
    case 'meta/v1.MicroTime': {
      const seconds = num(1);
      if (seconds === undefined && num(2) === undefined) return undefined;
      return rfc3339(seconds ?? 0, type === 'meta/v1.MicroTime' ? Math.floor((num(2) ?? 0) / 1000) : undefined);
    }
    case 'meta/v1.Duration':
      return goDuration(num(1) ?? 0);
    case 'resource.Quantity':
      return bytes(1)?.toString('utf8') ?? '';
    case 'intstr.IntOrString':
      return num(1) === 1 ? (bytes(3)?.toString('utf8') ?? '') : (num(2) ?? 0);
    case 'meta/v1.FieldsV1':
    case 'runtime.RawExtension': {
      const raw = bytes(1);
      return raw && raw.length > 0 ? json(raw) : undefined;
    }
    default:
      return undefined;
  }
}

function scalar(spec: FieldSpec, f: Field): unknown {
  const want = spec.type === 'd' ? 1 : spec.type === 's' || spec.type === 'y' ? 2 : 0;
  if (f.wire !== want) throw malformed(`field ${spec.name} in the wrong wire type ${f.wire}`);
  switch (spec.type) {
    case 's':
      return text(f);
    case 'y':
      return f.bytes!.toString('base64');
    case 'b':
      return f.varint !== 0n;
    case 'i':
      return int(f);
    default:
      return f.bytes!.readDoubleLE(0);
  }
}

function value(spec: FieldSpec, type: string, f: Field, depth: number, budget: Budget): unknown {
  if (!type.includes('.')) return scalar(spec, f);
  if (f.wire !== 2) throw malformed(`field ${spec.name} in the wrong wire type ${f.wire}`);
  if (MESSAGES[type] === undefined) return special(type, f.bytes!, budget);
  return message(type, f.bytes!, depth + 1, budget);
}

const isZero = (v: unknown) => v === undefined || v === '' || v === 0 || v === false;

function message(type: string, buf: Buffer, depth: number, budget: Budget): Obj {
  if (depth > MAX_DEPTH) throw malformed(`messages nested more than ${MAX_DEPTH} deep`);
  const s = schema(type)!;
  const o: Obj = {};
  for (const f of fields(buf, budget)) {
    const spec = s.get(f.no);
    if (!spec) continue;
    if (spec.map) {
      if (f.wire !== 2) throw malformed(`map ${spec.name} in the wrong wire type ${f.wire}`);
      let k = '';
      let v: unknown = spec.type === 's' ? '' : undefined;
      for (const e of fields(f.bytes!, budget)) {
        if (e.no === 1 && e.wire === 2) k = text(e);
        else if (e.no === 2) v = value(spec, spec.type, e, depth, budget);
      }
      ((o[spec.name] ??= {}) as Obj)[k] = v ?? (spec.type === 'resource.Quantity' ? '0' : '');
    } else if (spec.repeated) {
      const list = (o[spec.name] ??= []) as unknown[];
      // Packed repeated numbers (proto3 style), which a proto2 writer may also send.
      if (f.wire === 2 && (spec.type === 'i' || spec.type === 'b')) {
        for (const p of packed(f.bytes!, budget)) list.push(value(spec, spec.type, p, depth, budget));
      } else list.push(value(spec, spec.type, f, depth, budget));
    } else {
      const v = value(spec, spec.type, f, depth, budget);
      if (INLINE.has(spec.name) && typeof v === 'object' && v !== null) Object.assign(o, v);
      else if (isZero(v) && !KEEP_ZERO.has(spec.name)) delete o[spec.name];
      else if (v !== undefined) o[spec.name] = v;
    }
  }
  return o;
}

function packed(buf: Buffer, budget: Budget): Field[] {
  const out: Field[] = [];
  let i = 0;
  while (i < buf.length) {
    if (--budget.values < 0) throw tooMany();
    let v = 0n;
    let shift = 0n;
    for (;;) {
      if (i >= buf.length || shift >= 70n) throw malformed('truncated packed varint');
      const b = buf[i++]!;
      v |= BigInt(b & 0x7f) << shift;
      shift += 7n;
      if ((b & 0x80) === 0) break;
    }
    out.push({ no: 0, wire: 0, varint: v });
  }
  return out;
}

/** The envelope's apiVersion, kind and message. */
function envelope(body: Buffer, budget: Budget): { apiVersion: string; kind: string; raw: Buffer } {
  if (body.length < 4 || !body.subarray(0, 4).equals(MAGIC)) throw malformed('no k8s magic');
  let apiVersion = '';
  let kind = '';
  let raw: Buffer = Buffer.alloc(0);
  for (const f of fields(body.subarray(4), budget)) {
    if (f.no === 1 && f.wire === 2) {
      for (const t of fields(f.bytes!, budget)) {
        if (t.no === 1 && t.wire === 2) apiVersion = text(t);
        if (t.no === 2 && t.wire === 2) kind = text(t);
      }
    } else if (f.no === 2 && f.wire === 2) raw = f.bytes!;
    else if (f.no === 3 && f.wire === 2 && text(f) !== '') throw malformed(`content encoding ${text(f)}`);
  }
  return { apiVersion, kind, raw };
}

/** v1 → core/v1, apps/v1 → apps/v1, coordination.k8s.io/v1 → coordination/v1, rbac.authorization.k8s.io/v1 → rbac/v1: the table's package names. */
function messageType(apiVersion: string, kind: string): string | undefined {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/', 2) : ['core', apiVersion];
  if (!/^[a-z0-9.]+$/.test(group!) || !/^v\w+$/.test(version!) || !/^[A-Z]\w*$/.test(kind)) return undefined;
  const type = `${group!.split('.')[0]}/${version}.${kind}`;
  // Only top-level objects (with ObjectMeta first), not a message inside one.
  return MESSAGES[type]?.startsWith('metadata=1:meta/v1.ObjectMeta') ? type : undefined;
}

/**
 * A DeleteOptions body as client-go's typed clients send it (helm's release
 * storage does): grace period, preconditions, propagation, dry run.
 */
export function decodeDeleteOptions(body: Buffer): Obj {
  const budget = { values: MAX_VALUES };
  const { kind, raw } = envelope(body, budget);
  if (kind !== 'DeleteOptions') throw malformed(`a ${kind || 'message'} where DeleteOptions belong`);
  return message('meta/v1.DeleteOptions', raw, 0, budget);
}

export function decodeProtobuf(body: Buffer): Obj {
  const budget = { values: MAX_VALUES };
  const { apiVersion, kind, raw } = envelope(body, budget);
  const type = messageType(apiVersion, kind);
  if (!type) {
    throw new ApiError('UnsupportedMediaType', `protobuf bodies are not accepted for ${apiVersion} ${kind}; send application/json`);
  }
  return { apiVersion, kind, ...message(type, raw, 0, budget) };
}
