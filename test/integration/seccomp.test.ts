/**
 * The RuntimeDefault seccomp allowlist through the real daemon, runc and the
 * kernel: what a container may no longer do (turn off its own ASLR, make
 * namespaces, mount), what it still does as before, what a granted capability
 * opens again, and that Unconfined and Localhost profiles behave as asked.
 *
 * A small static C program in the image makes the calls busybox cannot
 * (personality with a flag, clone3) and prints the result and errno.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { busyboxImage } from '../helpers/busybox.js';
import { isRoot } from '../helpers/env.js';
import { Pusher } from '../helpers/oci.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';

const PROBE_C = `
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    long r;
    errno = 0;
    if (!strcmp(argv[i], "aslr-off")) r = personality(ADDR_NO_RANDOMIZE);
    else if (!strcmp(argv[i], "linux32")) { r = personality(PER_LINUX32); if (r >= 0) personality(PER_LINUX); }
    else if (!strcmp(argv[i], "query")) r = personality(0xffffffff);
    else if (!strcmp(argv[i], "clone3")) r = syscall(SYS_clone3, (void *)0, (size_t)0);
    else if (!strcmp(argv[i], "traceme")) r = ptrace(PTRACE_TRACEME, 0, 0, 0);
    else { fprintf(stderr, "unknown probe %s\\n", argv[i]); return 2; }
    printf("%s=%s errno=%d\\n", argv[i], r < 0 ? "refused" : "ok", r < 0 ? errno : 0);
  }
  printf("persona=%lx\\n", (unsigned long)personality(0xffffffff));
  return 0;
}
`;

let seq = 0;

describe.skipIf(!isRoot)('RuntimeDefault seccomp allowlist through the daemon', () => {
  let fx: PodFixture;
  let image: string;
  let tmp: string;
  let pod: { id: string; config: Record<string, unknown> };

  beforeAll(async () => {
    tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-seccomp-it-'));
    await fs.writeFile(path.join(tmp, 'probe.c'), PROBE_C);
    const cc = spawnSync('gcc', ['-static', '-O2', '-o', path.join(tmp, 'probe'), path.join(tmp, 'probe.c')], { encoding: 'utf8' });
    if (cc.status !== 0) throw new Error(`gcc failed: ${cc.stderr}`);
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-seccomp');
    const img = await busyboxImage({}, [{ name: 'bin/probe', data: await fs.readFile(path.join(tmp, 'probe')), mode: 0o755 }]);
    await new Pusher(`http://${inject('registryHost')}`).image('test/busybox-probe', 'v1', img);
    image = `${inject('registryHost')}/test/busybox-probe:v1`;
    await fx.skiff.images.PullImage({ image: { image } });
    const n = `spod${++seq}`;
    const config = { metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 }, hostname: n, logDirectory: path.join(fx.dirs.base, 'logs', n), linux: {} };
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    pod = { id: podSandboxId!, config };
  });

  afterAll(async () => {
    if (tmp) await fs.rm(tmp, { recursive: true, force: true });
    if (!fx) return;
    const leaks = await fx.cleanup();
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  async function run(seccomp: Record<string, unknown>, caps: string[] = []) {
    const name = `c${++seq}`;
    const { containerId } = await fx.skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name }, image: { image }, command: ['sleep', '1000'], logPath: `${name}.log`, linux: { securityContext: { seccomp, capabilities: { addCapabilities: caps } } } },
      sandboxConfig: pod.config,
    });
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    return containerId!;
  }

  async function exec(id: string, script: string): Promise<{ out: string; code: number }> {
    const r = await fx.skiff.runtime.ExecSync({ containerId: id, cmd: ['sh', '-c', script], timeout: 20 });
    return { out: Buffer.from(r.stdout!).toString() + Buffer.from(r.stderr!).toString(), code: r.exitCode ?? -1 };
  }

  it('refuses personality(ADDR_NO_RANDOMIZE) with EPERM, but allows the 32-bit persona and the query', async () => {
    const id = await run({ profileType: 'RuntimeDefault' });
    const { out } = await exec(id, 'probe aslr-off linux32 query; cat /proc/self/personality; linux32 uname -m');
    expect(out).toContain('aslr-off=refused errno=1\n');
    expect(out).toContain('linux32=ok errno=0\n');
    expect(out).toContain('query=ok errno=0\n');
    expect(out).toContain('persona=0\n');
    expect(out).toMatch(/^00000000$/m);
    expect(out).toMatch(/^i686$/m);
  });

  it('Unconfined lets a process turn its ASLR off (the refusal above is the profile\'s)', async () => {
    const id = await run({ profileType: 'Unconfined' });
    const { out } = await exec(id, 'probe aslr-off');
    expect(out).toContain('aslr-off=ok errno=0\n');
    expect(out).toContain('persona=40000\n');
  });

  it('still runs ordinary things: shell, files, processes, clocks, ids, chown as root, HTTP over loopback', async () => {
    const id = await run({ profileType: 'RuntimeDefault' });
    const script = [
      'set -e',
      'ls / >/dev/null',
      'ps | grep -q "sleep 1000"',
      'date +%Y >/dev/null',
      'sleep 0.1',
      'id -u',
      'mkdir -p /tmp/d/e && echo hi >/tmp/d/e/f && chown -R 1000:1000 /tmp/d && stat -c %u:%g /tmp/d/e/f',
      'ln -s f /tmp/d/e/l && readlink /tmp/d/e/l && rm -r /tmp/d',
      'mkdir /tmp/www && echo served >/tmp/www/index.html',
      'httpd -p 127.0.0.1:8080 -h /tmp/www',
      'for i in 1 2 3 4 5 6 7 8 9 10; do wget -q -O- http://127.0.0.1:8080/index.html 2>/dev/null && break; sleep 0.2; done',
      'kill $(pidof httpd)',
      'probe clone3',
      'echo done',
    ].join('\n');
    const { out, code } = await exec(id, script);
    expect(out).toBe('0\n1000:1000\nf\nserved\nclone3=refused errno=38\npersona=0\ndone\n');
    expect(code).toBe(0);
  });

  it('refuses new namespaces and mounts without CAP_SYS_ADMIN, and mounts a tmpfs with it', async () => {
    const plain = await run({ profileType: 'RuntimeDefault' });
    const refused = await exec(plain, 'unshare -U -n true 2>&1; echo rc=$?; mkdir -p /mnt/t; mount -t tmpfs t /mnt/t 2>&1; echo rc=$?');
    expect(refused.out).toMatch(/^unshare: .*Operation not permitted\nrc=1\nmount: permission denied.*\nrc=1\n$/);
    const admin = await run({ profileType: 'RuntimeDefault' }, ['SYS_ADMIN']);
    const allowed = await exec(admin, 'mkdir -p /mnt/t && mount -t tmpfs t /mnt/t && echo x >/mnt/t/y && grep " /mnt/t " /proc/mounts | cut -d" " -f3 && umount /mnt/t && echo ok');
    expect(allowed.out).toBe('tmpfs\nok\n');
  });

  it('opens a capability-gated group only to a container granted its capability (ptrace with SYS_PTRACE)', async () => {
    // PTRACE_TRACEME needs no capability in the kernel: a refusal can only be the profile's.
    const plain = await exec(await run({ profileType: 'RuntimeDefault' }), 'probe traceme');
    expect(plain.out).toContain('traceme=refused errno=1\n');
    const tracer = await exec(await run({ profileType: 'RuntimeDefault' }, ['SYS_PTRACE']), 'probe traceme');
    expect(tracer.out).toContain('traceme=ok errno=0\n');
  });

  it('refuses hostile Localhost profiles at once, without reading them whole or quoting them', async () => {
    const secret = path.join(tmp, 'shadow');
    await fs.writeFile(secret, 'root:$6$SECRETHASHxyz:19000:0:99999:7:::\n');
    const fifo = path.join(tmp, 'profile.fifo');
    expect(spawnSync('mkfifo', [fifo]).status).toBe(0);
    const big = path.join(tmp, 'big.json');
    await fs.writeFile(big, JSON.stringify({ defaultAction: 'SCMP_ACT_ALLOW', comment: 'x'.repeat(2 << 20) }));
    const link = path.join(tmp, 'link.json');
    await fs.symlink(secret, link);
    const create = (localhostRef: string) =>
      fx.skiff.runtime.CreateContainer({
        podSandboxId: pod.id,
        config: { metadata: { name: `h${++seq}` }, image: { image }, command: ['true'], linux: { securityContext: { seccomp: { profileType: 'Localhost', localhostRef } } } },
        sandboxConfig: pod.config,
      });
    const started = Date.now();
    // Four at once on a FIFO used to take every file-system thread of the daemon until someone wrote it.
    const fifoCalls = [1, 2, 3, 4].map(() => create(fifo).then(() => 'created', (err: Error) => err.message));
    const list = await fx.skiff.runtime.ListContainers({});
    expect(list.containers).toBeDefined();
    for (const msg of await Promise.all(fifoCalls)) expect(msg).toMatch(/not a regular file/);
    await expect(create('/dev/zero')).rejects.toThrow(/INVALID_ARGUMENT.*not a regular file/);
    await expect(create(big)).rejects.toThrow(/INVALID_ARGUMENT.*2097\d+ bytes, more than the 1048576 allowed/);
    for (const f of [secret, link]) {
      const msg = await create(f).then(() => 'created', (err: Error) => err.message);
      expect(msg).toMatch(/INVALID_ARGUMENT.*is not valid JSON/);
      expect(msg).not.toContain('SECRET');
      expect(msg).not.toContain('root:');
    }
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('keeps Localhost profiles working as written', async () => {
    const file = path.join(tmp, 'deny-mkdir.json');
    await fs.writeFile(file, JSON.stringify({ defaultAction: 'SCMP_ACT_ALLOW', syscalls: [{ names: ['mkdir', 'mkdirat'], action: 'SCMP_ACT_ERRNO', errnoRet: 1 }] }));
    const id = await run({ profileType: 'Localhost', localhostRef: file });
    const { out } = await exec(id, 'mkdir /tmp/x 2>&1; echo rc=$?; probe aslr-off');
    expect(out).toMatch(/Operation not permitted\s*rc=1/);
    // This profile allows everything else, personality flags included.
    expect(out).toContain('aslr-off=ok errno=0\n');
  });
});
