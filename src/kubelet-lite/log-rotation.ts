/**
 * Container log rotation, as the kubelet's container log manager does it:
 * every monitor period, each running container whose log is over the max
 * size has it renamed to `<N>.log.<time>`, the runtime is told to reopen
 * (CRI ReopenContainerLog), and the oldest rotated files go so that at most
 * max-files files are left. Rotated files are kept as they are (the kubelet
 * gzips the older ones; skiff does not, so reading across rotation needs no
 * decompression).
 *
 * Every file is reached through a descriptor of its directory opened with no
 * symlink followed: the pod may reach its own log directory.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { errorMessage, isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import { O_CLOEXEC, O_PATH, openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS } from '../sys/libc.js';
import type { CriEndpoint } from './cri-client.js';
import { openLogDir, probeLogFile, rotatedLogs, rotationSuffix } from './log-files.js';

/** The kubelet's defaults: containerLogMaxSize 10Mi, containerLogMaxFiles 5, and its monitor period of 10 s. */
export const DEFAULT_CONTAINER_LOG_MAX_SIZE = 10 * 1024 * 1024;
export const DEFAULT_CONTAINER_LOG_MAX_FILES = 5;
export const DEFAULT_CONTAINER_LOG_MONITOR_MS = 10_000;

export interface LogRotationOptions {
  /** The agent's root: only logs under `<root>/pods/` are the agent's to rotate. */
  rootDir: string;
  maxSize: number;
  /** Files kept per container log, the current one included (at least 2). */
  maxFiles: number;
  monitorMs?: number;
  now?: () => Date;
  log: Logger;
}

const fstat = promisify(fs.fstat);
const STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

export class ContainerLogManager {
  private readonly now: () => Date;

  constructor(
    private readonly cri: CriEndpoint,
    private readonly opts: LogRotationOptions,
  ) {
    if (!(Number.isSafeInteger(opts.maxSize) && opts.maxSize > 0)) throw new Error(`--container-log-max-size must be a positive size, not ${opts.maxSize}`);
    if (!(Number.isInteger(opts.maxFiles) && opts.maxFiles >= 2)) throw new Error(`--container-log-max-files must be at least 2, not ${opts.maxFiles}`);
    this.now = opts.now ?? (() => new Date());
  }

  /** Runs a pass every monitor period (never two at once); returns the stop. */
  start(): () => void {
    let stopped = false;
    let timer: NodeJS.Timeout | undefined;
    const tick = async () => {
      await this.rotateAll().catch((err: unknown) => this.opts.log.warn('container log rotation failed', { error: errorMessage(err) }));
      if (stopped) return;
      timer = setTimeout(() => void tick(), this.opts.monitorMs ?? DEFAULT_CONTAINER_LOG_MONITOR_MS);
      timer.unref();
    };
    timer = setTimeout(() => void tick(), this.opts.monitorMs ?? DEFAULT_CONTAINER_LOG_MONITOR_MS);
    timer.unref();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }

  /** One pass over the running containers; returns the ids whose logs were rotated. */
  async rotateAll(): Promise<string[]> {
    const { containers } = await this.cri.runtime.listContainers({ filter: { state: { state: 'CONTAINER_RUNNING' } } });
    const rotated: string[] = [];
    for (const c of containers) {
      try {
        const st = await this.cri.runtime.containerStatus({ containerId: c.id, verbose: false });
        const logPath = st.status?.logPath;
        if (!logPath) continue;
        const rel = path.relative(this.opts.rootDir, path.resolve(logPath));
        if (!rel.startsWith(`pods${path.sep}`) || rel.split(path.sep).includes('..')) continue;
        if (await this.rotate(c.id, rel)) rotated.push(c.id);
      } catch (err) {
        // A container that went between the listing and now, or a log someone tampered with: the next pass tries again.
        this.opts.log.warn('could not rotate a container log', { container: c.id, error: errorMessage(err) });
      }
    }
    return rotated;
  }

  private async rotate(id: string, rel: string): Promise<boolean> {
    const { dirFd, name } = openLogDir({ root: this.opts.rootDir, path: rel });
    try {
      const size = await regularSize(dirFd, name);
      if (size === undefined || size < this.opts.maxSize) return false;
      const at = (f: string) => `/proc/self/fd/${dirFd}/${f}`;
      // Room for the file about to be rotated: max-files counts the current log and the new rotated one.
      const old = await rotatedLogs(dirFd, name);
      for (const f of old.slice(0, Math.max(0, old.length - (this.opts.maxFiles - 2)))) await fsp.unlink(at(f)).catch((err: unknown) => (isErrno(err, 'ENOENT') ? undefined : Promise.reject(err)));
      const target = `${name}.${rotationSuffix(this.now())}`;
      if (await probeLogFile(dirFd, target)) return false;
      // rename(2) moves the entry itself: it follows no link at either end.
      await fsp.rename(at(name), at(target));
      try {
        await this.cri.runtime.reopenContainerLog({ containerId: id }, 30_000);
      } catch (err) {
        // The runtime kept writing to the renamed file: put it back, unless a new one is already there.
        if (!(await probeLogFile(dirFd, name).catch(() => true))) await fsp.rename(at(target), at(name)).catch(() => undefined);
        throw err;
      }
      this.opts.log.debug('rotated a container log', { container: id, file: rel, size });
      return true;
    } finally {
      fs.closeSync(dirFd);
    }
  }
}

/** The size of `name` when it is a regular file; undefined when missing or anything else. */
async function regularSize(dirFd: number, name: string): Promise<number | undefined> {
  let fd: number;
  try {
    fd = openat2(dirFd, name, O_PATH | O_CLOEXEC, STRICT);
  } catch (err) {
    if (isErrno(err, 'ENOENT') || isErrno(err, 'ELOOP') || isErrno(err, 'EXDEV')) return undefined;
    throw err;
  }
  try {
    const st = await fstat(fd);
    return st.isFile() ? st.size : undefined;
  } finally {
    fs.closeSync(fd);
  }
}


