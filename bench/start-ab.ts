/**
 * A/B of pod start between two skiff builds, in the same minutes: each build
 * runs as its own daemon in its own network namespace, and kubelet-like pod
 * starts (RunPodSandbox + CreateContainer + StartContainer, each container in
 * its own PID namespace) alternate between them, so machine noise falls on
 * both alike. Prints p50/p90 per RPC and the daemons' StartContainer and
 * RunPodSandbox phase traces (median per phase).
 *
 *   tsx bench/start-ab.ts <A repo dir> <B repo dir> [rounds] [--containerd]
 *
 * A repo dir is any directory with bin/skiff.js, dist/ and proto/. With
 * --containerd, the containerd 1.6 of shared/conformance/containerd.sh (its
 * socket at CONTAINERD_SOCKET) takes its turn in each round too.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { makeDirs, type DaemonDirs } from '../test/helpers/daemon.js';
import { Pusher } from '../test/helpers/oci.js';
import { startRegistry, waitFor } from '../test/helpers/registry.js';
import { busyboxImage } from '../test/helpers/busybox.js';
import { TestNetns } from '../test/helpers/netns.js';
import { client, ms, pct } from './pods.js';

const CONTAINERD_SOCKET = '/run/steer-containerd/containerd.sock';

interface Side {
  label: string;
  dirs: DaemonDirs;
  /** Absent for containerd, which runs on its own. */
  ns?: TestNetns;
  child?: ChildProcess;
  log: string;
  logFile?: string;
  cri: ReturnType<typeof client>;
  rpc: Record<string, number[]>;
}

async function main(): Promise<void> {
  const withContainerd = process.argv.includes('--containerd');
  const [aDir, bDir, roundsArg] = process.argv.slice(2).filter((a) => a !== '--containerd');
  if (!aDir || !bDir) throw new Error('usage: start-ab.ts <A dir> <B dir> [rounds] [--containerd]');
  const rounds = Number(roundsArg ?? 20);
  const registry = await startRegistry();
  const sides: Side[] = [];
  let image = '';
  try {
    await new Pusher(registry.url).image('ab/busybox', 'v1', await busyboxImage());
    image = `${registry.host}/ab/busybox:v1`;
    for (const [label, dir] of [['A', aDir], ['B', bDir]] as const) {
      const dirs = await makeDirs();
      const ns = new TestNetns().create();
      await ns.bridgePort(Number(registry.host.split(':')[1]), dirs.base);
      await fsp.mkdir(path.join(dirs.base, 'net.d'));
      const argv = ns.wrap([process.execPath, path.join(path.resolve(dir), 'bin', 'skiff.js'), 'cri', '--socket', dirs.socket, '--root', dirs.root, '--state', dirs.state, '--registry-config', dirs.certs, '--cni-conf-dir', path.join(dirs.base, 'net.d'), '--log-level', 'debug']);
      // The log goes to a file, as containerd's does: through a pipe, each line would cost this process (the client being timed) a read.
      const logFile = path.join(dirs.base, 'skiff.log');
      const out = fs.openSync(logFile, 'a');
      const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', out, out] });
      fs.closeSync(out);
      const side: Side = { label, dirs, ns, child, log: '', logFile, cri: undefined as never, rpc: {} };
      sides.push(side);
      await waitFor(`skiff ${label}`, async () => (side.log = await fsp.readFile(logFile, 'utf8')).includes('skiff cri serving'));
      side.cri = client(dirs.socket);
      await side.cri.img.PullImage({ image: { image } });
    }
    if (withContainerd) {
      const dirs = await makeDirs();
      const side: Side = { label: 'containerd', dirs, log: '', cri: client(CONTAINERD_SOCKET), rpc: {} };
      sides.push(side);
      await side.cri.img.PullImage({ image: { image } });
    }
    const ownPid = { network: 'POD', pid: 'CONTAINER', ipc: 'POD' };
    let n = 0;
    const podStart = async (s: Side, record: boolean) => {
      const name = `ab-${s.label}-${++n}`;
      const config = { metadata: { name, namespace: 'ab', uid: `${name}-uid`, attempt: 0 }, logDirectory: path.join(s.dirs.base, 'logs', name), linux: { securityContext: { namespaceOptions: ownPid } } };
      const rec = (k: string, v: number) => record && (s.rpc[k] ??= []).push(v);
      let podId = '';
      let ctrId = '';
      const t0 = process.hrtime.bigint();
      rec('RunPodSandbox', await ms(async () => (podId = (await s.cri.rt.RunPodSandbox({ config })).podSandboxId as string)));
      rec('CreateContainer', await ms(async () => {
        ctrId = (await s.cri.rt.CreateContainer({ podSandboxId: podId, config: { metadata: { name: 'sleep' }, image: { image }, command: ['sleep', '100000'], logPath: 'sleep.log', linux: { securityContext: { namespaceOptions: ownPid } } }, sandboxConfig: config })).containerId as string;
      }));
      rec('StartContainer', await ms(() => s.cri.rt.StartContainer({ containerId: ctrId })));
      rec('pod start', Number(process.hrtime.bigint() - t0) / 1e6);
      await s.cri.rt.StopContainer({ containerId: ctrId, timeout: 0 });
      await s.cri.rt.RemoveContainer({ containerId: ctrId });
      await s.cri.rt.StopPodSandbox({ podSandboxId: podId });
      await s.cri.rt.RemovePodSandbox({ podSandboxId: podId });
    };
    for (const s of sides) await podStart(s, false);
    const logMark = await Promise.all(sides.map(async (s) => (s.logFile ? (await fsp.stat(s.logFile)).size : 0)));
    for (let i = 0; i < rounds; i++) {
      // Rotate which side goes first.
      const order = sides.map((_, j) => sides[(i + j) % sides.length]!);
      for (const s of order) await podStart(s, true);
    }
    for (const [i, s] of sides.entries()) {
      if (s.logFile) s.log = (await fsp.readFile(s.logFile)).subarray(logMark[i]).toString();
      const line = Object.entries(s.rpc).map(([k, v]) => `${k} p50 ${pct(v, 50).toFixed(1)} p90 ${pct(v, 90).toFixed(1)}`).join(' | ');
      process.stdout.write(`${s.label} (${[aDir, bDir, CONTAINERD_SOCKET][i]}): ${line}\n`);
      const phases: Record<string, Record<string, number[]>> = {};
      for (const l of s.log.split('\n')) {
        // The handler's own time, from the call's log line: against the client's figure it shows the transport's share.
        const call = /"msg":"rpc"/.test(l) ? (JSON.parse(l) as { method?: string; ms?: number }) : undefined;
        if (call?.method && typeof call.ms === 'number') (((phases['handler ms'] ??= {})[call.method.slice(call.method.lastIndexOf('/') + 1)] ??= []).push(call.ms));
        const m = /"msg":"(\w+) phases \(ms\)"/.exec(l);
        if (!m) continue;
        const rec = JSON.parse(l) as Record<string, unknown>;
        for (const [k, v] of Object.entries(rec)) if (typeof v === 'number' && !['time', 'level', 'pid'].includes(k)) (phases[m[1]!] ??= {})[k] ??= [], phases[m[1]!]![k]!.push(v);
      }
      for (const [rpc, ph] of Object.entries(phases)) {
        process.stdout.write(`  ${rpc}: ${Object.entries(ph).map(([k, v]) => `${k} ${pct(v, 50).toFixed(1)}`).join(', ')}\n`);
      }
    }
  } finally {
    for (const s of sides) {
      // containerd keeps what it pulled: this run's image goes.
      if (!s.child) await s.cri?.img.RemoveImage({ image: { image } }).catch(() => undefined);
      s.cri?.close();
      if (s.child && s.child.exitCode === null) {
        const exited = new Promise((r) => s.child!.once('exit', r));
        s.child.kill('SIGTERM');
        await exited;
      }
      await s.ns?.destroy();
      await fsp.rm(s.dirs.base, { recursive: true, force: true });
    }
    await registry.stop();
  }
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`${e instanceof Error ? e.stack : String(e)}\n`);
  process.exit(1);
});
