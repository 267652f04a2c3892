/**
 * A network namespace owned by one test file. The daemon runs inside it
 * (entered with `nsenter --net`, which leaves the mount namespace and so the
 * cgroup mounts alone), so bridges, routes and iptables rules never touch
 * the host. The test registry is bridged in at the same 127.0.0.1 address
 * through a Unix socket, which crosses network namespaces.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { freePort, waitFor } from './registry.js';

export class TestNetns {
  readonly name = `skiff-t-${randomBytes(4).toString('hex')}`;
  private readonly helpers: ChildProcess[] = [];

  get path(): string {
    return `/run/netns/${this.name}`;
  }

  create(): this {
    const add = spawnSync('ip', ['netns', 'add', this.name], { encoding: 'utf8' });
    if (add.status !== 0) throw new Error(`ip netns add: ${add.stderr}`);
    spawnSync('ip', ['-n', this.name, 'link', 'set', 'lo', 'up']);
    return this;
  }

  /** Makes host 127.0.0.1:`port` reachable at 127.0.0.1:`port` inside the namespace. */
  async bridgePort(port: number, dir: string): Promise<void> {
    const sock = path.join(dir, `fwd-${port}.sock`);
    this.helpers.push(spawn('socat', [`UNIX-LISTEN:${sock},fork,mode=600`, `TCP:127.0.0.1:${port}`], { stdio: 'ignore' }));
    await waitFor(`socket ${sock}`, async () => spawnSync('test', ['-S', sock]).status === 0);
    this.helpers.push(spawn('nsenter', [`--net=${this.path}`, 'socat', `TCP-LISTEN:${port},bind=127.0.0.1,fork,reuseaddr`, `UNIX-CONNECT:${sock}`], { stdio: 'ignore' }));
    await waitFor(`port ${port} inside ${this.name}`, async () => this.probe(port));
  }

  private async probe(port: number): Promise<boolean> {
    const r = spawnSync('nsenter', [`--net=${this.path}`, 'socat', '-u', 'OPEN:/dev/null', `TCP:127.0.0.1:${port}`]);
    return r.status === 0;
  }

  /** Makes 127.0.0.1:`port` inside the namespace reachable from the host; returns the host port. */
  async exposePort(port: number, dir: string): Promise<number> {
    const sock = path.join(dir, `expose-${port}.sock`);
    this.helpers.push(spawn('nsenter', [`--net=${this.path}`, 'socat', `UNIX-LISTEN:${sock},fork,mode=600`, `TCP:127.0.0.1:${port}`], { stdio: 'ignore' }));
    await waitFor(`socket ${sock}`, async () => spawnSync('test', ['-S', sock]).status === 0);
    const hostPort = await freePort();
    this.helpers.push(spawn('socat', [`TCP-LISTEN:${hostPort},bind=127.0.0.1,fork,reuseaddr`, `UNIX-CONNECT:${sock}`], { stdio: 'ignore' }));
    await waitFor(`host port ${hostPort}`, async () => spawnSync('socat', ['-u', 'OPEN:/dev/null', `TCP:127.0.0.1:${hostPort}`]).status === 0);
    return hostPort;
  }

  wrap(argv: string[]): string[] {
    return ['nsenter', `--net=${this.path}`, ...argv];
  }

  async destroy(): Promise<void> {
    await Promise.all(
      this.helpers.map(
        (h) =>
          new Promise<void>((resolve) => {
            if (h.exitCode !== null || h.signalCode !== null) return resolve();
            h.once('exit', () => resolve());
            h.kill('SIGTERM');
          }),
      ),
    );
    spawnSync('ip', ['netns', 'del', this.name]);
  }
}

