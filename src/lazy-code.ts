/**
 * Code the daemon loads on first use (streaming sessions, layer unpacking, image archives) is only
 * loaded while descriptors are to spare. Node keeps a module that failed to load as failed for the
 * life of the process: a first session or pull that came while the daemon was out of descriptors
 * (EMFILE reading a module's file) broke every later one until a restart. Refused instead, the
 * first use fails as any other call does then, and the next one loads the code.
 */
import fs from 'node:fs';

/** Descriptors that must be free: the files of the largest of these module graphs are read a few at a time. */
const HEADROOM = 32;

/** True if `n` descriptors could be opened just now (they are closed again). */
export function descriptorsToSpare(n = HEADROOM): boolean {
  const fds: number[] = [];
  try {
    for (let i = 0; i < n; i++) fds.push(fs.openSync('/dev/null', 'r'));
    return true;
  } catch {
    return false;
  } finally {
    for (const fd of fds) fs.closeSync(fd);
  }
}

/**
 * `load()` once, memoized; not tried while the daemon is short of descriptors, and tried again
 * after a failure.
 */
export function lazyCode<T>(what: string, load: () => Promise<T>): () => Promise<T> {
  let loading: Promise<T> | undefined;
  return () => {
    if (loading) return loading;
    if (!descriptorsToSpare()) return Promise.reject(new Error(`out of file descriptors: the ${what} code is not loaded now, so that it can be once some are free`));
    return (loading = load().catch((err: unknown) => {
      loading = undefined;
      throw err;
    }));
  };
}
