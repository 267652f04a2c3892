/**
 * The floor under a pod start: the two things no runtime can skip, timed on
 * their own on this machine in the same run as the runtimes they bound.
 *
 * - a CNI bridge ADD (the bridge and host-local plugins, as skiff's default
 *   network runs them) into a network namespace made beforehand;
 * - one `runc run -d` of a busybox `sleep` from a prepared bundle.
 *
 * Run as a child inside the benchmark's network namespace, so the bridge it
 * makes never touches the host; it prints its samples as JSON.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export interface FloorSamples {
  cniAddMs: number[];
  runcRunMs: number[];
}

function run(cmd: string, args: string[], opts: { env?: NodeJS.ProcessEnv; input?: string } = {}): Promise<{ ms: number; code: number; out: string }> {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const child = spawn(cmd, args, { env: opts.env ?? process.env, stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr!.on('data', (c: Buffer) => (out += c.toString()));
    child.on('error', reject);
    // 'exit', not 'close': a detached container inherits runc's stdout and would hold 'close' off for its lifetime.
    child.on('exit', (code) => {
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      setImmediate(() => resolve({ ms, code: code ?? -1, out }));
    });
    if (child.stdin) {
      // A plugin may exit before it reads all of its config; its exit status says what happened.
      child.stdin.on('error', () => undefined);
      child.stdin.end(opts.input);
    }
  });
}

async function must(cmd: string, args: string[], opts: { env?: NodeJS.ProcessEnv; input?: string } = {}): Promise<number> {
  const r = await run(cmd, args, opts);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.code}: ${r.out}`);
  return r.ms;
}

const CNI_BIN = '/usr/lib/cni';

async function sample(rounds: number): Promise<FloorSamples> {
  const work = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-floor-'));
  const cniAddMs: number[] = [];
  const runcRunMs: number[] = [];
  const runcRoot = path.join(work, 'runc');
  try {
    const conf = JSON.stringify({
      cniVersion: '1.0.0',
      name: 'floor',
      type: 'bridge',
      bridge: 'skifffloor0',
      isGateway: true,
      ipMasq: true,
      hairpinMode: true,
      ipam: { type: 'host-local', ranges: [[{ subnet: '10.254.0.0/24' }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: path.join(work, 'ipam') },
    });
    const bundle = path.join(work, 'bundle');
    await fs.mkdir(path.join(bundle, 'rootfs', 'bin'), { recursive: true });
    await fs.copyFile('/bin/busybox', path.join(bundle, 'rootfs', 'bin', 'busybox'));
    await must('runc', ['spec', '--bundle', bundle]);
    const spec = JSON.parse(await fs.readFile(path.join(bundle, 'config.json'), 'utf8')) as { process: Record<string, unknown>; root: Record<string, unknown> };
    spec.process.terminal = false;
    spec.process.args = ['/bin/busybox', 'sleep', '100000'];
    spec.root.readonly = true;
    await fs.writeFile(path.join(bundle, 'config.json'), JSON.stringify(spec));

    for (let i = 0; i < rounds + 1; i++) {
      const id = `floor-${process.pid}-${i}`;
      const pin = path.join(work, `ns-${i}`);
      await fs.writeFile(pin, '');
      await must('unshare', [`--net=${pin}`, 'true']);
      const env = (command: string) => ({ ...process.env, CNI_COMMAND: command, CNI_CONTAINERID: id, CNI_NETNS: pin, CNI_IFNAME: 'eth0', CNI_PATH: CNI_BIN });
      const add = await must(path.join(CNI_BIN, 'bridge'), [], { env: env('ADD'), input: conf });
      const rr = await must('runc', ['--root', runcRoot, 'run', '-d', '--bundle', bundle, id]);
      // The first round pays for cold caches: not counted.
      if (i > 0) {
        cniAddMs.push(add);
        runcRunMs.push(rr);
      }
      await must('runc', ['--root', runcRoot, 'delete', '-f', id]);
      await must(path.join(CNI_BIN, 'bridge'), [], { env: env('DEL'), input: conf });
      spawnSync('umount', [pin]);
    }
  } finally {
    const left = spawnSync('runc', ['--root', runcRoot, 'list', '-q'], { encoding: 'utf8' }).stdout ?? '';
    for (const id of left.split('\n').filter(Boolean)) spawnSync('runc', ['--root', runcRoot, 'delete', '-f', id]);
    for (const f of await fs.readdir(work)) if (f.startsWith('ns-')) spawnSync('umount', [path.join(work, f)]);
    spawnSync('ip', ['link', 'del', 'skifffloor0']);
    await fs.rm(work, { recursive: true, force: true });
  }
  return { cniAddMs, runcRunMs };
}

/** Runs the sampler in a child inside `wrap`'s namespace (it makes a bridge). */
export async function measureFloor(wrap: (argv: string[]) => string[], rounds = 20): Promise<FloorSamples> {
  const tsx = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'node_modules', '.bin', 'tsx');
  const argv = wrap([tsx, fileURLToPath(import.meta.url), String(rounds)]);
  const r = await run(argv[0]!, argv.slice(1));
  if (r.code !== 0) throw new Error(`floor sampler failed: ${r.out}`);
  return JSON.parse(r.out.trim().split('\n').pop()!) as FloorSamples;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  sample(Number(process.argv[2] ?? 20)).then(
    (s) => process.stdout.write(JSON.stringify(s) + '\n'),
    (err) => {
      process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
      process.exit(1);
    },
  );
}
