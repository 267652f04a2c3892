/** A small runnable image: Debian's static busybox with its applets as symlinks, and users. */
import fs from 'node:fs/promises';
import { buildImage, type BuiltImage, type Entry } from './oci.js';
import { spawnSync } from 'node:child_process';

export async function busyboxImage(config: Record<string, unknown> = {}, extraLayer?: Entry[]): Promise<BuiltImage> {
  const bin = await fs.readFile('/bin/busybox');
  const applets = spawnSync('/bin/busybox', ['--list'], { encoding: 'utf8' }).stdout.split('\n').filter((a) => a && a !== 'busybox');
  const entries: Entry[] = [
    { name: 'bin/', type: 'directory' },
    { name: 'bin/busybox', data: bin, mode: 0o755 },
    ...applets.map((a) => ({ name: `bin/${a}`, type: 'symlink' as const, linkname: 'busybox' })),
    { name: 'etc/', type: 'directory' },
    { name: 'etc/passwd', data: 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' },
    { name: 'etc/group', data: 'root:x:0:\napp:x:1000:\nextra:x:3000:app\nnogroup:x:65534:\n' },
    { name: 'home/', type: 'directory' },
    { name: 'home/app/', type: 'directory', uid: 1000, gid: 1000 },
    { name: 'root/', type: 'directory', mode: 0o700 },
    { name: 'tmp/', type: 'directory', mode: 0o1777 },
  ];
  return buildImage({
    layers: extraLayer ? [{ entries }, { entries: extraLayer }] : [{ entries }],
    config: { config: { Env: ['PATH=/bin'], Cmd: ['sh'], ...config } },
  });
}
