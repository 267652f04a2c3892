/**
 * Builds the demo's two images from Debian's busybox-static, with skiff's own
 * image builder and no network, as OCI archives that `skiff images import`
 * (or `--images-dir`) loads:
 *
 *   skiff.local/demo-web:1     busybox httpd on port 8080 serving /www; unless
 *                              something (a ConfigMap volume) put a page there,
 *                              it writes one naming the pod's hostname, so a
 *                              client can tell the replicas apart
 *   skiff.local/demo-client:1  busybox with wget and nslookup; entrypoint sh
 *
 * Usage: npx tsx scripts/build-demo-images.ts [TARGET_DIR] (default build/images)
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildImage, busyboxEntries, ociArchive, type Entry } from '../src/image/build-oci.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

export const DEMO_WEB = 'skiff.local/demo-web:1';
export const DEMO_CLIENT = 'skiff.local/demo-client:1';

const WEB_ENTRYPOINT = `#!/bin/sh
# The demo web server. A page already in /www (a ConfigMap mounted there) is
# served as it is; otherwise the page names this replica.
set -e
if [ ! -e /www/index.html ]; then
  host="$(hostname)"
  printf '<!doctype html>\\n<title>skiff demo</title>\\n<p>Hello from skiff.</p>\\n<p>served by %s</p>\\n' "$host" > /www/index.html
  printf '%s\\n' "$host" > /www/hostname
fi
exec httpd -f -p 8080 -h /www
`;

export async function buildDemoImages(target: string, busybox = '/bin/busybox'): Promise<string[]> {
  const base = await busyboxEntries(busybox);
  const env = ['PATH=/usr/local/bin:/bin'];
  const webFiles: Entry[] = [
    { name: 'usr/', type: 'directory' },
    { name: 'usr/local/', type: 'directory' },
    { name: 'usr/local/bin/', type: 'directory' },
    { name: 'usr/local/bin/demo-web', data: WEB_ENTRYPOINT, mode: 0o755 },
    { name: 'www/', type: 'directory', uid: 1000, gid: 1000, mode: 0o755 },
  ];
  const web = await buildImage({
    layers: [{ entries: base }, { entries: webFiles }],
    config: {
      config: {
        Env: env,
        Entrypoint: ['/usr/local/bin/demo-web'],
        User: '1000',
        WorkingDir: '/www',
        ExposedPorts: { '8080/tcp': {} },
        Labels: { 'org.opencontainers.image.title': 'skiff demo web server', 'org.opencontainers.image.source': 'scripts/build-demo-images.ts' },
      },
    },
  });
  const client = await buildImage({
    layers: [{ entries: base }],
    config: {
      config: {
        Env: env,
        Entrypoint: ['/bin/sh'],
        Labels: { 'org.opencontainers.image.title': 'skiff demo client', 'org.opencontainers.image.source': 'scripts/build-demo-images.ts' },
      },
    },
  });
  await fs.mkdir(target, { recursive: true });
  const out: string[] = [];
  for (const [file, name, image] of [
    ['demo-web.tar', DEMO_WEB, web],
    ['demo-client.tar', DEMO_CLIENT, client],
  ] as const) {
    const p = path.join(target, file);
    // Written beside and renamed: a watcher of the directory never sees half an archive.
    await fs.writeFile(`${p}.part`, await ociArchive([{ name, image }]));
    await fs.rename(`${p}.part`, p);
    out.push(p);
  }
  return out;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const target = path.resolve(process.argv[2] ?? path.join(repoRoot, 'build', 'images'));
  buildDemoImages(target).then(
    (files) => {
      for (const f of files) process.stdout.write(`built ${f}\n`);
    },
    (err) => {
      process.stderr.write(`build-demo-images: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exit(1);
    },
  );
}
