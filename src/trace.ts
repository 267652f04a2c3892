/**
 * Where the time of one RPC goes: phase durations for a single debug line,
 * so that a slow start can be read from the logs without a profiler.
 */
import { performance } from 'node:perf_hooks';

export class PhaseTrace {
  private readonly start = performance.now();
  private last = this.start;
  private readonly phases: Record<string, number> = {};

  /** Ends the phase that ran since the previous mark (or the start). */
  mark(name: string): void {
    const now = performance.now();
    this.add(name, now - this.last);
    this.last = now;
  }

  /** Times a step that runs beside others; its duration is its own, not the gap since the last mark. */
  async time<T>(name: string, step: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await step();
    } finally {
      this.add(name, performance.now() - t0);
    }
  }

  /** Phase durations in milliseconds (0.1 ms resolution), with the total. */
  fields(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [k, v] of Object.entries(this.phases)) out[k] = round(v);
    out.total = round(performance.now() - this.start);
    return out;
  }

  private add(name: string, ms: number): void {
    this.phases[name] = (this.phases[name] ?? 0) + ms;
  }
}

const round = (ms: number) => Math.round(ms * 10) / 10;
