/**
 * Request bodies in the Kubernetes protobuf encoding, which kubectl 1.35's
 * typed commands (`create configmap|secret|namespace`) send: the `k8s\0`
 * magic, a runtime.Unknown envelope naming apiVersion and kind, and the
 * object's message. Decoded here, for the kinds served, into the JSON shape
 * the store takes; answers still go out as JSON, which every client accepts.
 * The reader checks every length against what is left, so a hostile body
 * can only fail to parse.
 */
import { ApiError } from './errors.js';
import type { Obj } from './types.js';

export const PROTOBUF_TYPE = 'application/vnd.kubernetes.protobuf';
const MAGIC = Buffer.from([0x6b, 0x38, 0x73, 0x00]);

type Field = { no: number; wire: number; varint?: bigint; bytes?: Buffer };

function malformed(why: string): ApiError {
  return new ApiError('BadRequest', `the protobuf body could not be decoded: ${why}`);
}

function fields(buf: Buffer): Field[] {
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
  while (i < buf.length) {
    const tag = Number(varint());
    const no = tag >>> 3;
    const wire = tag & 7;
    if (wire === 0) out.push({ no, wire, varint: varint() });
    else if (wire === 2) {
      const len = Number(varint());
      if (len > buf.length - i) throw malformed('length beyond the body');
      out.push({ no, wire, bytes: buf.subarray(i, i + len) });
      i += len;
    } else if (wire === 1) i += 8;
    else if (wire === 5) i += 4;
    else throw malformed(`wire type ${wire}`);
    if (i > buf.length) throw malformed('truncated field');
  }
  return out;
}

const str = (f: Field) => (f.bytes ?? Buffer.alloc(0)).toString('utf8');

function mapEntry(f: Field, asBytes: boolean): [string, string] {
  let k = '';
  let v = '';
  for (const e of fields(f.bytes ?? Buffer.alloc(0))) {
    if (e.no === 1) k = str(e);
    if (e.no === 2) v = asBytes ? (e.bytes ?? Buffer.alloc(0)).toString('base64') : str(e);
  }
  return [k, v];
}

function addTo(o: Obj, key: string, [k, v]: [string, string]): void {
  ((o[key] ??= {}) as Record<string, string>)[k] = v;
}

function ownerReference(buf: Buffer): Obj {
  const o: Obj = {};
  for (const f of fields(buf)) {
    if (f.no === 1) o.kind = str(f);
    else if (f.no === 3) o.name = str(f);
    else if (f.no === 4) o.uid = str(f);
    else if (f.no === 5) o.apiVersion = str(f);
    else if (f.no === 6) o.controller = f.varint === 1n;
    else if (f.no === 7) o.blockOwnerDeletion = f.varint === 1n;
  }
  return o;
}

function objectMeta(buf: Buffer): Obj {
  const m: Obj = {};
  const names: Record<number, string> = { 1: 'name', 2: 'generateName', 3: 'namespace', 5: 'uid', 6: 'resourceVersion' };
  for (const f of fields(buf)) {
    // proto2 writes empty optional strings and zero numbers; JSON would omit them.
    if (names[f.no] && f.wire === 2) {
      if (str(f) !== '') m[names[f.no]!] = str(f);
    } else if (f.no === 7 && f.varint !== 0n) m.generation = Number(f.varint);
    else if (f.no === 11) addTo(m, 'labels', mapEntry(f, false));
    else if (f.no === 12) addTo(m, 'annotations', mapEntry(f, false));
    else if (f.no === 13) ((m.ownerReferences ??= []) as Obj[]).push(ownerReference(f.bytes!));
    else if (f.no === 14) ((m.finalizers ??= []) as string[]).push(str(f));
  }
  return m;
}

/** Field number → how to read it, per kind. */
const kinds: Record<string, (o: Obj, f: Field) => void> = {
  ConfigMap(o, f) {
    if (f.no === 2) addTo(o, 'data', mapEntry(f, false));
    else if (f.no === 3) addTo(o, 'binaryData', mapEntry(f, true));
    else if (f.no === 4) o.immutable = f.varint === 1n;
  },
  Secret(o, f) {
    if (f.no === 2) addTo(o, 'data', mapEntry(f, true));
    else if (f.no === 4) addTo(o, 'stringData', mapEntry(f, false));
    else if (f.no === 3) o.type = str(f);
    else if (f.no === 5) o.immutable = f.varint === 1n;
  },
  Namespace(o, f) {
    if (f.no === 2) o.spec = { finalizers: fields(f.bytes!).filter((x) => x.no === 1).map(str) };
  },
};

/** The envelope's apiVersion, kind and message. */
function envelope(body: Buffer): { apiVersion: string; kind: string; raw: Buffer } {
  if (body.length < 4 || !body.subarray(0, 4).equals(MAGIC)) throw malformed('no k8s magic');
  let apiVersion = '';
  let kind = '';
  let raw: Buffer = Buffer.alloc(0);
  for (const f of fields(body.subarray(4))) {
    if (f.no === 1) {
      for (const t of fields(f.bytes!)) {
        if (t.no === 1) apiVersion = str(t);
        if (t.no === 2) kind = str(t);
      }
    } else if (f.no === 2) raw = f.bytes!;
    else if (f.no === 3 && str(f) !== '') throw malformed(`content encoding ${str(f)}`);
  }
  return { apiVersion, kind, raw };
}

/**
 * A DeleteOptions body as client-go's typed clients send it (helm's release
 * storage does): grace period, preconditions, propagation, dry run.
 */
export function decodeDeleteOptions(body: Buffer): Obj {
  const { kind, raw } = envelope(body);
  if (kind !== 'DeleteOptions') throw malformed(`a ${kind || 'message'} where DeleteOptions belong`);
  const o: Obj = {};
  for (const f of fields(raw)) {
    if (f.no === 1 && f.varint !== undefined) o.gracePeriodSeconds = Number(BigInt.asIntN(64, f.varint));
    else if (f.no === 2 && f.bytes) {
      const pre: Obj = {};
      for (const p of fields(f.bytes)) {
        if (p.no === 1) pre.uid = str(p);
        if (p.no === 2) pre.resourceVersion = str(p);
      }
      o.preconditions = pre;
    } else if (f.no === 3 && f.varint !== undefined) o.orphanDependents = f.varint === 1n;
    else if (f.no === 4) o.propagationPolicy = str(f);
    else if (f.no === 5) ((o.dryRun ??= []) as string[]).push(str(f));
  }
  return o;
}

export function decodeProtobuf(body: Buffer): Obj {
  const { apiVersion, kind, raw } = envelope(body);
  const read = kinds[kind];
  if (apiVersion !== 'v1' || !read) throw new ApiError('UnsupportedMediaType', `protobuf bodies are accepted for v1 ConfigMap, Secret and Namespace, not ${apiVersion} ${kind}; send application/json`);
  const o: Obj = { apiVersion, kind };
  for (const f of fields(raw)) {
    if (f.no === 1) o.metadata = objectMeta(f.bytes!);
    else read(o, f);
  }
  return o;
}
