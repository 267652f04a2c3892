/**
 * A small ext4 filesystem on a loop device, for tests that need a disk that
 * fills up: a sparse backing file outside the test's tree, attached with
 * losetup, mounted where the test says. release() undoes all of it and may be
 * called any number of times, whatever state a failure left.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

function run(cmd: string, args: string[]): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return r.stdout.trim();
}

export class LoopFs {
  private file = '';
  private device = '';
  private mountpoint = '';

  constructor(readonly sizeMiB: number) {}

  /** Makes the backing file and filesystem, and mounts it on `dir` (which must exist). */
  async mount(dir: string): Promise<void> {
    const tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-loopfs-'));
    this.file = path.join(tmp, 'disk.img');
    run('truncate', ['-s', `${this.sizeMiB}M`, this.file]);
    // No blocks reserved for root: the agent runs as root, and statfs's bavail would hide them anyway.
    run('mkfs.ext4', ['-q', '-F', '-m', '0', this.file]);
    this.device = run('losetup', ['-f', '--show', this.file]);
    run('mount', [this.device, dir]);
    this.mountpoint = dir;
  }

  /** Unmounts (lazily if something still holds it), detaches the device, removes the backing file. */
  async release(): Promise<void> {
    if (this.mountpoint) {
      const mounted = () => spawnSync('mountpoint', ['-q', this.mountpoint]).status === 0;
      for (let i = 0; i < 10 && mounted(); i++) {
        if (spawnSync('umount', [this.mountpoint]).status === 0) break;
        await new Promise((r) => setTimeout(r, 500));
      }
      if (mounted()) spawnSync('umount', ['-l', this.mountpoint]);
      this.mountpoint = '';
    }
    if (this.device) {
      spawnSync('losetup', ['-d', this.device]);
      this.device = '';
    }
    if (this.file) {
      await fs.rm(path.dirname(this.file), { recursive: true, force: true });
      this.file = '';
    }
  }

  /** Whether this device is still attached (for the test's own leak check). */
  attached(device = this.device): boolean {
    return !!device && spawnSync('losetup', [device]).status === 0;
  }

  get devicePath(): string {
    return this.device;
  }
}

/** The resident memory of a process (VmRSS in /proc/PID/status), in bytes. */
export async function rssBytes(pid: number): Promise<number> {
  const status = await fs.readFile(`/proc/${pid}/status`, 'utf8');
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(status);
  if (!m) throw new Error(`no VmRSS in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}
