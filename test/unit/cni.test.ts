import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { CniNetwork, checkBridgeName, defaultBridgeName, insideCidr, parseNetworkConfig } from '../../src/sandbox/cni.js';
import { masqCleanup, masqComment, networkMasqChain } from '../../src/sandbox/masq.js';
import { silentLogger, type Logger } from '../../src/log.js';
import type { RunOptions, RunResult, Runner } from '../../src/sys/run.js';

describe('CNI network configs', () => {
  it('reads a conflist and a single-plugin conf', () => {
    const list = parseNetworkConfig(JSON.stringify({ cniVersion: '1.0.0', name: 'n', plugins: [{ type: 'bridge' }, { type: 'portmap' }] }), '/x.conflist');
    expect(list).toMatchObject({ cniVersion: '1.0.0', name: 'n', file: '/x.conflist' });
    expect(list.plugins.map((p) => p.type)).toEqual(['bridge', 'portmap']);
    const one = parseNetworkConfig(JSON.stringify({ cniVersion: '0.4.0', name: 'n', type: 'ptp', ipMasq: true }), '/x.conf');
    expect(one.plugins).toEqual([{ type: 'ptp', ipMasq: true }]);
  });

  it.each([
    ['', /not valid JSON/],
    ['{"name": "n", "plugins": [', /not valid JSON/],
    ['[]', /not a JSON object/],
    ['{"plugins": [{"type": "bridge"}]}', /no "name"/],
    ['{"name": "n"}', /neither "plugins" nor "type"/],
    ['{"name": "n", "plugins": []}', /"plugins" is empty/],
    ['{"name": "n", "plugins": [{"type": "../../bin/sh"}]}', /plugin 0 has no valid "type"/],
    ['{"name": "n", "plugins": [null]}', /plugin 0 has no valid "type"/],
  ])('refuses %j', (text, msg) => {
    expect(() => parseNetworkConfig(text, '/f')).toThrow(msg);
  });
});

describe('bridge names', () => {
  it('differ between roots, stay the same for one root, and fit an interface name', () => {
    const a = defaultBridgeName('/var/lib/skiff');
    expect(a).toBe(defaultBridgeName('/var/lib/skiff/'));
    expect(a).not.toBe(defaultBridgeName('/var/lib/skiff-2'));
    expect(a).toMatch(/^skiff[0-9a-f]{8}$/);
    expect(checkBridgeName(a)).toBe(a);
  });

  it('refuses names the kernel would not take', () => {
    for (const bad of ['', 'a-name-far-too-long', 'has space', 'a/b', '..']) expect(() => checkBridgeName(bad)).toThrow(/not a valid interface name/);
  });
});

describe('pod CIDR clashes', () => {
  it.each([
    ['10.88.0.1', 16, '10.88.0.0/16', true],
    ['10.88.5.1', 24, '10.88.0.0/16', true],
    ['10.0.0.5', 8, '10.88.0.0/16', false],
    ['10.89.0.1', 16, '10.88.0.0/16', false],
    ['192.0.2.2', 24, '10.88.0.0/16', false],
    ['10.99.0.1', 24, '10.99.0.0/24', true],
  ])('%s/%i inside %s: %s', (addr, prefix, cidr, inside) => {
    expect(insideCidr(addr, prefix, cidr)).toBe(inside);
  });
});

describe('CNI DEL', () => {
  let dir: string;
  let links: unknown[];
  let calls: Array<{ cmd: string; env: NodeJS.ProcessEnv; conf: Record<string, unknown> }>;
  let fail: string | undefined;
  /** What `iptables -S POSTROUTING` prints, and the iptables commands run. */
  let postrouting: string;
  let iptables: Array<{ cmd: string; args: string[]; input?: string }>;
  const runner: Runner = async (cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> => {
    if (/^ip6?tables/.test(cmd)) {
      iptables.push({ cmd, args, input: opts.input === undefined ? undefined : String(opts.input) });
      if (fail === cmd) return { code: 4, signal: null, stdout: '', stderr: 'iptables: lock held', timedOut: false };
      return { code: 0, signal: null, stdout: cmd.endsWith('-restore') ? '' : postrouting, stderr: '', timedOut: false };
    }
    const conf = JSON.parse(String(opts.input)) as Record<string, unknown>;
    calls.push({ cmd: path.basename(cmd), env: opts.env ?? {}, conf });
    if (fail && fail === `${path.basename(cmd)}:${opts.env?.CNI_COMMAND}`) return { code: 1, signal: null, stdout: '{"code":11,"msg":"boom"}', stderr: '', timedOut: false };
    const stdout = opts.env?.CNI_COMMAND === 'ADD' ? JSON.stringify({ cniVersion: '1.0.0', ips: [{ address: '10.1.0.5/24' }] }) : '';
    return { code: 0, signal: null, stdout, stderr: '', timedOut: false };
  };

  function network(log: Logger = silentLogger): CniNetwork {
    // The node's addresses as the test sets them in `links`.
    const addresses = () => (links as Array<{ ifname: string; addr_info: Array<{ local: string; prefixlen: number }> }>).flatMap((l) => l.addr_info.map((a) => ({ ifname: l.ifname, local: a.local, prefixlen: a.prefixlen })));
    return new CniNetwork({ confDir: path.join(dir, 'net.d'), binDirs: [path.join(dir, 'bin')], dataDir: path.join(dir, 'data'), podCidr: '10.1.0.0/24', bridge: 'skifftest0', runner, log, addresses });
  }
  const cache = (id: string) => path.join(dir, 'data', 'cache', `${id}.json`);

  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-cni-'));
    await fs.mkdir(path.join(dir, 'bin'));
    for (const p of ['bridge', 'portmap']) await fs.writeFile(path.join(dir, 'bin', p), '', { mode: 0o755 });
    calls = [];
    fail = undefined;
    postrouting = '-P POSTROUTING ACCEPT\n';
    iptables = [];
    links = [{ ifname: 'lo', addr_info: [{ family: 'inet', local: '127.0.0.1', prefixlen: 8 }] }];
  });
  afterEach(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('runs the cached list in reverse with the cached result, then forgets it', async () => {
    const cni = network();
    await cni.add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }]);
    expect(calls.map((c) => c.conf.bridge ?? c.cmd)).toEqual(['skifftest0', 'portmap']);
    calls = [];
    await cni.del('p1');
    expect(calls.map((c) => `${c.cmd}:${c.env.CNI_COMMAND}`)).toEqual(['portmap:DEL', 'bridge:DEL']);
    expect(calls[1]!.conf.prevResult).toMatchObject({ ips: [{ address: '10.1.0.5/24' }] });
    await expect(fs.access(cache('p1'))).rejects.toThrow();
    // The cache is written whole: no temporary file stays behind.
    expect(await fs.readdir(path.join(dir, 'data', 'cache'))).toEqual([]);
  });

  /** An operator's list whose bridge masquerades per pod (ipMasq), as the plugin does it. */
  async function masqueradingList(): Promise<void> {
    await fs.mkdir(path.join(dir, 'net.d'), { recursive: true });
    await fs.writeFile(path.join(dir, 'net.d', '10-op.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'op', plugins: [{ type: 'bridge', ipMasq: true }] }));
  }

  it('after DEL, removes the masquerade jump and chain the plugin left for this pod, and nothing when none is left', async () => {
    await masqueradingList();
    const cni = network();
    await cni.add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, []);
    iptables = [];
    await cni.del('p1');
    expect(iptables.map((c) => [c.cmd, ...c.args].join(' '))).toEqual(['iptables -w 5 -t nat -S POSTROUTING']);

    await cni.add('p2', '/run/netns/p2', { name: 'a', namespace: 'b', uid: 'c' }, []);
    const left = `-A POSTROUTING -s 10.1.0.5/32 -m comment --comment ${masqComment('op', 'p2')} -j CNI-0123456789abcdef01234567`;
    postrouting = `-P POSTROUTING ACCEPT\n-A POSTROUTING -s 10.1.0.6/32 -m comment --comment ${masqComment('op', 'p3')} -j CNI-00000000000000000000000f\n${left}\n`;
    iptables = [];
    const warnings: string[] = [];
    await network({ ...silentLogger, warn: (m) => warnings.push(m) }).del('p2');
    expect(iptables.map((c) => c.cmd)).toEqual(['iptables', 'iptables-restore']);
    expect(iptables[1]!.args).toEqual(['-w', '5', '--noflush']);
    expect(iptables[1]!.input).toBe(`*nat\n-D ${left.slice(3)}\n-F CNI-0123456789abcdef01234567\n-X CNI-0123456789abcdef01234567\nCOMMIT\n`);
    expect(warnings.join()).toMatch(/removed masquerade rules the CNI DEL left behind/);
    await expect(fs.access(cache('p2'))).rejects.toThrow();
  });

  it('on its own network, runs the bridge without ipMasq and masquerades the pod CIDR with one chain and one jump, written at the first ADD only; DEL runs no iptables', async () => {
    const cni = network();
    const chain = networkMasqChain('skifftest0');
    expect(chain).toMatch(/^SKIFF-MASQ-[0-9a-f]{16}$/);
    expect(chain.length).toBeLessThanOrEqual(28); // iptables' limit for a chain name
    await cni.add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, []);
    expect(calls.map((c) => [c.cmd, c.env.CNI_COMMAND, c.conf.ipMasq])).toEqual([['bridge', 'ADD', false]]);
    expect(iptables.map((c) => [c.cmd, ...c.args].join(' '))).toEqual(['iptables -w 5 -t nat -S POSTROUTING', 'iptables-restore -w 5 --noflush']);
    expect(iptables[1]!.input).toBe(
      `*nat\n:${chain} - [0:0]\n-A ${chain} -d 10.1.0.0/24 -j RETURN\n-A ${chain} -d 224.0.0.0/4 -j RETURN\n-A ${chain} -j MASQUERADE\n` +
        `-A POSTROUTING -s 10.1.0.0/24 -m comment --comment "skiff pods on skifftest0" -j ${chain}\nCOMMIT\n`,
    );
    iptables = [];
    await cni.add('p2', '/run/netns/p2', { name: 'a', namespace: 'b', uid: 'c' }, []);
    await cni.del('p1');
    await cni.del('p2');
    expect(iptables).toEqual([]);
    expect(calls.map((c) => [c.cmd, c.env.CNI_COMMAND, c.conf.ipMasq])).toEqual([['bridge', 'ADD', false], ['bridge', 'ADD', false], ['bridge', 'DEL', false], ['bridge', 'DEL', false]]);
  });

  it('keeps the one jump for the pod CIDR, and removes jumps for a CIDR it had before', async () => {
    const chain = networkMasqChain('skifftest0');
    const jump = (cidr: string) => `-A POSTROUTING -s ${cidr} -m comment --comment "skiff pods on skifftest0" -j ${chain}`;
    postrouting = `-P POSTROUTING ACCEPT\n${jump('10.1.0.0/24')}\n${jump('10.9.0.0/16')}\n-A POSTROUTING -s 10.9.0.0/16 -j OTHER\n`;
    await network().add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, []);
    const input = iptables[1]!.input!;
    expect(input).toContain(`-D ${jump('10.9.0.0/16').slice(3)}\n`);
    expect(input).not.toContain('-A POSTROUTING');
    expect(input).not.toContain('OTHER');
  });

  it('rewrites the rules in the background once they are a minute old, and a failure then is logged, not the pod\'s', async () => {
    const errors: string[] = [];
    const cni = network({ ...silentLogger, error: (m) => errors.push(m) });
    await cni.add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, []);
    const realNow = Date.now;
    try {
      Date.now = () => realNow() + 61_000;
      iptables = [];
      fail = 'iptables-restore';
      await cni.add('p2', '/run/netns/p2', { name: 'a', namespace: 'b', uid: 'c' }, []);
      // The rewrite runs after the pod's add has answered: wait for its failure to be logged.
      await vi.waitFor(() => expect(errors.join()).toMatch(/could not rewrite the pod network's masquerade rules/), { timeout: 5000, interval: 10 });
      expect(iptables.map((c) => c.cmd)).toEqual(['iptables', 'iptables-restore']);
    } finally {
      Date.now = realNow;
    }
  });

  it('runs an operator\'s network list as written, masquerade included', async () => {
    await masqueradingList();
    await network().add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, []);
    expect(calls.map((c) => [c.cmd, c.env.CNI_COMMAND, c.conf.ipMasq])).toEqual([['bridge', 'ADD', true]]);
    expect(iptables).toEqual([]);
  });

  it('fails the first ADD on its own network when the masquerade rules cannot be written', async () => {
    fail = 'iptables-restore';
    await expect(network().add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, [])).rejects.toThrow(/masquerade for the pod network: iptables-restore failed: iptables: lock held/);
  });

  it('a failing iptables is logged and does not fail the DEL', async () => {
    await masqueradingList();
    const errors: string[] = [];
    const cni = network({ ...silentLogger, error: (m) => errors.push(m) });
    await cni.add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, []);
    fail = 'iptables';
    await cni.del('p1');
    expect(calls.map((c) => `${c.cmd}:${c.env.CNI_COMMAND}`)).toEqual(['bridge:ADD', 'bridge:DEL']);
    expect(errors.join()).toMatch(/could not check for masquerade rules/);
    await expect(fs.access(cache('p1'))).rejects.toThrow();
  });

  it('checks IPv6 too when the pod had an IPv6 address, and nothing for a list that does not masquerade', async () => {
    await fs.mkdir(path.join(dir, 'net.d'));
    await fs.writeFile(path.join(dir, 'net.d', '10-plain.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'plain', plugins: [{ type: 'bridge' }] }));
    const cni = network();
    await cni.add('p1', '/run/netns/p1', { name: 'a', namespace: 'b', uid: 'c' }, []);
    await cni.del('p1');
    expect(iptables).toEqual([]);

    await fs.writeFile(path.join(dir, 'net.d', '10-plain.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'dual', plugins: [{ type: 'bridge', ipMasq: true }] }));
    await fs.mkdir(path.dirname(cache('p6')), { recursive: true });
    const list = { ...parseNetworkConfig(await fs.readFile(path.join(dir, 'net.d', '10-plain.conflist'), 'utf8'), 'x') };
    await fs.writeFile(cache('p6'), JSON.stringify({ list, netns: '/run/netns/p6', args: '', ifname: 'eth0', portMappings: [], result: { ips: [{ address: '10.1.0.5/24' }, { address: 'fd00::5/64' }] } }));
    await cni.del('p6');
    expect(iptables.map((c) => c.cmd)).toEqual(['iptables', 'ip6tables']);
  });

  it('runs DEL from the config alone, without prevResult, when the cache is empty or gone', async () => {
    const cni = network();
    await fs.mkdir(path.dirname(cache('p2')), { recursive: true });
    await fs.writeFile(cache('p2'), '');
    await cni.del('p2', { netns: '/pins/p2' });
    expect(calls.map((c) => `${c.cmd}:${c.env.CNI_COMMAND}`)).toEqual(['portmap:DEL', 'bridge:DEL']);
    // Such a pod may come from a skiff that masqueraded per pod: its rules are looked for.
    expect(iptables.map((c) => [c.cmd, ...c.args].join(' '))).toEqual(['iptables -w 5 -t nat -S POSTROUTING']);
    for (const c of calls) {
      expect(c.conf).not.toHaveProperty('prevResult');
      expect(c.env.CNI_NETNS).toBe('/pins/p2');
      expect(c.env.CNI_CONTAINERID).toBe('p2');
    }
    await expect(fs.access(cache('p2'))).rejects.toThrow();
    calls = [];
    await cni.del('p3', { netns: '/pins/p3' });
    expect(calls).toHaveLength(2);
    // With no cache and no namespace there is nothing to undo.
    calls = [];
    await cni.del('p4');
    expect(calls).toEqual([]);
  });

  it('keeps the cache and throws the plugin\'s message when DEL fails', async () => {
    const cni = network();
    await cni.add('p5', '/run/netns/p5', { name: 'a', namespace: 'b', uid: 'c' }, []);
    fail = 'bridge:DEL';
    await expect(cni.del('p5', { attempts: 1 })).rejects.toThrow(/CNI DEL with plugin bridge failed: boom/);
    await fs.access(cache('p5'));
    await cni.discard('p5');
    await expect(fs.access(cache('p5'))).rejects.toThrow();
  });

  it('refuses to run when every config file is invalid, instead of using its own network', async () => {
    await fs.mkdir(path.join(dir, 'net.d'));
    await fs.writeFile(path.join(dir, 'net.d', '10-bad.conflist'), '{');
    const cni = network();
    await expect(cni.networkList()).rejects.toThrow(/no valid CNI network config .*10-bad\.conflist/);
    expect(await cni.status()).toMatchObject({ ready: false, reason: 'NetworkPluginNotReady' });
    await fs.writeFile(path.join(dir, 'net.d', '20-good.conflist'), JSON.stringify({ cniVersion: '1.0.0', name: 'good', plugins: [{ type: 'bridge' }] }));
    expect((await cni.networkList()).name).toBe('good');
    expect(await cni.status()).toEqual({ ready: true });
  });

  it('is not ready, and refuses ADD, while another interface holds an address in its pod CIDR', async () => {
    const cni = network();
    links.push({ ifname: 'skifftest0', addr_info: [{ family: 'inet', local: '10.1.0.1', prefixlen: 24 }] });
    expect(await cni.status()).toEqual({ ready: true });
    links.push({ ifname: 'skiffother', addr_info: [{ family: 'inet', local: '10.1.0.1', prefixlen: 24 }] });
    expect(await cni.status()).toMatchObject({ ready: false, message: expect.stringMatching(/10\.1\.0\.1\/24 on skiffother/) });
    await expect(cni.add('p6', '/run/netns/p6', { name: 'a', namespace: 'b', uid: 'c' }, [])).rejects.toThrow(/already used/);
    expect(calls).toEqual([]);
  });
});

describe('masquerade rules a DEL left behind', () => {
  const id = 'a'.repeat(64);
  const other = `${'a'.repeat(63)}b`;
  const jump = (i: string, chain: string, src = '10.88.0.4/32', net = 'skiff') => `-A POSTROUTING -s ${src} -m comment --comment ${masqComment(net, i)} -j ${chain}`;

  it('quotes the comment as iptables prints it', () => {
    expect(masqComment('skiff', 'ab')).toBe(String.raw`"name: \"skiff\" id: \"ab\""`);
    expect(masqComment('a"b\\c', 'x')).toBe(String.raw`"name: \"a\"b\\c\" id: \"x\""`);
  });

  it('removes only the jumps naming exactly this network and id, and only CNI- chains', () => {
    const text = [
      '-P POSTROUTING ACCEPT',
      '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
      jump(other, 'CNI-000000000000000000000002'),
      jump(id.slice(0, 63), 'CNI-000000000000000000000003'),
      jump(id, 'CNI-000000000000000000000004', '10.88.0.4/32', 'other-net'),
      jump(id, 'CNI-000000000000000000000001'),
      jump(id, 'CNI-000000000000000000000001', 'fd00::4/128'),
      jump(id, 'MASQUERADE'),
    ].join('\n');
    expect(masqCleanup(text, 'skiff', id)).toEqual([
      `-D POSTROUTING -s 10.88.0.4/32 -m comment --comment ${masqComment('skiff', id)} -j CNI-000000000000000000000001`,
      `-D POSTROUTING -s fd00::4/128 -m comment --comment ${masqComment('skiff', id)} -j CNI-000000000000000000000001`,
      `-D POSTROUTING -s 10.88.0.4/32 -m comment --comment ${masqComment('skiff', id)} -j MASQUERADE`,
      '-F CNI-000000000000000000000001',
      '-X CNI-000000000000000000000001',
    ]);
    expect(masqCleanup(text, 'skiff', 'c'.repeat(64))).toEqual([]);
  });
});


describe('masquerade rewrites of skiff\'s own network', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-cni-'));
    await fs.mkdir(path.join(dir, 'bin'));
    for (const p of ['bridge', 'portmap']) await fs.writeFile(path.join(dir, 'bin', p), '', { mode: 0o755 });
  });
  afterEach(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('are made one at a time: a rewrite for the old pod CIDR still running when the CIDR changes cannot undo the new one', async () => {
    // A nat table as iptables keeps it: `-S POSTROUTING` prints it, iptables-restore --noflush applies to it.
    const chains = new Map<string, string[]>([['POSTROUTING', []]]);
    /** Holds the answer of the next `iptables -S` (already read) until released: a write that waits for the xtables lock. */
    let hold: Promise<void> | undefined;
    const runner: Runner = async (cmd: string, _args: string[], opts: RunOptions = {}): Promise<RunResult> => {
      const ok = (stdout = ''): RunResult => ({ code: 0, signal: null, stdout, stderr: '', timedOut: false });
      if (cmd === 'iptables') {
        const stdout = ['-P POSTROUTING ACCEPT', ...chains.get('POSTROUTING')!.map((r) => `-A POSTROUTING ${r}`), ''].join('\n');
        const wait = hold;
        hold = undefined;
        if (wait) await wait;
        return ok(stdout);
      }
      if (cmd === 'iptables-restore') {
        for (const line of String(opts.input).split('\n')) {
          const m = /^(:|-A |-D )(\S+)(?: - \[0:0\]| (.*))?$/.exec(line);
          if (!m) continue;
          const [, op, chain, rule] = m;
          if (op === ':') chains.set(chain!, []);
          else if (op === '-A ') chains.get(chain!)!.push(rule!);
          else chains.set(chain!, chains.get(chain!)!.filter((r) => r !== rule));
        }
        return ok();
      }
      if (cmd === 'ip') return ok();
      const stdout = opts.env?.CNI_COMMAND === 'ADD' ? JSON.stringify({ cniVersion: '1.0.0', ips: [{ address: '10.1.0.5/24' }] }) : '';
      return ok(stdout);
    };
    const cni = new CniNetwork({ confDir: path.join(dir, 'net.d'), binDirs: [path.join(dir, 'bin')], dataDir: path.join(dir, 'data'), podCidr: '10.1.0.0/24', bridge: 'skifftest0', runner, log: silentLogger, addresses: () => [] });
    const meta = { name: 'a', namespace: 'b', uid: 'c' };
    const chain = networkMasqChain('skifftest0');
    await cni.add('p1', '/run/netns/p1', meta, []);
    const realNow = Date.now;
    try {
      // A minute on, a pod start rewrites the rules in the background; that rewrite waits on the lock.
      Date.now = () => realNow() + 61_000;
      let release!: () => void;
      hold = new Promise<void>((r) => (release = r));
      await cni.add('p2', '/run/netns/p2', meta, []);
      // Its pods gone, the network takes a new pod CIDR, and the next pod is started.
      await cni.del('p1');
      await cni.del('p2');
      await cni.setPodCidr('10.2.0.0/24');
      const p3 = cni.add('p3', '/run/netns/p3', meta, []);
      await new Promise((r) => setTimeout(r, 50));
      release();
      await p3;
      await new Promise((r) => setTimeout(r, 50));
    } finally {
      Date.now = realNow;
    }
    expect(chains.get('POSTROUTING')).toEqual([`-s 10.2.0.0/24 -m comment --comment "skiff pods on skifftest0" -j ${chain}`]);
    // Traffic between the new CIDR's pods is left as it is; with the old CIDR here instead, it left masqueraded.
    expect(chains.get(chain)).toEqual(['-d 10.2.0.0/24 -j RETURN', '-d 224.0.0.0/4 -j RETURN', '-j MASQUERADE']);
  });
});
