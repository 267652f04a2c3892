/**
 * The workload controllers as kube-controller-manager runs them: beside the
 * node, against the API, through the ApiClient interface only. Each pass
 * reads the workloads and their pods from local copies (informers), runs the
 * controllers' one pure function over them, and writes the difference back:
 *
 * - a Deployment owns one ReplicaSet per pod template it has had
 *   (`<name>-<pod-template-hash>`, with the revision annotations
 *   `kubectl rollout history/undo` read), and each ReplicaSet owns its Pods;
 * - DaemonSets and Jobs own their Pods; a CronJob owns the Jobs it makes;
 * - Pods no controller wants any more are deleted gracefully (the node's
 *   agent stops them), new ones are created bound to the node;
 * - each workload's status is written with the generation it was made from.
 *
 * The controllers' memory (a Job's start, a CronJob's last schedule, when a
 * condition last changed) is kept in a state file beside the node's other
 * state. The node's agent only runs the Pods the API binds to it.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import type { ApiObject, Obj } from '../api/types.js';
import { canonicalJson, CREATE_BURST, controllerOf, isAvailable, isFinished, isReady, isTerminating, templateHash } from '../controllers/common.js';
import { POD_TEMPLATE_HASH_LABEL, replicaSetName } from '../controllers/deployment.js';
import { ControllerDriver } from '../controllers/driver.js';
import { CONTROLLER_REVISION_HASH, planRevisions, type RevisionPlan } from '../controllers/history.js';
import { reconcileReplicaSet } from '../controllers/replicaset.js';
import { reconcileStatefulSet, type OwnerRef } from '../controllers/statefulset.js';
import type { WorkloadStatus } from '../controllers/types.js';
import { errorMessage } from '../errors.js';
import { StateFile } from '../kubelet-lite/state-file.js';
import { ThrottledWarning, type Logger } from '../log.js';
import { API_SOURCE_FILE, type StoredObject } from '../stored-object.js';
import { isStatefulSetMember, planOwnership, selectorOf, type OwnershipChange } from './adoption.js';
import type { ControllerEvents } from './controller-events.js';
import { Informer } from './informer.js';

export const REVISION_ANNOTATION = 'deployment.kubernetes.io/revision';
const DESIRED_REPLICAS_ANNOTATION = 'deployment.kubernetes.io/desired-replicas';
const MAX_REPLICAS_ANNOTATION = 'deployment.kubernetes.io/max-replicas';
/** On the Jobs a CronJob makes: the time they were scheduled for (as upstream's controller marks them). */
const SCHEDULED_ANNOTATION = 'batch.kubernetes.io/cronjob-scheduled-timestamp';
const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';
/** The Deployment's own annotations that its ReplicaSets do not copy (as upstream skips them). */
const NOT_COPIED = new Set([LAST_APPLIED, REVISION_ANNOTATION, 'deployment.kubernetes.io/revision-history', DESIRED_REPLICAS_ANNOTATION, MAX_REPLICAS_ANNOTATION]);
/** Passes are this far apart at most once something changed (a burst of pod status writes is one pass). */
const DEBOUNCE_MS = 20;
/**
 * A write that lost a race (a Conflict) is tried again this soon; while it
 * keeps failing pass after pass (a StatefulSet's pod name held by a pod it
 * does not own: AlreadyExists for ever), twice as late each time, up to
 * RETRY_MAX_MS, as upstream's work queue backs off. A change still runs a
 * pass at once.
 */
const RETRY_MS = 200;
const RETRY_MAX_MS = 10_000;
/** At most this many pods made in one pass, as the controllers make at most this many per workload. */
export const POD_BURST = CREATE_BURST;

const RESOURCES = {
  deployments: 'deployments.apps',
  daemonsets: 'daemonsets.apps',
  jobs: 'jobs.batch',
  cronjobs: 'cronjobs.batch',
  replicasets: 'replicasets.apps',
  statefulsets: 'statefulsets.apps',
  controllerrevisions: 'controllerrevisions.apps',
  replicationcontrollers: 'replicationcontrollers',
  pods: 'pods',
  /** Served only once the node has the storage kinds: without them, a StatefulSet's claims wait (see claimsServed). */
  pvcs: 'persistentvolumeclaims',
} as const;
type Res = keyof typeof RESOURCES;

const WORKLOAD_RESOURCE: Record<string, Res> = { Deployment: 'deployments', DaemonSet: 'daemonsets', Job: 'jobs', CronJob: 'cronjobs' };

export interface ControllerManagerOptions {
  client: ApiClient;
  nodeName: string;
  log: Logger;
  /** Where the controllers' memory is kept between runs; none: in memory only. */
  stateFile?: string;
  now?: () => number;
  random?: () => number;
  /** Where the controllers' events go (ScalingReplicaSet, SuccessfulCreate, Completed…); none: not recorded. */
  events?: ControllerEvents;
}

const nsOf = (o: ApiObject) => o.metadata.namespace ?? 'default';
const nameOf = (o: ApiObject) => o.metadata.name ?? '';
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The controller owner reference of an object, if any. */
function controllerRef(o: ApiObject): Obj | undefined {
  const refs = o.metadata.ownerReferences;
  return Array.isArray(refs) ? (refs as Obj[]).find((r) => isObj(r) && r.controller === true) : undefined;
}

/**
 * A pod template with what a client's round trip adds and means nothing
 * (nulls; `resources: {}`) taken out, so that the template kubectl writes
 * back on `rollout undo` hashes as the one it came from.
 */
export function normalizedTemplate(t: unknown): unknown {
  const strip = (v: unknown, inContainer: boolean): unknown => {
    if (Array.isArray(v)) return v.map((x) => strip(x, inContainer));
    if (!isObj(v)) return v;
    const out: Obj = {};
    for (const [k, x] of Object.entries(v)) {
      if (x === null || x === undefined) continue;
      if (inContainer && k === 'resources' && isObj(x) && Object.keys(x).length === 0) continue;
      const containerList = k === 'containers' || k === 'initContainers' || k === 'ephemeralContainers';
      out[k] = strip(x, containerList);
    }
    return out;
  };
  const out = strip(t, false);
  if (isObj(out) && isObj(out.metadata)) {
    const meta = out.metadata;
    if (isObj(meta.labels)) {
      const { [POD_TEMPLATE_HASH_LABEL]: _h, ...labels } = meta.labels;
      meta.labels = labels;
    }
    if (Object.keys(meta).length === 0) delete out.metadata;
  }
  return out;
}

function revisionOf(o: ApiObject): number {
  const v = Number((o.metadata.annotations as Record<string, string> | undefined)?.[REVISION_ANNOTATION]);
  return Number.isInteger(v) && v > 0 ? v : 0;
}

export class ControllerManager {
  private readonly o: ControllerManagerOptions;
  private readonly informers: Record<Res, Informer>;
  private readonly driver: ControllerDriver;
  private readonly state: StateFile | undefined;
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  private again = false;
  /** When the pending timer fires (ms since the epoch). */
  private timerAt = 0;
  /** A write this pass asked to be tried again (retrySoon). */
  private retryWanted = false;
  /** Passes in a row that ended wanting a retry. */
  private retries = 0;
  private stopped = false;
  private started = false;
  private statuses: WorkloadStatus[] = [];
  private lastSaved = '';
  /** A write refused for another reason than a race: written once, then counted (a full store refuses every pass). */
  private readonly refused: ThrottledWarning;
  /** Writes the current pass made. */
  private writes = 0;
  /** Objects a manifest file defines (namespace/name → the resourceVersion a metadata write was refused at). */
  private readonly fileOwned = new Map<string, string>();
  /** CronJob Jobs (namespace/name) seen in the API: one gone from there was deleted by someone. */
  private readonly madeJobs = new Set<string>();
  /** The API serves PersistentVolumeClaims (a StatefulSet's volumeClaimTemplates can be made). */
  private claimsServed = false;
  private wakeTimer: NodeJS.Timeout | undefined;
  private wakeAtMs: number | undefined;

  private constructor(opts: ControllerManagerOptions, savedState: unknown) {
    this.o = opts;
    const changed = () => this.schedule();
    this.informers = Object.fromEntries(Object.entries(RESOURCES).map(([k, r]) => [k, new Informer(opts.client, r, changed, opts.log)])) as Record<Res, Informer>;
    this.driver = new ControllerDriver({ nodeName: opts.nodeName, state: savedState, ...(opts.now ? { now: opts.now } : {}), ...(opts.random ? { random: opts.random } : {}), onRequeue: changed });
    this.state = opts.stateFile ? new StateFile(opts.stateFile) : undefined;
    this.refused = new ThrottledWarning(opts.log, 'the workload controllers could not write an object');
  }

  static async create(opts: ControllerManagerOptions): Promise<ControllerManager> {
    let saved: unknown;
    if (opts.stateFile) {
      const fs = await import('node:fs/promises');
      saved = await fs.readFile(opts.stateFile, 'utf8').then(
        (t) => JSON.parse(t) as unknown,
        () => undefined,
      );
    }
    return new ControllerManager(opts, saved);
  }

  /** Lists everything, then runs a first pass; from then on, a pass follows every change. */
  async start(): Promise<void> {
    this.claimsServed = await this.o.client.list(RESOURCES.pvcs, { limit: 1 }).then(
      () => true,
      () => false,
    );
    await Promise.all(Object.entries(this.informers).filter(([k]) => k !== 'pvcs' || this.claimsServed).map(([, i]) => i.start()));
    this.started = true;
    this.schedule(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    if (this.wakeTimer) clearTimeout(this.wakeTimer);
    for (const i of Object.values(this.informers)) i.stop();
    this.driver.stop();
    this.refused.flush();
    await this.state?.settled();
  }

  /** The workloads' statuses as last computed (for the status API and `skiff get`). */
  workloads(): WorkloadStatus[] {
    return structuredClone(this.statuses.filter((w) => !w.deleted));
  }

  /** Resolves once no pass is running or due (for tests and an orderly stop). */
  async idle(): Promise<void> {
    while (this.running || this.timer) await new Promise((r) => setTimeout(r, 10));
  }

  private schedule(ms = DEBOUNCE_MS): void {
    if (this.stopped || !this.started) return;
    if (this.running) {
      this.again = true;
      return;
    }
    const at = Date.now() + ms;
    if (this.timer) {
      // A retry waiting out its backoff gives way to a change, which runs sooner.
      if (at >= this.timerAt) return;
      clearTimeout(this.timer);
    }
    this.timerAt = at;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.running = true;
      this.retryWanted = false;
      this.pass()
        .catch((err) => this.o.log.error('the workload controllers failed a pass; trying again', { error: errorMessage(err) }))
        .finally(() => {
          this.running = false;
          const retry = this.retryWanted;
          this.retryWanted = false;
          // A pass that wrote something made progress: its retry is no failure repeating.
          this.retries = retry && this.writes === 0 ? Math.min(this.retries + 1, 16) : 0;
          if (this.again) {
            this.again = false;
            this.schedule();
          } else if (retry) this.schedule(this.retryDelay());
        });
    }, ms);
    this.timer.unref();
  }

  private retrySoon(): void {
    this.retryWanted = true;
    if (!this.running) this.schedule(this.retryDelay());
  }

  private retryDelay(): number {
    return Math.min(RETRY_MAX_MS, RETRY_MS * 2 ** this.retries);
  }

  // ------------------------------------------------------------ one pass

  private async pass(): Promise<void> {
    const inf = this.informers;
    this.writes = 0;
    const now = (this.o.now ?? Date.now)();
    await this.claim();
    this.noticeDeletedJobs();
    const virtual = this.driver.state.virtualJobs;
    const workloads: StoredObject[] = [];
    const read = new Map<string, ApiObject>();
    for (const res of ['deployments', 'daemonsets', 'jobs', 'cronjobs'] as const) {
      for (const o of inf[res].list()) {
        if (o.metadata.deletionTimestamp) continue; // going: its dependents go with it
        if (res === 'jobs' && virtual[`${nsOf(o)}/${nameOf(o)}`]) continue; // its CronJob runs it
        read.set(`${o.kind}/${nsOf(o)}/${nameOf(o)}`, o);
        workloads.push(this.stored(o));
      }
    }
    const owned: Pod[] = [];
    const reserved: string[] = [];
    for (const p of inf.pods.list()) {
      const ref = controllerRef(p);
      // A ReplicaSet no Deployment owns runs its own pods (syncReplicaSetsOfTheirOwn), as do StatefulSets and RCs.
      const bare = ref?.kind === 'ReplicaSet' && this.isBareReplicaSet(nsOf(p), String(ref.name));
      if (ref && !bare && (ref.kind === 'ReplicaSet' || ref.kind === 'DaemonSet' || ref.kind === 'Job')) owned.push(p as unknown as Pod);
      else reserved.push(`${nsOf(p)}/${nameOf(p)}`);
    }
    const out = this.driver.run(workloads, owned, reserved);
    this.statuses = out.statuses;

    await this.makeCronJobsJobs();
    const desired = new Map(out.pods.map((p) => [`${p.metadata?.namespace ?? 'default'}/${p.metadata?.name ?? ''}`, p]));
    await this.syncReplicaSets(read, out.pods, now);
    await this.syncPods(desired, owned);
    await this.writeStatuses(out.statuses, read);
    await this.syncDaemonSetRevisions(read);
    const budget = { pods: POD_BURST };
    await this.syncStatefulSets(now, budget);
    await this.syncReplicaSetsOfTheirOwn(now, budget);
    this.save();
    // What was written changes what the next pass sees (a ReplicaSet's pods, a Job's status): it runs until nothing is.
    if (this.writes > 0) this.again = true;
  }

  /**
   * Orphans the controllers' selectors match are adopted, and what a
   * controller owns but no longer selects is released (src/node/adoption.ts),
   * before anything is counted: an orphaned set of pods taken back is not made again.
   */
  private async claim(): Promise<void> {
    const inf = this.informers;
    const claimants = (...lists: ApiObject[][]) => lists.flat().map((object) => ({ object, selector: selectorOf(object) }));
    // A StatefulSet's pods are its members by name, not whatever carries its labels.
    const sets = inf.statefulsets.list().map((object) => ({ object, selector: selectorOf(object), accepts: (p: ApiObject) => isStatefulSetMember(object, p) }));
    const plans: Array<[Res, OwnershipChange[]]> = [
      ['pods', planOwnership([...claimants(inf.replicasets.list(), inf.replicationcontrollers.list(), inf.daemonsets.list()), ...sets], inf.pods.list())],
      ['replicasets', planOwnership(claimants(inf.deployments.list()), inf.replicasets.list())],
      ['controllerrevisions', planOwnership(claimants(inf.statefulsets.list(), inf.daemonsets.list()), inf.controllerrevisions.list())],
    ];
    for (const [res, changes] of plans) {
      for (const c of changes) {
        const o = c.object;
        const k = `${res}/${nsOf(o)}/${nameOf(o)}`;
        if (this.fileOwned.get(k) === o.metadata.resourceVersion) continue; // a manifest file's: not ours to change
        const got = await this.write(res, () => this.o.client.update(RESOURCES[res], nsOf(o), nameOf(o), { ...o, metadata: { ...o.metadata, ownerReferences: c.ownerReferences } }), () => this.fileOwned.set(k, o.metadata.resourceVersion ?? ''));
        if (got) this.o.log.info(c.change === 'adopt' ? 'a controller adopted an orphan its selector matches' : 'a controller released what its selector no longer matches', { [res]: k, controller: `${c.controller.kind}/${nameOf(c.controller)}` });
      }
    }
  }

  /** An API object as the controllers read it: no status, no server bookkeeping, the template normalized. */
  private stored(o: ApiObject): StoredObject {
    const { status: _s, ...rest } = o;
    const { managedFields: _m, ...meta } = o.metadata;
    const object = structuredClone({ ...rest, metadata: meta }) as Obj;
    if (isObj(object.spec) && object.spec.template !== undefined && o.kind !== 'CronJob') object.spec.template = normalizedTemplate(object.spec.template);
    return { apiVersion: o.apiVersion, kind: o.kind, namespace: nsOf(o), name: nameOf(o), uid: o.metadata.uid ?? '', object, source: { file: API_SOURCE_FILE, document: 0, line: 0 } };
  }

  /** A CronJob's Job that someone deleted is forgotten, not made again. */
  private noticeDeletedJobs(): void {
    const virtual = this.driver.state.virtualJobs;
    for (const k of [...this.madeJobs]) {
      const i = k.indexOf('/');
      if (!virtual[k]) this.madeJobs.delete(k);
      else if (!this.informers.jobs.get(k.slice(0, i), k.slice(i + 1))) {
        this.madeJobs.delete(k);
        this.driver.forgetJob(k.slice(0, i), k.slice(i + 1));
      }
    }
  }

  /** Each Job a CronJob's controller keeps stands in the API, owned by the CronJob; those it dropped go. */
  private async makeCronJobsJobs(): Promise<void> {
    const virtual = this.driver.state.virtualJobs;
    let adopted = false;
    for (const [k, j] of Object.entries(virtual)) {
      let job = this.informers.jobs.get(j.namespace, j.name);
      const cron = this.informers.cronjobs.get(j.namespace, j.cronJob);
      if (!job) {
        if (!cron || cron.metadata.deletionTimestamp) continue;
        const meta = isObj(j.template.metadata) ? j.template.metadata : {};
        const body: Obj = {
          apiVersion: 'batch/v1',
          kind: 'Job',
          metadata: {
            name: j.name,
            namespace: j.namespace,
            ...(isObj(meta.labels) ? { labels: meta.labels } : {}),
            annotations: { ...(isObj(meta.annotations) ? meta.annotations : {}), [SCHEDULED_ANNOTATION]: new Date(j.scheduledTime).toISOString() },
            ownerReferences: [{ apiVersion: 'batch/v1', kind: 'CronJob', name: j.cronJob, uid: cron.metadata.uid, controller: true, blockOwnerDeletion: true }],
          },
          spec: structuredClone(j.template.spec),
        };
        job = await this.write('jobs', () => this.o.client.create(RESOURCES.jobs, j.namespace, body));
        if (!job) continue;
        this.o.events?.record(cron, 'Normal', 'SuccessfulCreate', `Created job ${j.name}`);
      }
      this.madeJobs.add(k);
      if (job.metadata.uid && j.uid !== job.metadata.uid) {
        this.driver.adoptJobUid(j.namespace, j.name, job.metadata.uid);
        adopted = true;
      }
    }
    // Its pods are made on the next pass, under the Job's own uid (the selector the API gave it).
    if (adopted) this.retrySoon();
    // Jobs a CronJob's controller made and no longer keeps (history limits, Replace): gone, with their pods.
    for (const job of this.informers.jobs.list()) {
      if (controllerRef(job)?.kind !== 'CronJob' || job.metadata.deletionTimestamp || virtual[`${nsOf(job)}/${nameOf(job)}`]) continue;
      if ((job.metadata.annotations as Record<string, string> | undefined)?.[SCHEDULED_ANNOTATION] === undefined) continue; // not made here
      await this.remove('jobs', job);
    }
  }

  /**
   * Every Deployment's ReplicaSets: one per pod template among its desired
   * pods and its current template, sized to the pods the controllers want
   * of it, with increasing revisions; old empty ones beyond
   * revisionHistoryLimit go.
   */
  private async syncReplicaSets(read: Map<string, ApiObject>, pods: Pod[], now: number): Promise<void> {
    const counts = new Map<string, number>();
    const podsOf = new Map<string, ApiObject[]>();
    for (const p of pods) {
      const ref = p.metadata?.ownerReferences?.[0];
      if (ref?.kind !== 'ReplicaSet') continue;
      const k = `${p.metadata?.namespace ?? 'default'}/${ref.name}`;
      counts.set(k, (counts.get(k) ?? 0) + 1);
    }
    for (const p of this.informers.pods.list()) {
      const ref = controllerRef(p);
      if (ref?.kind !== 'ReplicaSet') continue;
      const k = `${nsOf(p)}/${String(ref.name)}`;
      podsOf.set(k, [...(podsOf.get(k) ?? []), p]);
    }
    const rsByOwner = new Map<string, ApiObject[]>();
    for (const rs of this.informers.replicasets.list()) {
      const ref = controllerRef(rs);
      if (ref?.kind !== 'Deployment') continue;
      const k = `${nsOf(rs)}/${String(ref.uid)}`;
      rsByOwner.set(k, [...(rsByOwner.get(k) ?? []), rs]);
    }
    for (const d of read.values()) {
      if (d.kind !== 'Deployment') continue;
      const ns = nsOf(d);
      const name = nameOf(d);
      const spec = (d.spec ?? {}) as Obj;
      const template = normalizedTemplate(spec.template) as Obj;
      const current = templateHash(template);
      const mine = new Map((rsByOwner.get(`${ns}/${d.metadata.uid}`) ?? []).map((rs) => [nameOf(rs), rs]));
      const wanted = new Set<string>([replicaSetName(name, current)]);
      for (const k of counts.keys()) if (k.startsWith(`${ns}/${name}-`)) wanted.add(k.slice(ns.length + 1));
      let maxRevision = Math.max(0, ...[...mine.values()].map(revisionOf));
      const replicas = Number(spec.replicas ?? 1);
      const surge = replicas + 1;
      // Every ReplicaSet it has (those it wants nothing of go down to 0) and those it wants pods of.
      for (const rsName of new Set([...mine.keys(), ...wanted])) {
        const want = counts.get(`${ns}/${rsName}`) ?? 0;
        const hash = rsName.slice(name.length + 1);
        let rs = mine.get(rsName);
        const isCurrent = hash === current;
        if (!rs) {
          const t = isCurrent ? template : this.templateFromPod(podsOf.get(`${ns}/${rsName}`)?.[0]);
          if (!t) continue;
          const revision = isCurrent ? maxRevision + 1 : 0;
          if (isCurrent) maxRevision = revision;
          rs = await this.write('replicasets', () => this.o.client.create(RESOURCES.replicasets, ns, this.replicaSetBody(d, rsName, hash, t, want, revision, replicas, surge)));
          if (rs) mine.set(rsName, rs);
          if (rs && want > 0) this.o.events?.record(d, 'Normal', 'ScalingReplicaSet', `Scaled up replica set ${rsName} from 0 to ${want}`);
          continue;
        }
        const annotations = { ...((rs.metadata.annotations as Record<string, string> | undefined) ?? {}) };
        let changed = false;
        if (isCurrent && revisionOf(rs) < maxRevision) {
          // Rolled back to an older template: it is the newest revision again.
          maxRevision += 1;
          annotations[REVISION_ANNOTATION] = String(maxRevision);
          changed = true;
        }
        if (annotations[DESIRED_REPLICAS_ANNOTATION] !== String(replicas)) {
          annotations[DESIRED_REPLICAS_ANNOTATION] = String(replicas);
          annotations[MAX_REPLICAS_ANNOTATION] = String(surge);
          changed = true;
        }
        const rsSpec = (rs.spec ?? {}) as Obj;
        if (rsSpec.replicas !== want || changed) {
          const got = await this.write('replicasets', () => this.o.client.update(RESOURCES.replicasets, ns, rsName, { ...rs!, metadata: { ...rs!.metadata, annotations }, spec: { ...rsSpec, replicas: want } }));
          if (got) mine.set(rsName, got);
          const before = Number(rsSpec.replicas ?? 0);
          if (got && before !== want) this.o.events?.record(d, 'Normal', 'ScalingReplicaSet', `Scaled ${want > before ? 'up' : 'down'} replica set ${rsName} from ${before} to ${want}`);
        }
      }
      await this.replicaSetStatuses(d, [...mine.values()], podsOf, now);
      await this.pruneHistory(d, [...mine.values()], wanted, podsOf);
      await this.deploymentRevision(d, mine.get(replicaSetName(name, current)));
    }
    // ReplicaSets whose Deployment is gone (or going) go too, with their pods.
    const live = new Set([...read.values()].filter((d) => d.kind === 'Deployment').map((d) => `${nsOf(d)}/${d.metadata.uid}`));
    for (const [k, list] of rsByOwner) {
      if (live.has(k)) continue;
      for (const rs of list) if (!rs.metadata.deletionTimestamp) await this.remove('replicasets', rs);
    }
  }

  private replicaSetBody(d: ApiObject, rsName: string, hash: string, template: Obj, replicas: number, revision: number, desired: number, surge: number): Obj {
    const spec = (d.spec ?? {}) as Obj;
    const selector = structuredClone(isObj(spec.selector) ? spec.selector : {});
    selector.matchLabels = { ...(isObj(selector.matchLabels) ? selector.matchLabels : {}), [POD_TEMPLATE_HASH_LABEL]: hash };
    const t = structuredClone(template);
    const meta = isObj(t.metadata) ? t.metadata : {};
    t.metadata = { ...meta, labels: { ...(isObj(meta.labels) ? meta.labels : {}), [POD_TEMPLATE_HASH_LABEL]: hash } };
    const annotations: Record<string, string> = {};
    for (const [k, v] of Object.entries((d.metadata.annotations as Record<string, string> | undefined) ?? {})) if (!NOT_COPIED.has(k)) annotations[k] = v;
    annotations[DESIRED_REPLICAS_ANNOTATION] = String(desired);
    annotations[MAX_REPLICAS_ANNOTATION] = String(surge);
    if (revision > 0) annotations[REVISION_ANNOTATION] = String(revision);
    return {
      apiVersion: 'apps/v1',
      kind: 'ReplicaSet',
      metadata: {
        name: rsName,
        namespace: nsOf(d),
        labels: { ...(isObj(meta.labels) ? meta.labels : {}), [POD_TEMPLATE_HASH_LABEL]: hash },
        annotations,
        ownerReferences: [{ apiVersion: 'apps/v1', kind: 'Deployment', name: nameOf(d), uid: d.metadata.uid, controller: true, blockOwnerDeletion: true }],
      },
      spec: { replicas, ...(spec.minReadySeconds !== undefined ? { minReadySeconds: spec.minReadySeconds } : {}), selector, template: t },
    };
  }

  /** The template of an old ReplicaSet that went missing, from one of its pods. */
  private templateFromPod(p: ApiObject | undefined): Obj | undefined {
    if (!p) return undefined;
    const { nodeName: _n, ...spec } = (p.spec ?? {}) as Obj;
    const labels = { ...((p.metadata.labels as Record<string, string> | undefined) ?? {}) };
    delete labels[POD_TEMPLATE_HASH_LABEL];
    return { metadata: { labels }, spec };
  }

  private async replicaSetStatuses(d: ApiObject, sets: ApiObject[], podsOf: Map<string, ApiObject[]>, now: number): Promise<void> {
    const minReady = Number(((d.spec ?? {}) as Obj).minReadySeconds ?? 0);
    for (const rs of sets) {
      const pods = (podsOf.get(`${nsOf(rs)}/${nameOf(rs)}`) ?? []).map((p) => p as unknown as Pod).filter((p) => !isTerminating(p) && !isFinished(p));
      const status: Obj = {
        replicas: pods.length,
        fullyLabeledReplicas: pods.length,
        readyReplicas: pods.filter(isReady).length,
        availableReplicas: pods.filter((p) => isAvailable(p, minReady, now)).length,
        observedGeneration: rs.metadata.generation ?? 1,
      };
      for (const k of ['readyReplicas', 'availableReplicas', 'fullyLabeledReplicas']) if (status[k] === 0) delete status[k];
      if (canonicalJson(rs.status ?? {}) === canonicalJson(status)) continue;
      await this.write('replicasets', () => this.o.client.update(RESOURCES.replicasets, nsOf(rs), nameOf(rs), { ...rs, status }, { status: true }));
    }
  }

  /** Old ReplicaSets with nothing left, beyond the Deployment's revisionHistoryLimit (oldest first), go. */
  private async pruneHistory(d: ApiObject, sets: ApiObject[], wanted: Set<string>, podsOf: Map<string, ApiObject[]>): Promise<void> {
    const limit = Number(((d.spec ?? {}) as Obj).revisionHistoryLimit ?? 10);
    const old = sets
      .filter((rs) => !wanted.has(nameOf(rs)) && !rs.metadata.deletionTimestamp && (podsOf.get(`${nsOf(rs)}/${nameOf(rs)}`) ?? []).length === 0)
      .sort((a, b) => revisionOf(a) - revisionOf(b));
    for (const rs of old.slice(0, Math.max(0, old.length - limit))) await this.remove('replicasets', rs);
  }

  /** The Deployment carries its newest ReplicaSet's revision, as upstream's controller writes it. */
  private async deploymentRevision(d: ApiObject, newest: ApiObject | undefined): Promise<void> {
    if (!newest) return;
    const revision = String(revisionOf(newest));
    const annotations = (d.metadata.annotations as Record<string, string> | undefined) ?? {};
    if (revision === '0' || annotations[REVISION_ANNOTATION] === revision) return;
    const k = `${nsOf(d)}/${nameOf(d)}`;
    // A file's Deployment says only what its file says.
    if (this.fileOwned.get(k) === d.metadata.resourceVersion) return;
    const got = await this.write('deployments', () => this.o.client.update(RESOURCES.deployments, nsOf(d), nameOf(d), { ...d, metadata: { ...d.metadata, annotations: { ...annotations, [REVISION_ANNOTATION]: revision } } }), () => this.fileOwned.set(k, d.metadata.resourceVersion ?? ''));
  }

  /** Pods to make (bound to the node, owned by their ReplicaSet, DaemonSet or Job) and pods to delete. */
  private async syncPods(desired: Map<string, Pod>, owned: Pod[]): Promise<void> {
    const ownerOf = (kind: string, ns: string, name: string): ApiObject | undefined => {
      const inf = kind === 'ReplicaSet' ? this.informers.replicasets : kind === 'DaemonSet' ? this.informers.daemonsets : kind === 'Job' ? this.informers.jobs : undefined;
      const o = inf?.get(ns, name);
      return o && !o.metadata.deletionTimestamp ? o : undefined;
    };
    const uidOf = (kind: string, ns: string, name: string): string | undefined => ownerOf(kind, ns, name)?.metadata.uid;
    let made = 0;
    for (const [k, p] of desired) {
      if (this.informers.pods.items.has(k)) continue;
      if (made >= POD_BURST) {
        this.retrySoon(); // the rest on the next pass
        break;
      }
      const ns = p.metadata?.namespace ?? 'default';
      const ref = p.metadata?.ownerReferences?.[0];
      const uid = ref ? uidOf(ref.kind, ns, ref.name) : undefined;
      // Its owner is not in the API yet (or a CronJob's Job whose uid the controller has not taken): next pass.
      if (!ref || !uid) continue;
      if (ref.kind === 'Job' && ref.uid !== uid) continue;
      const body = structuredClone(p) as unknown as Obj;
      const meta = body.metadata as Obj;
      meta.ownerReferences = [{ ...ref, uid, controller: true, blockOwnerDeletion: true }];
      // The first refusal (the store full, the namespace going) ends this pass's creations: the next pass tries again.
      if (!(await this.write('pods', () => this.o.client.create(RESOURCES.pods, ns, body)))) break;
      made++;
      const owner = ownerOf(ref.kind, ns, ref.name);
      if (owner) this.o.events?.record(owner, 'Normal', 'SuccessfulCreate', `Created pod: ${String(meta.name)}`);
    }
    for (const p of owned) {
      const ns = p.metadata?.namespace ?? 'default';
      const k = `${ns}/${p.metadata?.name ?? ''}`;
      if (desired.has(k) || isTerminating(p)) continue;
      if (!(await this.remove('pods', p as unknown as ApiObject))) continue;
      const ref = controllerRef(p as unknown as ApiObject);
      const owner = ref ? ownerOf(String(ref.kind), ns, String(ref.name)) : undefined;
      if (owner) this.o.events?.record(owner, 'Normal', 'SuccessfulDelete', `Deleted pod: ${p.metadata?.name ?? ''}`);
    }
  }

  private async writeStatuses(statuses: WorkloadStatus[], read: Map<string, ApiObject>): Promise<void> {
    for (const w of statuses) {
      const res = WORKLOAD_RESOURCE[w.kind];
      if (!res) continue;
      const current = this.informers[res].get(w.namespace, w.name);
      if (!current || current.metadata.deletionTimestamp) continue;
      if (w.deleted) {
        // ttlSecondsAfterFinished passed: the Job goes (a file's stays, as its file says).
        await this.remove(res, current);
        continue;
      }
      const status: Obj = { ...w.status };
      const seen = read.get(`${w.kind}/${w.namespace}/${w.name}`);
      if ((w.kind === 'Deployment' || w.kind === 'DaemonSet') && seen) status.observedGeneration = seen.metadata.generation ?? 1;
      if (canonicalJson(current.status ?? {}) === canonicalJson(status)) continue;
      const got = await this.write(res, () => this.o.client.update(RESOURCES[res], w.namespace, w.name, { ...current, status }, { status: true }));
      if (got && w.kind === 'Job') this.jobFinishedEvent(current, got);
    }
  }

  /** A Job that has just finished says so: Completed, or why it failed (BackoffLimitExceeded, DeadlineExceeded). */
  private jobFinishedEvent(before: ApiObject, after: ApiObject): void {
    const finished = (o: ApiObject) => (Array.isArray((o.status as Obj | undefined)?.conditions) ? ((o.status as Obj).conditions as Obj[]) : []).find((c) => (c.type === 'Complete' || c.type === 'Failed') && c.status === 'True');
    const now = finished(after);
    if (!now || finished(before)) return;
    if (now.type === 'Complete') this.o.events?.record(after, 'Normal', 'Completed', 'Job completed');
    else this.o.events?.record(after, 'Warning', String(now.reason ?? 'Failed'), String(now.message ?? 'Job failed'));
  }

  // ------------------------------------------------------------ StatefulSets, ReplicaSets of their own, revisions

  /** A ReplicaSet in the API that no Deployment controls: it runs its pods itself. */
  private isBareReplicaSet(ns: string, name: string): boolean {
    const rs = this.informers.replicasets.get(ns, name);
    return !!rs && controllerRef(rs)?.kind !== 'Deployment';
  }

  /** Pods by the uid of their controller. */
  private podsByController(): Map<string, Pod[]> {
    const out = new Map<string, Pod[]>();
    for (const p of this.informers.pods.list()) {
      const uid = controllerRef(p)?.uid;
      if (typeof uid !== 'string') continue;
      const list = out.get(uid);
      if (list) list.push(p as unknown as Pod);
      else out.set(uid, [p as unknown as Pod]);
    }
    return out;
  }

  /** ControllerRevisions by the uid of their controller. */
  private revisionsByController(): Map<string, ApiObject[]> {
    const out = new Map<string, ApiObject[]>();
    for (const r of this.informers.controllerrevisions.list()) {
      const uid = controllerRef(r)?.uid;
      if (typeof uid !== 'string' || r.metadata.deletionTimestamp) continue;
      out.set(uid, [...(out.get(uid) ?? []), r]);
    }
    return out;
  }

  /** Writes a history plan: the new revision (labelled as the owner's pods are), renumbered ones, pruned ones. */
  private async applyRevisionPlan(owner: ApiObject, plan: RevisionPlan, revisions: ApiObject[], template: Obj): Promise<void> {
    const ns = nsOf(owner);
    if (plan.create) {
      const meta = isObj(template.metadata) ? template.metadata : {};
      const body: Obj = {
        apiVersion: 'apps/v1',
        kind: 'ControllerRevision',
        metadata: {
          name: plan.create.name,
          namespace: ns,
          labels: { ...(isObj(meta.labels) ? meta.labels : {}), [CONTROLLER_REVISION_HASH]: plan.hash },
          ownerReferences: [{ apiVersion: owner.apiVersion, kind: owner.kind, name: nameOf(owner), uid: owner.metadata.uid, controller: true, blockOwnerDeletion: true }],
        },
        data: plan.create.data,
        revision: plan.create.revision,
      };
      await this.write('controllerrevisions', () => this.o.client.create(RESOURCES.controllerrevisions, ns, body));
    }
    for (const r of plan.renumber) {
      const cur = revisions.find((x) => nameOf(x) === r.name);
      if (cur) await this.write('controllerrevisions', () => this.o.client.update(RESOURCES.controllerrevisions, ns, r.name, { ...cur, revision: r.revision }));
    }
    for (const name of plan.prune) {
      const cur = revisions.find((x) => nameOf(x) === name);
      if (cur) await this.remove('controllerrevisions', cur);
    }
  }

  private static revisionsOf(list: ApiObject[]): Array<{ name: string; revision: number; data: unknown }> {
    return list.map((r) => ({ name: nameOf(r), revision: typeof r.revision === 'number' ? r.revision : 0, data: r.data }));
  }

  /** Every DaemonSet keeps its templates as ControllerRevisions `<ds>-<hash>` (the hash its pods are labelled with). */
  private async syncDaemonSetRevisions(read: Map<string, ApiObject>): Promise<void> {
    const byOwner = this.revisionsByController();
    const pods = this.podsByController();
    for (const ds of read.values()) {
      if (ds.kind !== 'DaemonSet' || !ds.metadata.uid) continue;
      const spec = (ds.spec ?? {}) as Obj;
      const template = normalizedTemplate(spec.template) as Obj;
      const mine = byOwner.get(ds.metadata.uid) ?? [];
      const inUse = new Set<string>();
      for (const p of pods.get(ds.metadata.uid) ?? []) {
        const h = p.metadata?.labels?.[CONTROLLER_REVISION_HASH];
        if (h) inUse.add(`${nameOf(ds)}-${h}`);
      }
      const limit = typeof spec.revisionHistoryLimit === 'number' ? spec.revisionHistoryLimit : 10;
      const plan = planRevisions(nameOf(ds), template, ControllerManager.revisionsOf(mine).map((r) => ({ name: r.name, revision: r.revision, template: {} })), limit, inUse);
      await this.applyRevisionPlan(ds, plan, mine, template);
    }
  }

  /** The claims of a namespace (name → owner references), when the API serves claims. */
  private claimsIn(ns: string): Map<string, OwnerRef[]> | undefined {
    if (!this.claimsServed) return undefined;
    const out = new Map<string, OwnerRef[]>();
    for (const c of this.informers.pvcs.list()) {
      if (nsOf(c) !== ns || c.metadata.deletionTimestamp) continue;
      out.set(nameOf(c), ((c.metadata.ownerReferences ?? []) as unknown as OwnerRef[]).map((r) => ({ ...r })));
    }
    return out;
  }

  /** One step of each StatefulSet: its history, its claims, its pods in order, its status. */
  private async syncStatefulSets(now: number, budget: { pods: number }): Promise<void> {
    const byOwner = this.revisionsByController();
    const pods = this.podsByController();
    for (const set of this.informers.statefulsets.list()) {
      if (set.metadata.deletionTimestamp || !set.metadata.uid) continue;
      const ns = nsOf(set);
      const stored = this.stored(set);
      const spec = (stored.object as Obj).spec as Obj;
      const mine = byOwner.get(set.metadata.uid) ?? [];
      const out = reconcileStatefulSet({
        set: { metadata: { name: nameOf(set), namespace: ns, uid: set.metadata.uid, generation: set.metadata.generation ?? 1 }, spec, status: isObj(set.status) ? set.status : {} },
        pods: pods.get(set.metadata.uid) ?? [],
        revisions: ControllerManager.revisionsOf(mine),
        claims: this.claimsIn(ns),
        nodeName: this.o.nodeName,
        now,
        burst: Math.max(0, Math.min(CREATE_BURST, budget.pods)),
      });
      await this.applyRevisionPlan(set, out.revisions, mine, isObj(spec.template) ? spec.template : {});
      let claimsMade = true;
      for (const c of out.createClaims) if (!(await this.write('pvcs', () => this.o.client.create(RESOURCES.pvcs, ns, c)))) claimsMade = false;
      for (const c of out.claimOwners) {
        const cur = this.informers.pvcs.get(ns, c.name);
        if (cur) await this.write('pvcs', () => this.o.client.update(RESOURCES.pvcs, ns, c.name, { ...cur, metadata: { ...cur.metadata, ownerReferences: c.ownerReferences as unknown as Obj[] } }));
      }
      // A pod never starts without its claims: a claim refused now means the pods wait for the next pass.
      for (const p of claimsMade ? out.createPods : []) {
        if (budget.pods <= 0) break;
        if (!(await this.write('pods', () => this.o.client.create(RESOURCES.pods, ns, p as unknown as Obj)))) break;
        budget.pods--;
        this.o.events?.record(set, 'Normal', 'SuccessfulCreate', `create Pod ${p.metadata?.name ?? ''} in StatefulSet ${nameOf(set)} successful`);
      }
      if (out.createPods.length > 0 && budget.pods <= 0) this.retrySoon();
      for (const p of out.deletePods) {
        if (await this.remove('pods', p as unknown as ApiObject)) this.o.events?.record(set, 'Normal', 'SuccessfulDelete', `delete Pod ${p.metadata?.name ?? ''} in StatefulSet ${nameOf(set)} successful`);
      }
      if (out.requeueAt !== undefined) this.wakeAt(out.requeueAt, now);
      await this.writeStatus('statefulsets', set, out.status);
    }
  }

  /** ReplicaSets no Deployment owns, and ReplicationControllers: the ReplicaSet controller's pods and status. */
  private async syncReplicaSetsOfTheirOwn(now: number, budget: { pods: number }): Promise<void> {
    const pods = this.podsByController();
    const taken = new Set(this.informers.pods.items.keys());
    const owners: Array<[Res, ApiObject]> = [
      ...this.informers.replicasets.list().filter((rs) => controllerRef(rs)?.kind !== 'Deployment').map((rs): [Res, ApiObject] => ['replicasets', rs]),
      ...this.informers.replicationcontrollers.list().map((rc): [Res, ApiObject] => ['replicationcontrollers', rc]),
    ];
    for (const [res, o] of owners) {
      if (o.metadata.deletionTimestamp || !o.metadata.uid) continue;
      const ns = nsOf(o);
      const spec = (this.stored(o).object as Obj).spec as Obj;
      const out = reconcileReplicaSet({
        owner: { apiVersion: o.apiVersion, kind: o.kind as 'ReplicaSet' | 'ReplicationController', name: nameOf(o), namespace: ns, uid: o.metadata.uid, generation: o.metadata.generation ?? 1 },
        spec,
        pods: pods.get(o.metadata.uid) ?? [],
        nodeName: this.o.nodeName,
        now,
        random: this.o.random ?? Math.random,
        taken,
        burst: Math.max(0, Math.min(CREATE_BURST, budget.pods)),
      });
      for (const p of out.createPods) {
        if (!(await this.write('pods', () => this.o.client.create(RESOURCES.pods, ns, p as unknown as Obj)))) break;
        budget.pods--;
        this.o.events?.record(o, 'Normal', 'SuccessfulCreate', `Created pod: ${p.metadata?.name ?? ''}`);
      }
      if (out.more) this.retrySoon();
      for (const p of out.deletePods) {
        if (await this.remove('pods', p as unknown as ApiObject)) this.o.events?.record(o, 'Normal', 'SuccessfulDelete', `Deleted pod: ${p.metadata?.name ?? ''}`);
      }
      if (out.requeueAt !== undefined) this.wakeAt(out.requeueAt, now);
      await this.writeStatus(res, o, out.status);
    }
  }

  private async writeStatus(res: Res, o: ApiObject, status: Obj): Promise<void> {
    const current = this.informers[res].get(nsOf(o), nameOf(o)) ?? o;
    if (canonicalJson(current.status ?? {}) === canonicalJson(status)) return;
    await this.write(res, () => this.o.client.update(RESOURCES[res], nsOf(o), nameOf(o), { ...current, status }, { status: true }));
  }

  /** A pass at `at` (a pod becoming available after minReadySeconds). */
  private wakeAt(at: number, now: number): void {
    if (this.wakeTimer && this.wakeAtMs !== undefined && this.wakeAtMs <= at) return;
    if (this.wakeTimer) clearTimeout(this.wakeTimer);
    this.wakeAtMs = at;
    this.wakeTimer = setTimeout(() => {
      this.wakeTimer = undefined;
      this.wakeAtMs = undefined;
      this.schedule();
    }, Math.max(0, at - now) + 5);
    this.wakeTimer.unref();
  }

  // ------------------------------------------------------------ writes

  /**
   * One write; its answer goes into the local copy at once. A lost race
   * (Conflict, AlreadyExists, NotFound) is looked at again on a pass soon;
   * anything else is logged.
   */
  private async write(res: Res, fn: () => Promise<ApiObject>, onFileOwned?: () => void): Promise<ApiObject | undefined> {
    if (this.stopped) return undefined;
    try {
      const got = await fn();
      this.writes++;
      this.informers[res].wrote(got);
      return got;
    } catch (err) {
      if (err instanceof ApiError && err.reason === 'Conflict' && / is defined by /.test(err.message)) onFileOwned?.();
      else if (err instanceof ApiError && (err.reason === 'Conflict' || err.reason === 'AlreadyExists' || err.reason === 'NotFound')) this.retrySoon();
      else this.refused.note({ resource: RESOURCES[res], error: errorMessage(err) });
      return undefined;
    }
  }

  /** Deleted (gracefully, for pods); one that is the manifest files' is left as its file says. Whether it was. */
  private async remove(res: Res, o: ApiObject): Promise<boolean> {
    if (this.stopped) return false;
    try {
      const r = await this.o.client.delete(RESOURCES[res], nsOf(o), nameOf(o), { uid: o.metadata.uid });
      this.writes++;
      if (r.removed) this.informers[res].removed(r.object);
      else this.informers[res].wrote(r.object);
      return true;
    } catch (err) {
      if (err instanceof ApiError && (err.reason === 'NotFound' || err.reason === 'Conflict')) return false;
      this.o.log.debug('the workload controllers could not delete an object', { resource: RESOURCES[res], name: nameOf(o), error: errorMessage(err) });
      return false;
    }
  }

  private save(): void {
    if (!this.state) return;
    const text = JSON.stringify(this.driver.state);
    if (text === this.lastSaved) return;
    this.lastSaved = text;
    this.state.write(text).catch((err) => this.o.log.warn('could not save the controllers\' state', { error: errorMessage(err) }));
  }
}
