import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_EVICTION_HARD,
  EvictionManager,
  formatBytes,
  localStorageViolation,
  parseDuration,
  parseEvictionConfig,
  rankPods,
  type EvictionStats,
  type Observations,
  type PodUsage,
} from '../../src/kubelet-lite/eviction.js';
import { diskUsage, workingSetV1 } from '../../src/kubelet-lite/node-signals.js';
import { createLogger } from '../../src/log.js';

const Mi = 1024 * 1024;
const Gi = 1024 * Mi;
const log = createLogger('error');

function pod(name: string, opts: { memReq?: string; memLim?: string; cpu?: string; priority?: number; volumes?: Pod['spec'] extends infer S ? S extends { volumes?: infer V } ? V : never : never; eph?: string; annotations?: Record<string, string> } = {}): Pod {
  const requests: Record<string, string> = {};
  const limits: Record<string, string> = {};
  if (opts.memReq) requests.memory = opts.memReq;
  if (opts.memLim) limits.memory = opts.memLim;
  if (opts.cpu) limits.cpu = requests.cpu = opts.cpu;
  if (opts.eph) limits['ephemeral-storage'] = opts.eph;
  return {
    metadata: { name, namespace: 'default', uid: `uid-${name}`, ...(opts.annotations ? { annotations: opts.annotations } : {}) },
    spec: {
      containers: [{ name: 'c', image: 'x', resources: { requests, limits } }],
      ...(opts.priority !== undefined ? { priority: opts.priority } : {}),
      ...(opts.volumes ? { volumes: opts.volumes } : {}),
    },
  };
}

const usage = (memory: number, extra: Partial<PodUsage> = {}): PodUsage => ({ memory, containers: [{ name: 'c', memory }], emptyDirs: new Map(), ...extra });

class Harness {
  t = 1_000_000;
  obs: Observations = { 'memory.available': { available: 10 * Gi, capacity: 16 * Gi } };
  usage = new Map<string, PodUsage>();
  pods: Pod[] = [];
  evicted: Array<{ name: string; message: string; grace: number }> = [];
  reclaimed = 0;
  reclaimFrees: Observations | undefined;
  nodeEvents: string[] = [];
  readonly manager: EvictionManager;

  constructor(flags: Parameters<typeof parseEvictionConfig>[0]) {
    this.manager = new EvictionManager({
      config: parseEvictionConfig(flags),
      source: { stats: async (): Promise<EvictionStats> => ({ observations: this.obs, pods: this.usage }) },
      activePods: () => this.pods.filter((p) => !this.evicted.some((e) => e.name === p.metadata!.name)),
      evict: async (p, message, grace) => void this.evicted.push({ name: p.metadata!.name!, message, grace }),
      reclaimer: {
        images: async () => {
          this.reclaimed++;
          if (this.reclaimFrees) this.obs = { ...this.obs, ...this.reclaimFrees };
          return 0;
        },
        containers: async () => undefined,
      },
      nodeEvent: (type, reason, message) => void this.nodeEvents.push(`${type} ${reason}: ${message}`),
      now: () => this.t,
      log,
    });
  }
}

describe('eviction flags', () => {
  it('has the kubelet defaults and refuses what it cannot mean', () => {
    const c = parseEvictionConfig({});
    expect(c.thresholds.map((t) => [t.signal, t.value])).toEqual([
      ['memory.available', { quantity: 100 * Mi }],
      ['nodefs.available', { percentage: 0.1 }],
      ['imagefs.available', { percentage: 0.15 }],
      ['nodefs.inodesFree', { percentage: 0.05 }],
    ]);
    expect(DEFAULT_EVICTION_HARD).toContain('memory.available<100Mi');
    expect(c.pressureTransitionMs).toBe(300_000);
    // A given list replaces the defaults whole.
    expect(parseEvictionConfig({ hard: 'memory.available<1Gi' }).thresholds.map((t) => t.signal)).toEqual(['memory.available']);
    expect(() => parseEvictionConfig({ hard: 'memory.free<1Gi' })).toThrow(/unsupported eviction signal memory.free/);
    expect(() => parseEvictionConfig({ hard: 'memory.available<1Gi,memory.available<2Gi' })).toThrow(/duplicate/);
    expect(() => parseEvictionConfig({ hard: 'nodefs.available<120%' })).toThrow(/0% to 100%/);
    expect(() => parseEvictionConfig({ hard: 'memory.available>1Gi' })).toThrow(/invalid eviction threshold/);
    expect(() => parseEvictionConfig({ soft: 'memory.available<1Gi' })).toThrow(/grace period must be specified for the soft eviction threshold memory.available/);
    expect(() => parseEvictionConfig({ softGracePeriod: 'memory.available=1m' })).toThrow(/no --eviction-soft threshold/);
    expect(() => parseEvictionConfig({ hard: 'x'.repeat(5000) })).toThrow(/longer than 4096/);
    const soft = parseEvictionConfig({ soft: 'memory.available<2Gi', softGracePeriod: 'memory.available=1m30s', minimumReclaim: 'memory.available=500Mi' });
    expect(soft.thresholds.find((t) => !t.hard)).toMatchObject({ gracePeriodMs: 90_000, minReclaim: { quantity: 500 * Mi } });
    expect(parseDuration('500ms', 'f')).toBe(500);
    expect(() => parseDuration('5 minutes', 'f')).toThrow(/invalid duration/);
  });

  it('prints quantities as the API does', () => {
    expect(formatBytes(100 * Mi)).toBe('100Mi');
    expect(formatBytes(1536 * 1024)).toBe('1536Ki');
    expect(formatBytes(1000)).toBe('1000');
  });
});

describe('ranking', () => {
  it('puts pods over their requests first, then lower priority, then the most above requests', () => {
    const pods = [pod('guaranteed', { memReq: '1Gi', memLim: '1Gi', cpu: '1' }), pod('small', {}), pod('big', {}), pod('important', { priority: 1000 }), pod('burst', { memReq: '100Mi' })];
    const u = new Map([
      ['uid-guaranteed', usage(900 * Mi)],
      ['uid-small', usage(10 * Mi)],
      ['uid-big', usage(600 * Mi)],
      ['uid-important', usage(2 * Gi)],
      ['uid-burst', usage(800 * Mi)],
    ]);
    expect(rankPods(pods, u, 'memory').map((p) => p.metadata!.name)).toEqual(['burst', 'big', 'small', 'important', 'guaranteed']);
  });
});

describe('the eviction manager', () => {
  it('evicts for a hard memory threshold, keeps the condition for the transition period, and admits no BestEffort pod meanwhile', async () => {
    const h = new Harness({ hard: 'memory.available<1Gi', pressureTransitionPeriod: '30s' });
    h.pods = [pod('guaranteed', { memReq: '100Mi', memLim: '100Mi', cpu: '100m' }), pod('hog', {})];
    h.usage = new Map([['uid-guaranteed', usage(50 * Mi)], ['uid-hog', usage(3 * Gi)]]);
    expect((await h.manager.synchronize()).evicted).toEqual([]);
    expect(h.manager.conditions().size).toBe(0);
    expect(h.nodeEvents).toEqual([]);

    h.obs = { 'memory.available': { available: 512 * Mi, capacity: 16 * Gi } };
    const r = await h.manager.synchronize();
    expect(h.nodeEvents).toEqual(['Warning EvictionThresholdMet: Attempting to reclaim memory']);
    expect(r.evicted.map((e) => e.pod.metadata!.name)).toEqual(['hog']);
    expect(h.evicted[0]).toEqual({
      name: 'hog',
      grace: 1,
      message: 'The node was low on resource: memory. Threshold quantity: 1Gi, available: 512Mi. Container c was using 3Gi, request is 0, has larger consumption of memory. ',
    });
    expect([...h.manager.conditions()]).toEqual(['MemoryPressure']);
    expect(h.manager.admit(pod('besteffort'))).toEqual({ reason: 'Evicted', message: 'The node had condition: [MemoryPressure]. ' });
    expect(h.manager.admit(pod('burstable', { memReq: '10Mi' }))).toBeUndefined();
    expect(h.manager.admit({ ...pod('tolerant'), spec: { ...pod('tolerant').spec!, tolerations: [{ key: 'node.kubernetes.io/memory-pressure', operator: 'Exists', effect: 'NoSchedule' }] } })).toBeUndefined();

    // Recovered: the condition stays until the transition period has passed since it was last met.
    h.obs = { 'memory.available': { available: 8 * Gi, capacity: 16 * Gi } };
    h.t += 10_000;
    await h.manager.synchronize();
    expect([...h.manager.conditions()]).toEqual(['MemoryPressure']);
    h.t += 25_000;
    await h.manager.synchronize();
    expect(h.manager.conditions().size).toBe(0);
    expect(h.evicted.map((e) => e.name)).toEqual(['hog']);
    // Met once, recorded once: a pass under the threshold is no event.
    expect(h.nodeEvents).toHaveLength(1);
  });

  it('waits out a soft threshold grace period and applies the minimum reclaim', async () => {
    const h = new Harness({ hard: '', soft: 'memory.available<2Gi', softGracePeriod: 'memory.available=1m', minimumReclaim: 'memory.available=1Gi', pressureTransitionPeriod: '0s' });
    h.pods = [pod('a', { memReq: '10Mi' })];
    h.pods[0]!.spec!.terminationGracePeriodSeconds = 7;
    h.usage = new Map([['uid-a', usage(500 * Mi)]]);
    h.obs = { 'memory.available': { available: 1.5 * Gi, capacity: 16 * Gi } };
    await h.manager.synchronize();
    expect([...h.manager.conditions()]).toEqual(['MemoryPressure']);
    expect(h.evicted).toEqual([]);
    h.t += 59_000;
    await h.manager.synchronize();
    expect(h.evicted).toEqual([]);
    h.t += 2_000;
    await h.manager.synchronize();
    expect(h.evicted.map((e) => [e.name, e.grace])).toEqual([['a', 7]]);
    // Above the threshold but not past it by the minimum reclaim: still met.
    h.obs = { 'memory.available': { available: 2.5 * Gi, capacity: 16 * Gi } };
    h.t += 1_000;
    await h.manager.synchronize();
    expect([...h.manager.conditions()]).toEqual(['MemoryPressure']);
    h.obs = { 'memory.available': { available: 3.5 * Gi, capacity: 16 * Gi } };
    h.t += 1_000;
    await h.manager.synchronize();
    expect(h.manager.conditions().size).toBe(0);
  });

  it('tries images and dead containers before pods for disk, and never evicts critical pods', async () => {
    const h = new Harness({ hard: 'nodefs.available<10%' });
    h.pods = [pod('static', { annotations: { 'kubernetes.io/config.source': 'file' } }), pod('user', {})];
    h.usage = new Map([['uid-static', { ...usage(0), disk: 5 * Gi }], ['uid-user', { ...usage(0), disk: Mi }]]);
    h.obs = { 'nodefs.available': { available: 5 * Gi, capacity: 100 * Gi } };
    h.reclaimFrees = { 'nodefs.available': { available: 20 * Gi, capacity: 100 * Gi } };
    await h.manager.synchronize();
    expect(h.reclaimed).toBe(1);
    expect(h.evicted).toEqual([]);
    // The kubelet's Warning on the Node, even when the node-level reclaim is enough.
    expect(h.nodeEvents).toEqual(['Warning EvictionThresholdMet: Attempting to reclaim ephemeral-storage']);
    expect([...h.manager.conditions()]).toEqual(['DiskPressure']);
    expect(h.manager.admit(pod('any', { memReq: '1Mi' }))?.message).toBe('The node had condition: [DiskPressure]. ');

    h.reclaimFrees = undefined;
    h.obs = { 'nodefs.available': { available: 5 * Gi, capacity: 100 * Gi } };
    await h.manager.synchronize();
    expect(h.evicted.map((e) => e.name)).toEqual(['user']);
    expect(h.evicted[0]!.message).toMatch(/^The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. /);
  });

  it('evicts a pod past its emptyDir sizeLimit or ephemeral-storage limit whatever the node', async () => {
    const p = pod('scratch', { volumes: [{ name: 'cache', emptyDir: { sizeLimit: '10Mi' } }] });
    expect(localStorageViolation(p, usage(0, { emptyDirs: new Map([['cache', 9 * Mi]]) }))).toBeUndefined();
    expect(localStorageViolation(p, usage(0, { emptyDirs: new Map([['cache', 11 * Mi]]) }))).toBe('Usage of EmptyDir volume "cache" exceeds the limit "10Mi". ');
    const e = pod('eph', { eph: '1Mi' });
    expect(localStorageViolation(e, { containers: [{ name: 'c', disk: 2 * Mi }], emptyDirs: new Map() })).toBe('Container c exceeded its local ephemeral storage limit "1Mi". ');

    const h = new Harness({ hard: 'memory.available<1Mi' });
    h.pods = [p];
    h.usage = new Map([['uid-scratch', usage(0, { emptyDirs: new Map([['cache', 200 * Mi]]) })]]);
    await h.manager.synchronize();
    expect(h.evicted.map((x) => x.name)).toEqual(['scratch']);
    expect(h.manager.conditions().size).toBe(0);
  });
});

describe('node signals', () => {
  it('takes the working set as usage less inactive file pages', () => {
    expect(workingSetV1('1000\n', 'cache 5\ntotal_inactive_file 300\n')).toBe(700);
    expect(workingSetV1('', '')).toBeUndefined();
  });

  it('counts a directory once per inode and stops at its entry budget', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-du-'));
    try {
      await fs.writeFile(path.join(dir, 'a'), Buffer.alloc(1024 * 1024, 1));
      await fs.link(path.join(dir, 'a'), path.join(dir, 'b'));
      await fs.mkdir(path.join(dir, 'sub'));
      await fs.symlink('/usr', path.join(dir, 'sub', 'out'));
      for (let i = 0; i < 20; i++) await fs.writeFile(path.join(dir, 'sub', `f${i}`), 'x');
      const u = (await diskUsage(dir))!;
      expect(u.complete).toBe(true);
      expect(u.bytes).toBeGreaterThanOrEqual(1024 * 1024);
      expect(u.bytes).toBeLessThan(1.5 * 1024 * 1024);
      const partial = (await diskUsage(dir, 5))!;
      expect(partial.complete).toBe(false);
      expect(await diskUsage(path.join(dir, 'missing'))).toBeUndefined();
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});
