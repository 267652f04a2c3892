/**
 * Names reserved before any await: two concurrent creations of the same name
 * get one success and one AlreadyExists.
 */
import { SkiffError } from './errors.js';

export class Registrar {
  private readonly names = new Map<string, string>();

  reserve(name: string, id: string, what: string): void {
    const holder = this.names.get(name);
    if (holder !== undefined && holder !== id) {
      throw new SkiffError('AlreadyExists', `${what} name "${name}" is already in use by ${holder}`);
    }
    this.names.set(name, id);
  }

  release(name: string): void {
    this.names.delete(name);
  }
}

/** Undo steps registered as a creation goes; on failure they run in reverse and the first error is kept. */
export class Rollback {
  private readonly steps: Array<[string, () => Promise<unknown> | unknown]> = [];

  add(what: string, undo: () => Promise<unknown> | unknown): void {
    this.steps.push([what, undo]);
  }

  async run(onError: (what: string, err: unknown) => void): Promise<void> {
    for (const [what, undo] of this.steps.reverse()) {
      try {
        await undo();
      } catch (err) {
        onError(what, err);
      }
    }
    this.steps.length = 0;
  }
}

/** One operation at a time per key (a pod, a container); others for the same key wait their turn. */
export class KeyedLock {
  private readonly tails = new Map<string, Promise<unknown>>();

  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.catch(() => undefined).then(fn);
    this.tails.set(key, next);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === next) this.tails.delete(key);
    }
  }
}
