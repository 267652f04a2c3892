/**
 * Debian's containerd (1.6, CRI plugin) inside a test's network namespace,
 * on the test's own root, state and socket, pulling from the test registry
 * over plain HTTP: the reference runtime kubelet-lite must work against too.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { TestNetns } from './netns.js';
import { waitFor } from './registry.js';

export const containerdPresent = spawnSync('containerd', ['--version']).status === 0;

export interface RunningContainerd {
  socket: string;
  log(): Promise<string>;
  stop(): Promise<void>;
}

export async function startContainerd(base: string, ns: TestNetns, registryHost: string, sandboxImage: string): Promise<RunningContainerd> {
  const dir = path.join(base, 'containerd');
  const certs = path.join(dir, 'certs.d', registryHost);
  const cni = path.join(dir, 'cni');
  await fs.mkdir(certs, { recursive: true });
  await fs.mkdir(cni, { recursive: true });
  await fs.writeFile(path.join(certs, 'hosts.toml'), `server = "http://${registryHost}"\n[host."http://${registryHost}"]\n  capabilities = ["pull", "resolve"]\n`);
  // A bridge of its own inside the test's namespace; nothing here reaches the host's network.
  await fs.writeFile(
    path.join(cni, '10-test.conflist'),
    JSON.stringify({
      cniVersion: '0.4.0',
      name: 'ctrd-test',
      plugins: [
        { type: 'bridge', bridge: 'ctrdtest0', isGateway: true, ipMasq: false, ipam: { type: 'host-local', ranges: [[{ subnet: '10.99.0.0/16' }]] } },
        { type: 'loopback' },
      ],
    }),
  );
  const socket = path.join(dir, 'containerd.sock');
  const config = `version = 2
root = "${dir}/root"
state = "${dir}/state"
[grpc]
  address = "${socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${sandboxImage}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "${cni}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "${path.join(dir, 'certs.d')}"
`;
  await fs.writeFile(path.join(dir, 'config.toml'), config);
  const logFile = path.join(dir, 'log');
  const out = await fs.open(logFile, 'w');
  const argv = ns.wrap(['containerd', '--config', path.join(dir, 'config.toml')]);
  const child: ChildProcess = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', out.fd, out.fd] });
  await out.close();
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  await waitFor('containerd to serve its socket', async () => {
    if (child.exitCode !== null) throw new Error(`containerd exited: ${await fs.readFile(logFile, 'utf8')}`);
    return spawnSync('test', ['-S', socket]).status === 0;
  }, 30_000);
  return {
    socket,
    log: () => fs.readFile(logFile, 'utf8'),
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      await exited;
      // containerd's shims outlive it by design: stop what is left of ours.
      spawnSync('pkill', ['-f', `containerd-shim-runc-v2 .*-address ${socket}`]);
      spawnSync('sh', ['-c', `grep -F ' ${dir}/' /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l`]);
    },
  };
}
