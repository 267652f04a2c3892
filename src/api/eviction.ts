/**
 * pods/eviction (policy/v1 Eviction, and policy/v1beta1 bodies as older
 * clients send them): a pod deleted only if the PodDisruptionBudget that
 * covers it allows one more disruption, as kube-apiserver's eviction REST
 * does. A pod that is Pending, finished or already terminating has nothing
 * left to disrupt and is deleted whatever the budget says; a pod not Ready
 * is deleted if its budget is healthy anyway, or always with
 * unhealthyPodEvictionPolicy AlwaysAllow. A budget the disruption controller
 * has not caught up with (observedGeneration behind) refuses, as upstream.
 * The check, the budget's decrement and the deletion run in one synchronous
 * step of the store, so two evictions cannot both take the last disruption.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ApiError, badRequest, conflict } from './errors.js';
import { budgetSelects } from './kinds/pdb.js';
import { decodeProtobuf, PROTOBUF_TYPE } from './protobuf.js';
import type { Subresource } from './server.js';
import { timestamp, type DeleteOptions, type Store } from './store.js';
import type { ApiObject, Obj } from './types.js';

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const MAX_BODY = 64 * 1024;
/** As upstream: a budget whose disruptedPods map is this large refuses more until the controller catches up. */
const MAX_DISRUPTED = 2000;
const EVICTION_VERSIONS = new Set(['policy/v1', 'policy/v1beta1']);
export const BUDGET_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget.";

export interface EvictionOptions {
  store: Store;
  now?: () => number;
}

const conditions = (o: ApiObject): Obj[] => (isObj(o.status) && Array.isArray(o.status.conditions) ? (o.status.conditions as unknown[]).filter(isObj) : []);
export const podReady = (pod: ApiObject): boolean => conditions(pod).some((c) => c.type === 'Ready' && c.status === 'True');
const phaseOf = (pod: ApiObject): string => String((isObj(pod.status) ? pod.status.phase : undefined) ?? '');

function tooMany(cause: string, retryAfterSeconds: number): ApiError {
  const e = new ApiError('TooManyRequests', BUDGET_MESSAGE, { causes: [{ reason: 'DisruptionBudget', message: cause }] });
  (e as ApiError & { retryAfterSeconds?: number }).retryAfterSeconds = retryAfterSeconds;
  return e;
}

/** The Eviction's DeleteOptions as the store takes them (BadRequest for what is not one). */
function deleteOptionsOf(eviction: Obj, dryRun: boolean): DeleteOptions {
  const d = eviction.deleteOptions;
  if (d === undefined || d === null) return { dryRun };
  if (!isObj(d)) throw badRequest('deleteOptions must be an object');
  const pre = isObj(d.preconditions) ? d.preconditions : {};
  const grace = d.gracePeriodSeconds;
  if (grace !== undefined && grace !== null && (typeof grace !== 'number' || !Number.isInteger(grace) || grace < 0)) {
    throw badRequest(`gracePeriodSeconds must be a whole number of seconds, not ${JSON.stringify(grace)}`);
  }
  const dry = Array.isArray(d.dryRun) ? d.dryRun : [];
  if (dry.some((x) => x !== 'All')) throw badRequest(`Invalid dry run value: ${dry.join(',')}: valid values are "All"`);
  return {
    dryRun: dryRun || dry.length > 0,
    ...(typeof grace === 'number' ? { gracePeriodSeconds: grace } : {}),
    ...(typeof pre.uid === 'string' && pre.uid !== '' ? { uid: pre.uid } : {}),
    ...(typeof pre.resourceVersion === 'string' && pre.resourceVersion !== '' ? { resourceVersion: pre.resourceVersion } : {}),
  };
}

/**
 * Evicts namespace/name as the Eviction asks. Throws NotFound for no such
 * pod, TooManyRequests (the DisruptionBudget cause) when its budget allows
 * no disruption now, InternalError when more than one budget covers it.
 */
export function evict(store: Store, namespace: string, name: string, eviction: Obj, opts: { dryRun?: boolean; now?: () => number } = {}): void {
  const now = opts.now ?? Date.now;
  if (eviction.kind !== undefined && eviction.kind !== 'Eviction') throw badRequest(`the kind of the object (${String(eviction.kind)}) does not match the resource (Eviction)`);
  if (eviction.apiVersion !== undefined && !EVICTION_VERSIONS.has(String(eviction.apiVersion))) {
    throw badRequest(`the API version in the data (${String(eviction.apiVersion)}) does not match the expected API version (policy/v1)`);
  }
  const meta = isObj(eviction.metadata) ? eviction.metadata : {};
  if (meta.name !== name) throw badRequest('name in URL does not match name in Eviction object');
  if (meta.namespace !== undefined && meta.namespace !== '' && meta.namespace !== namespace) throw badRequest('the namespace of the provided object does not match the namespace sent on the request');
  const options = deleteOptionsOf(eviction, opts.dryRun === true);
  const pods = store.kind('pods')!;
  const pod = store.get(pods, namespace, name);
  if (options.uid && options.uid !== pod.metadata.uid) throw conflict('pods', name, `Precondition failed: UID in precondition: ${options.uid}, UID in object meta: ${pod.metadata.uid}`);
  if (options.resourceVersion && options.resourceVersion !== pod.metadata.resourceVersion) {
    throw conflict('pods', name, `Precondition failed: ResourceVersion in precondition: ${options.resourceVersion}, ResourceVersion in object meta: ${pod.metadata.resourceVersion}`);
  }
  // A pod the store would refuse to delete (a manifest file's) is refused before the budget is touched.
  store.delete(pods, namespace, name, { ...options, dryRun: true });
  const phase = phaseOf(pod);
  // Nothing left to disrupt: a pod not started, finished, or already going.
  if (phase === 'Pending' || phase === 'Succeeded' || phase === 'Failed' || pod.metadata.deletionTimestamp) return remove(store, pod, options, now);
  const budgets = store.kind('poddisruptionbudgets.policy');
  const covering = budgets ? store.list(budgets, { namespace }).items.filter((b) => budgetSelects(b, pod)) : [];
  if (covering.length > 1) throw new ApiError('InternalError', 'This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.');
  if (covering.length === 0) return remove(store, pod, options, now);
  const pdb = covering[0]!;
  const spec = isObj(pdb.spec) ? pdb.spec : {};
  const status = isObj(pdb.status) ? pdb.status : {};
  const num = (v: unknown) => (typeof v === 'number' ? v : 0);
  if (!podReady(pod)) {
    // An unready pod counts for nothing in the budget: evicting it takes no healthy pod away.
    if (spec.unhealthyPodEvictionPolicy === 'AlwaysAllow') return remove(store, pod, options, now);
    if (num(status.currentHealthy) >= num(status.desiredHealthy) && num(status.desiredHealthy) > 0) return remove(store, pod, options, now);
  }
  if (num(status.observedGeneration) < (pdb.metadata.generation ?? 0)) throw tooMany(`The disruption budget ${pdb.metadata.name} is still being processed by the server.`, 10);
  const allowed = num(status.disruptionsAllowed);
  if (allowed < 0) throw new ApiError('Forbidden', `poddisruptionbudgets.policy "${pdb.metadata.name}" is forbidden: pdb disruptions allowed is negative`, { name: pdb.metadata.name, group: 'policy', kind: 'poddisruptionbudgets' });
  const disrupted = isObj(status.disruptedPods) ? status.disruptedPods : {};
  if (Object.keys(disrupted).length > MAX_DISRUPTED) {
    throw new ApiError('Forbidden', `poddisruptionbudgets.policy "${pdb.metadata.name}" is forbidden: DisruptedPods map too big - too many evictions not confirmed by PDB controller`, { name: pdb.metadata.name, group: 'policy', kind: 'poddisruptionbudgets' });
  }
  if (allowed === 0) throw tooMany(`The disruption budget ${pdb.metadata.name} needs ${num(status.desiredHealthy)} healthy pods and has ${num(status.currentHealthy)} currently`, 0);
  if (options.dryRun) return;
  // Told to the controller: this pod is about to go, do not count it as healthy meanwhile.
  const next: Obj = { ...status, disruptionsAllowed: allowed - 1, disruptedPods: { ...disrupted, [name]: timestamp(now()) } };
  if (allowed - 1 === 0) next.conditions = setCondition(conditions({ ...pdb, status }), { type: 'DisruptionAllowed', status: 'False', reason: 'InsufficientPods', message: '', observedGeneration: num(status.observedGeneration) }, now());
  store.update(budgets!, namespace, String(pdb.metadata.name), { ...pdb, status: next }, { status: true });
  remove(store, pod, options, now);
}

/** The pod marked DisruptionTarget (as kube-apiserver marks it), then deleted as the Eviction's deleteOptions say. */
function remove(store: Store, pod: ApiObject, options: DeleteOptions, now: () => number): void {
  const pods = store.kind('pods')!;
  const namespace = pod.metadata.namespace ?? 'default';
  const name = String(pod.metadata.name);
  if (options.dryRun) {
    store.delete(pods, namespace, name, options);
    return;
  }
  let opts = options;
  if (!pod.metadata.deletionTimestamp) {
    const status = isObj(pod.status) ? pod.status : {};
    const marked = setCondition(conditions(pod), { type: 'DisruptionTarget', status: 'True', reason: 'EvictionByEvictionAPI', message: 'Eviction API: evicting' }, now());
    const updated = store.update(pods, namespace, name, { ...pod, status: { ...status, conditions: marked } }, { status: true });
    // The precondition was checked against the pod before this write, which is ours.
    if (opts.resourceVersion) opts = { ...opts, resourceVersion: updated.metadata.resourceVersion };
  }
  store.delete(pods, namespace, name, opts);
}

/** A condition set as apimachinery's SetStatusCondition / the pod's UpdatePodCondition do: the transition time moves only with the status. */
export function setCondition(list: Obj[], c: Obj, nowMs: number): Obj[] {
  const old = list.find((x) => x.type === c.type);
  const at = timestamp(nowMs);
  const next: Obj = { ...c, lastTransitionTime: old && old.status === c.status ? old.lastTransitionTime : at };
  if ('lastProbeTime' in (old ?? {}) || c.type === 'DisruptionTarget') next.lastProbeTime = null;
  if (c.type !== 'DisruptionTarget' && c.observedGeneration === undefined) delete next.observedGeneration;
  return old ? list.map((x) => (x === old ? next : x)) : [...list, next];
}

async function readEviction(req: IncomingMessage): Promise<Obj> {
  const declared = Number(req.headers['content-length'] ?? 0);
  if (declared > MAX_BODY) {
    req.resume();
    throw new ApiError('RequestEntityTooLarge', `an Eviction is at most ${MAX_BODY} bytes`);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) {
      req.socket.setTimeout(1000, () => req.socket.destroy());
      throw new ApiError('RequestEntityTooLarge', `an Eviction is at most ${MAX_BODY} bytes`);
    }
    chunks.push(chunk);
  }
  const body = Buffer.concat(chunks);
  const type = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
  if (type === PROTOBUF_TYPE) return decodeProtobuf(body);
  let v: unknown;
  try {
    v = JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw badRequest(`the request body is not JSON: ${(err as Error).message}`);
  }
  if (!isObj(v)) throw badRequest('the request body must be a JSON object');
  return v;
}

export function evictionSubresource(opts: EvictionOptions): Record<string, Subresource> {
  return {
    'pods/eviction': {
      kind: 'Eviction',
      group: 'policy',
      version: 'v1',
      verbs: ['create'],
      async handle(req: IncomingMessage, res: ServerResponse, target) {
        if (req.method !== 'POST') {
          req.resume();
          throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
        }
        const dry = target.query.getAll('dryRun');
        if (dry.some((x) => x !== 'All')) throw badRequest(`Invalid dry run value: ${dry.join(',')}: valid values are "All"`);
        const body = await readEviction(req);
        try {
          evict(opts.store, target.namespace, target.name, body, { dryRun: dry.length > 0, now: opts.now });
        } catch (err) {
          const after = (err as { retryAfterSeconds?: number }).retryAfterSeconds;
          if (err instanceof ApiError && after !== undefined && after > 0) res.setHeader('Retry-After', String(after));
          throw err;
        }
        const text = JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', code: 201 });
        res.writeHead(201, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
        res.end(text);
      },
    },
  };
}
