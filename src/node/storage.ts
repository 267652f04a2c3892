/**
 * Storage on one node, over the ApiClient: the PV controller, the PVC and
 * PV protection controllers, the ephemeral volume controller, and a local
 * provisioner (k3s's local-path, built in) whose volumes are directories
 * `<root>/volumes/<pv>` of this node.
 *
 * - A default StorageClass `local-path` (WaitForFirstConsumer, reclaim
 *   Delete) is made at start when there is none by that name.
 * - A claim binds to the best static PV that fits (storage-binding.ts);
 *   with none, a claim of one of our classes is provisioned: at once for
 *   Immediate binding, once a pod on this node uses it for
 *   WaitForFirstConsumer. A claim of another provisioner's class waits.
 * - A released volume of ours with reclaim Delete loses its directory and
 *   then its PV; Retain leaves it Released with its data.
 * - A claim being deleted keeps kubernetes.io/pvc-protection while a pod
 *   uses it; a PV keeps kubernetes.io/pv-protection while Bound.
 * - A pod's ephemeral volume gets its claim `<pod>-<volume>`, owned by the
 *   pod, so the garbage collector deletes it with the pod.
 *
 * Level-triggered: each sync reads every claim, volume, class and pod and
 * converges, so a crash between two writes is finished by the next sync.
 */
import fs from 'node:fs/promises';
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import { claimClass, DEFAULT_CLASS_ANNOTATION, specOf, statusOf } from '../api/kinds/volume-common.js';
import { defaultClassName } from '../api/kinds/pvc.js';
import { timestamp } from '../api/store.js';
import type { ApiObject, Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { LevelLoop } from './level-loop.js';
import { bestVolume, podClaims, podHoldsVolumes, requestOf, volumePhase } from './storage-binding.js';
import { makeVolumeDir, removeVolumeDir, volumeDirName, volumePath } from './volume-dirs.js';

export const PROVISIONER = 'skiff.io/local-path';
export const DEFAULT_CLASS = 'local-path';
export const PVC_PROTECTION = 'kubernetes.io/pvc-protection';
export const PV_PROTECTION = 'kubernetes.io/pv-protection';
const PVCS = 'persistentvolumeclaims';
const PVS = 'persistentvolumes';
const CLASSES = 'storageclasses.storage.k8s.io';
const PROVISIONED_BY = 'pv.kubernetes.io/provisioned-by';
const BIND_COMPLETED = 'pv.kubernetes.io/bind-completed';
const BOUND_BY_CONTROLLER = 'pv.kubernetes.io/bound-by-controller';
const SELECTED_NODE = 'volume.kubernetes.io/selected-node';
const STORAGE_PROVISIONER = 'volume.kubernetes.io/storage-provisioner';
/** An event repeated no more often than this, as the recorder's aggregation keeps them few. */
const EVENT_REPEAT_MS = 15_000;
const MAX_EVENT_KEYS = 1000;

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const nsName = (o: ApiObject) => `${o.metadata.namespace ?? ''}/${o.metadata.name ?? ''}`;

export interface StorageControllerOptions {
  client: ApiClient;
  nodeName: string;
  /** The node's root dir: volumes are made in <rootDir>/volumes. */
  rootDir: string;
  log: Logger;
  now?: () => number;
  everyMs?: number;
  /** The bytes the volumes' filesystem holds in all (default: statfs of <rootDir>); a claim for more is refused. */
  capacity?: () => Promise<number>;
}

export class StorageController {
  private readonly loop: LevelLoop;
  private readonly now: () => number;
  /** claim uid + reason + message → when last written and the event's name and count. */
  private readonly events = new Map<string, { at: number; name: string; count: number; first: string }>();

  constructor(private readonly o: StorageControllerOptions) {
    this.now = o.now ?? Date.now;
    this.loop = new LevelLoop({
      client: o.client,
      resources: [PVCS, PVS, CLASSES, 'pods'],
      sync: () => this.sync(),
      log: o.log,
      name: 'the storage controller',
      everyMs: o.everyMs ?? 10_000,
    });
  }

  async start(): Promise<void> {
    await this.ensureDefaultClass();
    await this.loop.start();
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }

  /** Resolves once the syncs due have run (tests). */
  idle(): Promise<void> {
    return this.loop.idle();
  }

  private async ensureDefaultClass(): Promise<void> {
    const sc = {
      apiVersion: 'storage.k8s.io/v1',
      kind: 'StorageClass',
      metadata: { name: DEFAULT_CLASS, annotations: { [DEFAULT_CLASS_ANNOTATION]: 'true' } },
      provisioner: PROVISIONER,
      reclaimPolicy: 'Delete',
      volumeBindingMode: 'WaitForFirstConsumer',
    };
    await this.o.client.create(CLASSES, '', sc).catch((err: unknown) => {
      if (!(err instanceof ApiError && err.reason === 'AlreadyExists')) throw err;
    });
  }

  async sync(): Promise<void> {
    const { client } = this.o;
    const [claims, pvs, classes, pods] = await Promise.all([PVCS, PVS, CLASSES, 'pods'].map(async (r) => (await client.list(r)).items));
    const node = await client.get('nodes', '', this.o.nodeName).catch(() => undefined);
    const nodeLabels = { 'kubernetes.io/hostname': this.o.nodeName, ...(node?.metadata.labels ?? {}) };
    const classOf = new Map(classes!.map((c) => [String(c.metadata.name), c]));
    const claimOf = new Map(claims!.map((c) => [nsName(c), c]));

    await this.ephemeralClaims(pods!, claimOf);
    // Pods that hold their claims, and those of them on this node (the consumers WaitForFirstConsumer waits for).
    const used = new Set<string>();
    const consumed = new Set<string>();
    for (const p of pods!) {
      if (!podHoldsVolumes(p)) continue;
      for (const c of podClaims(p)) {
        const k = `${p.metadata.namespace ?? ''}/${c.claim}`;
        used.add(k);
        if (specOf(p).nodeName === this.o.nodeName && !p.metadata.deletionTimestamp) consumed.add(k);
      }
    }

    const defaultName = defaultClassName(classes!);
    for (const claim of claims!) {
      await this.syncClaim(claim, { pvs: pvs!, classOf, defaultName, nodeLabels, used: used.has(nsName(claim)), consumed: consumed.has(nsName(claim)) }).catch((err) => this.retryLater(err, 'claim', nsName(claim)));
    }
    // Volumes after claims: a claim deleted just now has released its volume.
    const fresh = (await client.list(PVCS)).items;
    const live = new Map(fresh.map((c) => [nsName(c), c]));
    for (const pv of (await client.list(PVS)).items) {
      await this.syncVolume(pv, live).catch((err) => this.retryLater(err, 'volume', String(pv.metadata.name)));
    }
  }

  private retryLater(err: unknown, what: string, name: string): void {
    // Changed meanwhile: looked at again soon. (A manifest file's claim is refused for good: not retried at once.)
    if (err instanceof ApiError && (err.reason === 'Conflict' || err.reason === 'NotFound') && !err.message.includes(' is defined by ')) {
      this.loop.kick(100);
      return;
    }
    this.o.log.warn(`the storage controller could not sync a ${what}`, { [what]: name, error: errorMessage(err) });
  }

  // ------------------------------------------------------------ ephemeral volumes

  private async ephemeralClaims(pods: ApiObject[], claimOf: Map<string, ApiObject>): Promise<void> {
    for (const pod of pods) {
      if (pod.metadata.deletionTimestamp || !podHoldsVolumes(pod)) continue;
      for (const v of (Array.isArray(specOf(pod).volumes) ? (specOf(pod).volumes as unknown[]) : []).filter(isObj)) {
        if (!isObj(v.ephemeral)) continue;
        const ns = pod.metadata.namespace ?? 'default';
        const name = `${String(pod.metadata.name)}-${String(v.name)}`;
        const existing = claimOf.get(`${ns}/${name}`);
        if (existing) {
          if (!(existing.metadata.ownerReferences ?? []).some((r) => r.uid === pod.metadata.uid)) {
            await this.event(pod, 'Warning', 'FailedBinding', `PVC ${ns}/${name} was not created for pod ${ns}/${String(pod.metadata.name)} (pod is not owner)`);
          }
          continue;
        }
        const t = isObj(v.ephemeral.volumeClaimTemplate) ? v.ephemeral.volumeClaimTemplate : {};
        const meta = isObj(t.metadata) ? t.metadata : {};
        const claim = {
          apiVersion: 'v1',
          kind: 'PersistentVolumeClaim',
          metadata: {
            ...(isObj(meta.labels) ? { labels: meta.labels } : {}),
            ...(isObj(meta.annotations) ? { annotations: meta.annotations } : {}),
            name,
            namespace: ns,
            ownerReferences: [{ apiVersion: 'v1', kind: 'Pod', name: String(pod.metadata.name), uid: pod.metadata.uid, controller: true, blockOwnerDeletion: true }],
          },
          spec: isObj(t.spec) ? t.spec : {},
        };
        try {
          const made = await this.o.client.create(PVCS, ns, claim);
          claimOf.set(`${ns}/${name}`, made);
        } catch (err) {
          if (err instanceof ApiError && err.reason === 'AlreadyExists') continue;
          await this.event(pod, 'Warning', 'FailedCreate', `could not create the claim ${name} for ephemeral volume ${String(v.name)}: ${errorMessage(err)}`);
        }
      }
    }
  }

  // ------------------------------------------------------------ claims

  private async syncClaim(
    claim: ApiObject,
    ctx: { pvs: ApiObject[]; classOf: Map<string, ApiObject>; defaultName: string | undefined; nodeLabels: Record<string, string>; used: boolean; consumed: boolean },
  ): Promise<void> {
    const ns = claim.metadata.namespace ?? 'default';
    const name = String(claim.metadata.name);
    if (claim.metadata.deletionTimestamp) {
      // pvc-protection: the claim goes once no pod holds it.
      if ((claim.metadata.finalizers ?? []).includes(PVC_PROTECTION) && !ctx.used) {
        await this.o.client.update(PVCS, ns, name, { ...claim, metadata: { ...claim.metadata, finalizers: (claim.metadata.finalizers ?? []).filter((f) => f !== PVC_PROTECTION) } });
      }
      return;
    }
    const s = specOf(claim);
    const volumeName = typeof s.volumeName === 'string' ? s.volumeName : '';
    const bound = volumeName !== '' && claim.metadata.annotations?.[BIND_COMPLETED] === 'yes';
    if (bound) {
      const pv = ctx.pvs.find((p) => p.metadata.name === volumeName);
      if (!pv || (isObj(specOf(pv).claimRef) && (specOf(pv).claimRef as Obj).uid !== claim.metadata.uid)) {
        await this.claimStatus(claim, { phase: 'Lost' });
        await this.event(claim, 'Warning', 'ClaimLost', 'Bound claim has lost its PersistentVolume. Data on the volume is lost!');
        return;
      }
      await this.bind(pv, claim);
      return;
    }
    // A claim with no class at all gets the default one, retroactively, as the PV controller gives it.
    if ((s.storageClassName === undefined || s.storageClassName === null) && claim.metadata.annotations?.['volume.beta.kubernetes.io/storage-class'] === undefined && ctx.defaultName) {
      await this.o.client.update(PVCS, ns, name, { ...claim, spec: { ...s, storageClassName: ctx.defaultName } });
      return;
    }
    const cls = claimClass(claim);
    const sc = cls === '' ? undefined : ctx.classOf.get(cls);
    const waits = sc?.volumeBindingMode === 'WaitForFirstConsumer' && !ctx.consumed;
    const pv = bestVolume(claim, ctx.pvs, ctx.nodeLabels);
    if (pv && !waits) {
      await this.bind(pv, claim);
      return;
    }
    if (volumeName !== '') {
      await this.event(claim, 'Warning', 'FailedBinding', `volume "${volumeName}" is not available or does not fit this claim`);
      return;
    }
    if (cls === '') {
      await this.event(claim, 'Normal', 'FailedBinding', 'no persistent volumes available for this claim and no storage class is set');
      return;
    }
    if (!sc) {
      await this.event(claim, 'Warning', 'ProvisioningFailed', `storageclass.storage.k8s.io "${cls}" not found`);
      return;
    }
    if (waits) {
      await this.event(claim, 'Normal', 'WaitForFirstConsumer', 'waiting for first consumer to be created before binding');
      return;
    }
    if (sc.provisioner !== PROVISIONER) {
      await this.event(claim, 'Normal', 'ExternalProvisioning', `Waiting for a volume to be created either by the external provisioner '${String(sc.provisioner)}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.`);
      return;
    }
    await this.provision(claim, sc);
  }

  private async provision(claim: ApiObject, sc: ApiObject): Promise<void> {
    const ns = claim.metadata.namespace ?? 'default';
    const s = specOf(claim);
    const pvName = `pvc-${String(claim.metadata.uid)}`;
    const fail = (message: string) => this.event(claim, 'Warning', 'ProvisioningFailed', `failed to provision volume with StorageClass "${String(sc.metadata.name)}": ${message}`);
    if (s.volumeMode === 'Block') return void (await fail('only Filesystem volumes can be provisioned here (volumeMode Block is not supported by local-path)'));
    if (isObj(s.dataSource) || isObj(s.dataSourceRef)) return void (await fail('a dataSource (cloning, snapshots, populators) is not supported by local-path'));
    // local-path itself never looks at the size; here a request beyond what the disk holds at all is refused
    // (the claim stays Pending, as a provisioner that cannot make the volume leaves it).
    const want = requestOf(claim);
    const have = await (this.o.capacity ?? (() => filesystemBytes(this.o.rootDir)))();
    if (want > have) return void (await fail(`requested ${String((s.resources as Obj | undefined)?.requests ? ((s.resources as Obj).requests as Obj).storage : want)} but the node's volume filesystem holds ${have} bytes in all`));
    await this.o.client.patch(PVCS, ns, String(claim.metadata.name), 'merge', { metadata: { annotations: { [SELECTED_NODE]: this.o.nodeName, [STORAGE_PROVISIONER]: PROVISIONER, 'volume.beta.kubernetes.io/storage-provisioner': PROVISIONER } } }).catch(() => undefined);
    await this.event(claim, 'Normal', 'Provisioning', `External provisioner is provisioning volume for claim "${ns}/${String(claim.metadata.name)}"`);
    let path: string;
    try {
      path = await makeVolumeDir(this.o.rootDir, pvName);
    } catch (err) {
      return void (await fail(`could not make its directory: ${errorMessage(err)}`));
    }
    const request = isObj(s.resources) && isObj(s.resources.requests) ? s.resources.requests.storage : undefined;
    const pv = {
      apiVersion: 'v1',
      kind: 'PersistentVolume',
      metadata: { name: pvName, annotations: { [PROVISIONED_BY]: PROVISIONER, 'local.path.provisioner/selected-node': this.o.nodeName } },
      spec: {
        capacity: { storage: request },
        accessModes: s.accessModes,
        persistentVolumeReclaimPolicy: sc.reclaimPolicy ?? 'Delete',
        storageClassName: sc.metadata.name,
        volumeMode: 'Filesystem',
        hostPath: { path, type: 'DirectoryOrCreate' },
        nodeAffinity: { required: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: [this.o.nodeName] }] }] } },
        claimRef: { apiVersion: 'v1', kind: 'PersistentVolumeClaim', namespace: ns, name: claim.metadata.name, uid: claim.metadata.uid, resourceVersion: claim.metadata.resourceVersion },
      },
    };
    let made: ApiObject;
    try {
      made = await this.o.client.create(PVS, '', pv);
    } catch (err) {
      if (!(err instanceof ApiError && err.reason === 'AlreadyExists')) return void (await fail(errorMessage(err)));
      made = await this.o.client.get(PVS, '', pvName);
    }
    await this.event(claim, 'Normal', 'ProvisioningSucceeded', `Successfully provisioned volume ${pvName}`);
    await this.bind(made, claim);
  }

  /** Both halves of a binding, each written only where it is not yet so (pv.Spec.ClaimRef, then the claim). */
  private async bind(pv: ApiObject, claim: ApiObject): Promise<void> {
    const { client } = this.o;
    const ns = claim.metadata.namespace ?? 'default';
    const name = String(claim.metadata.name);
    const pvName = String(pv.metadata.name);
    const ref = specOf(pv).claimRef;
    if (!isObj(ref) || ref.uid !== claim.metadata.uid) {
      const claimRef = { apiVersion: 'v1', kind: 'PersistentVolumeClaim', namespace: ns, name, uid: claim.metadata.uid, resourceVersion: claim.metadata.resourceVersion };
      const annotations = isObj(ref) ? pv.metadata.annotations : { ...(pv.metadata.annotations ?? {}), [BOUND_BY_CONTROLLER]: 'yes' };
      pv = await client.update(PVS, '', pvName, { ...pv, metadata: { ...pv.metadata, ...(annotations ? { annotations } : {}) }, spec: { ...specOf(pv), claimRef } });
    }
    if (statusOf(pv).phase !== 'Bound') pv = await client.update(PVS, '', pvName, { ...pv, status: { ...statusOf(pv), phase: 'Bound' } }, { status: true });
    const s = specOf(claim);
    if (s.volumeName !== pvName || claim.metadata.annotations?.[BIND_COMPLETED] !== 'yes') {
      const annotations: Record<string, string> = { ...(claim.metadata.annotations ?? {}), [BIND_COMPLETED]: 'yes' };
      if (s.volumeName !== pvName) annotations[BOUND_BY_CONTROLLER] = 'yes';
      claim = await client.update(PVCS, ns, name, { ...claim, metadata: { ...claim.metadata, annotations }, spec: { ...s, volumeName: pvName } });
    }
    await this.claimStatus(claim, { phase: 'Bound', accessModes: specOf(pv).accessModes, capacity: specOf(pv).capacity });
  }

  private async claimStatus(claim: ApiObject, status: Obj): Promise<void> {
    const next = { ...statusOf(claim), ...status };
    if (JSON.stringify(next) === JSON.stringify(statusOf(claim))) return;
    await this.o.client.update(PVCS, claim.metadata.namespace ?? 'default', String(claim.metadata.name), { ...claim, status: next }, { status: true });
  }

  // ------------------------------------------------------------ volumes

  private async syncVolume(pv: ApiObject, claims: Map<string, ApiObject>): Promise<void> {
    const { client } = this.o;
    const name = String(pv.metadata.name);
    const ref = specOf(pv).claimRef;
    const claim = isObj(ref) ? claims.get(`${String(ref.namespace ?? '')}/${String(ref.name ?? '')}`) : undefined;
    if (pv.metadata.deletionTimestamp) {
      // pv-protection: the volume goes once it is bound to no claim.
      if ((pv.metadata.finalizers ?? []).includes(PV_PROTECTION) && volumePhase(pv, claim) !== 'Bound') {
        await client.update(PVS, '', name, { ...pv, metadata: { ...pv.metadata, finalizers: (pv.metadata.finalizers ?? []).filter((f) => f !== PV_PROTECTION) } });
      }
      return;
    }
    const phase = volumePhase(pv, claim);
    if (phase !== statusOf(pv).phase) {
      pv = await client.update(PVS, '', name, { ...pv, status: { ...statusOf(pv), phase, ...(phase === 'Released' || phase === 'Available' ? { message: undefined, reason: undefined } : {}) } }, { status: true });
    }
    if (phase !== 'Released' || specOf(pv).persistentVolumeReclaimPolicy !== 'Delete') return;
    // Reclaim Delete: only a volume this provisioner made, and only its own directory, named by the PV's name.
    const ours = pv.metadata.annotations?.[PROVISIONED_BY] === PROVISIONER;
    const hostPath = isObj(specOf(pv).hostPath) ? (specOf(pv).hostPath as Obj).path : undefined;
    let own: string | undefined;
    try {
      own = volumePath(this.o.rootDir, volumeDirName(name));
    } catch {
      own = undefined;
    }
    if (!ours || !own || hostPath !== own) {
      const message = ours ? `the volume's path ${String(hostPath)} is not its directory ${String(own)}: not deleted` : 'error getting deleter volume plugin for volume: no deletable volume plugin matched (only volumes the local-path provisioner made are deleted)';
      await client.update(PVS, '', name, { ...pv, status: { ...statusOf(pv), phase: 'Failed', message } }, { status: true });
      await this.event(pv, 'Warning', 'VolumeFailedDelete', message);
      return;
    }
    try {
      await removeVolumeDir(this.o.rootDir, name);
    } catch (err) {
      await this.event(pv, 'Warning', 'VolumeFailedDelete', `could not remove ${own}: ${errorMessage(err)}`);
      return;
    }
    await client.delete(PVS, '', name).catch((err: unknown) => {
      if (!(err instanceof ApiError && err.reason === 'NotFound')) throw err;
    });
  }

  // ------------------------------------------------------------ events

  /** An event on the object, as the controllers' recorder writes it: repeats counted, at most every EVENT_REPEAT_MS. */
  private async event(o: ApiObject, type: 'Normal' | 'Warning', reason: string, message: string): Promise<void> {
    const k = `${String(o.metadata.uid)}\0${reason}\0${message}`;
    const now = this.now();
    const had = this.events.get(k);
    if (had && now - had.at < EVENT_REPEAT_MS) return;
    const ns = o.metadata.namespace ?? 'default';
    const involvedObject = { apiVersion: o.apiVersion, kind: o.kind, name: o.metadata.name, uid: o.metadata.uid, resourceVersion: o.metadata.resourceVersion, ...(o.metadata.namespace ? { namespace: ns } : {}) };
    const stamp = timestamp(now);
    const name = had?.name ?? `${String(o.metadata.name)}.${(now * 1000 + Math.floor(Math.random() * 1000)).toString(16)}`;
    const count = (had?.count ?? 0) + 1;
    const first = had?.first ?? stamp;
    const body = { apiVersion: 'v1', kind: 'Event', metadata: { name, namespace: ns }, involvedObject, reason, message, type, count, firstTimestamp: first, lastTimestamp: stamp, source: { component: 'persistentvolume-controller' }, reportingComponent: 'persistentvolume-controller', reportingInstance: '' };
    this.events.delete(k);
    this.events.set(k, { at: now, name, count, first });
    while (this.events.size > MAX_EVENT_KEYS) this.events.delete(this.events.keys().next().value as string);
    try {
      if (had) {
        const cur = await this.o.client.get('events', ns, name).catch(() => undefined);
        if (cur) {
          await this.o.client.update('events', ns, name, { ...body, metadata: cur.metadata });
          return;
        }
      }
      await this.o.client.create('events', ns, body);
    } catch (err) {
      this.o.log.debug('the storage controller could not write an event', { reason, error: errorMessage(err) });
    }
  }
}

/** The bytes the filesystem holding <rootDir> has in all. */
async function filesystemBytes(rootDir: string): Promise<number> {
  await fs.mkdir(rootDir, { recursive: true, mode: 0o700 });
  const s = await fs.statfs(rootDir);
  return s.blocks * s.bsize;
}

