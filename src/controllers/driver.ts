/**
 * Keeps the controllers' memory between calls and their requeue timer. The
 * agent calls run() whenever the manifests or the pods change; when a timed
 * thing is due (minReadySeconds, a deadline, a cron schedule, a ttl) the
 * driver calls `onRequeue` so the agent runs it again.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../stored-object.js';
import { reconcile, sanitizeState } from './reconcile.js';
import { forgetJob } from './cronjob.js';
import { jobMemoryKey } from './job.js';
import { emptyState, type ControllerState, type ReconcileOutput } from './types.js';

/** setTimeout cannot wait longer than this; a farther requeue is re-armed when it fires. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export interface ControllerDriverOptions {
  nodeName: string;
  now?: () => number;
  random?: () => number;
  /** Called when a requeue is due; the agent answers with run(). */
  onRequeue?: () => void;
  /** Memory from an earlier process (ControllerDriver.state), if kept. */
  state?: unknown;
  /** Timers, injectable for tests. */
  setTimer?: (fn: () => void, ms: number) => { cancel(): void };
}

export class ControllerDriver {
  private memory: ControllerState;
  private timer: { cancel(): void } | undefined;
  private last: ReconcileOutput | undefined;
  private stopped = false;

  constructor(private readonly opts: ControllerDriverOptions) {
    this.memory = opts.state === undefined ? emptyState() : sanitizeState(opts.state);
  }

  /**
   * `pods` are the controller-owned pods the agent runs (with status);
   * `reservedPodNames` ("namespace/name") are its other pods, whose names new pods must not take.
   */
  run(workloads: StoredObject[], pods: Pod[], reservedPodNames: string[] = []): ReconcileOutput {
    const now = (this.opts.now ?? Date.now)();
    const out = reconcile({ workloads, pods, nodeName: this.opts.nodeName, now, state: this.memory, random: this.opts.random, reservedPodNames });
    this.memory = out.state;
    this.last = out;
    this.arm(out.requeueAfterMs);
    return out;
  }

  /** The memory to persist (a copy). */
  get state(): ControllerState {
    return structuredClone(this.memory);
  }

  /**
   * A CronJob's Job deleted by someone else: forgotten, with its memory, so it
   * is not made again (its pods go with it on the next run).
   */
  forgetJob(namespace: string, name: string): void {
    forgetJob(this.memory, namespace, name);
  }

  /**
   * A CronJob's Job now stands in an API as an object with this uid: its pods
   * from now on carry it (in their controller-uid label and owner), so the
   * Job's selector finds them.
   */
  adoptJobUid(namespace: string, name: string, uid: string): void {
    const j = this.memory.virtualJobs[`${namespace}/${name}`];
    if (!j) return;
    j.uid = uid;
    const mem = this.memory.jobs[jobMemoryKey(namespace, name)];
    if (mem) mem.uid = uid;
  }

  /** The last run's output, for the status API and the CLI. */
  get lastOutput(): ReconcileOutput | undefined {
    return this.last;
  }

  stop(): void {
    this.stopped = true;
    this.timer?.cancel();
    this.timer = undefined;
  }

  private arm(afterMs: number | undefined): void {
    this.timer?.cancel();
    this.timer = undefined;
    if (this.stopped || afterMs === undefined) return;
    const wait = Math.max(0, Math.min(afterMs, MAX_TIMER_MS));
    const fire = () => {
      this.timer = undefined;
      if (!this.stopped) this.opts.onRequeue?.();
    };
    this.timer = (this.opts.setTimer ?? defaultTimer)(fire, wait);
  }
}

function defaultTimer(fn: () => void, ms: number): { cancel(): void } {
  const t = setTimeout(fn, ms);
  t.unref();
  return { cancel: () => clearTimeout(t) };
}
