import fs from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it, vi } from 'vitest';
import { main } from '../../src/cli/main.js';
import { KUBECTL_HELP } from '../../src/cli/kubectl.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

async function capture(argv: string[], code = 0): Promise<string> {
  let out = '';
  const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
    out += String(chunk);
    return true;
  });
  try {
    expect(await main(argv)).toBe(code);
  } finally {
    spy.mockRestore();
  }
  return out;
}

async function help(): Promise<string> {
  let out = '';
  const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
    out += String(chunk);
    return true;
  });
  try {
    expect(await main(['cri', '--help'])).toBe(0);
  } finally {
    spy.mockRestore();
  }
  return out;
}

/** The `--flag`s of the first table under `heading` in a doc, and every flag row anywhere in that section. */
async function docFlags(doc: string, heading: string): Promise<{ table: string[]; rowsAnywhere: number }> {
  const text = `\n${await fs.readFile(path.join(repoRoot, doc), 'utf8')}`;
  const section = text.split(`\n${heading}\n`)[1]!.split('\n## ')[0]!;
  const lines = section.split('\n');
  const start = lines.findIndex((l) => l.startsWith('| flag'));
  expect(start, `a flag table under ${heading} in ${doc}`).toBeGreaterThanOrEqual(0);
  const rows: string[] = [];
  for (const l of lines.slice(start)) {
    if (!l.startsWith('|')) break;
    rows.push(l);
  }
  // A row may name several flags in its first column ("`--a`, `--b`").
  const flagsOf = (row: string) => [...(row.split('|')[1] ?? '').matchAll(/`(--[a-z-]+)`/g)].map((m) => m[1]!);
  return { table: rows.flatMap(flagsOf), rowsAnywhere: lines.filter((l) => /^\| `--/.test(l)).length - rows.filter((l) => /^\| `--/.test(l)).length };
}

async function helpFlags(args: string[], title: string): Promise<string[]> {
  let out = '';
  const spy = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
    out += String(chunk);
    return true;
  });
  try {
    expect(await main(args)).toBe(0);
  } finally {
    spy.mockRestore();
  }
  const section = out.split(`${title}\n`)[1]!.split('\n\n')[0]!;
  return [...section.matchAll(/^ {2}(--[a-z-]+)/gm)].map((m) => m[1]!);
}

describe('flag tables in docs/ match --help', () => {
  it('docs/cri.md has one unbroken flag table, with the same flags as skiff cri --help', async () => {
    const { table, rowsAnywhere } = await docFlags('docs/cri.md', '## `skiff cri`');
    // No second table after a blank line: every flag row sits in the first one.
    expect(rowsAnywhere).toBe(0);
    const flags = (await help()).split('Flags for "skiff cri":\n')[1]!.split('\n\n')[0]!;
    const fromHelp = [...flags.matchAll(/^ {2}(--[a-z-]+)/gm)].map((m) => m[1]);
    expect(table.sort()).toEqual(fromHelp.sort());
    expect(fromHelp).toContain('--cni-bridge');
  });

  it('docs/node.md and docs/proxy.md list the flags of skiff kubelet --help and skiff proxy --help', async () => {
    const kubelet = await docFlags('docs/node.md', '## `skiff node` and `skiff kubelet`');
    expect(kubelet.table.sort()).toEqual((await helpFlags(['kubelet', '--help'], 'Flags for "skiff kubelet" (the node agent alone, against skiff, containerd or CRI-O):')).sort());
    const proxy = await docFlags('docs/proxy.md', '# The service proxy and service DNS: `skiff proxy`');
    expect(proxy.table.sort()).toEqual((await helpFlags(['proxy', '--help'], 'Flags for "skiff proxy" (Services to iptables or nftables rules in kube-proxy\'s layouts, and service DNS):')).sort());
  });

  it('refuses a pod CIDR the bridge could not use before starting anything', async () => {
    for (const bad of ['10.88.0.0', '10.88.0.0/31', '300.1.0.0/16', 'fd00::/64']) {
      await expect(main(['cri', '--pod-cidr', bad, '--root', '/nonexistent/skiff-root'])).rejects.toThrow(/--pod-cidr must be an IPv4 CIDR/);
    }
  });

  it('refuses a --max-pods that is not a whole number from 1 before starting anything', async () => {
    for (const bad of ['0', '-1', '2.5', 'many', '100001']) {
      await expect(main(['kubelet', `--max-pods=${bad}`, '--runtime-endpoint', 'unix:///nonexistent/skiff.sock'])).rejects.toThrow(
        `--max-pods must be a whole number from 1 to 100000, not "${bad}"`,
      );
    }
    expect(await capture(['kubelet', '--help'])).toMatch(/--max-pods N +pods running at once; more wait, Pending, until one\n +ends \(default 110\)/);
  });

  it('refuses a --minimum-image-ttl-duration that is not a Go duration before starting anything', async () => {
    for (const bad of ['2 minutes', '-1s', '5', '']) {
      await expect(main(['kubelet', `--minimum-image-ttl-duration=${bad}`, '--runtime-endpoint', 'unix:///nonexistent/skiff.sock'])).rejects.toThrow(
        `--minimum-image-ttl-duration: invalid duration "${bad}"`,
      );
    }
  });

  it('skiff proxy --help names the resolv.conf that service DNS forwards with', async () => {
    expect(await capture(['proxy', '--help'])).toMatch(/--resolv-conf FILE +whose nameservers DNS forwards other names to; never to itself\n +\(default \/etc\/resolv\.conf\)/);
  });

  it('--images-dir is in --help and defaults under --root', async () => {
    expect(await help()).toMatch(/--images-dir DIR[\s\S]*default <root>\/images/);
  });
});

describe('skiff images help', () => {
  it('the top-level help names the images commands', async () => {
    const out = await capture(['help']);
    expect(out).toContain('skiff images import FILE... | ls | rm REF... | pull REF');
  });

  it('skiff images --help lists every subcommand and the endpoint flag', async () => {
    const out = await capture(['images', '--help']);
    for (const sub of ['import FILE...', 'ls [-q]', 'rm REF...', 'pull REF']) expect(out).toContain(`skiff images ${sub}`);
    expect(out).toMatch(/--runtime-endpoint URL .*default unix:\/\/\/run\/skiff\/skiff\.sock/);
    expect(await capture(['images'])).toBe(out);
  });

  it('an unknown images subcommand exits 2 without touching a socket', async () => {
    const err = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    try {
      await capture(['images', 'frobnicate', '--runtime-endpoint', 'unix:///nonexistent/skiff.sock'], 2);
    } finally {
      err.mockRestore();
    }
  });

  it('refuses an endpoint that is not a unix socket', async () => {
    await expect(main(['images', 'ls', '--runtime-endpoint', 'tcp://127.0.0.1:1'])).rejects.toThrow(/must be a unix socket/);
  });
});

describe('skiff get, describe, logs and exec in --help', () => {
  async function capture(argv: string[]): Promise<{ code: number; out: string; err: string }> {
    let out = '';
    let err = '';
    const o = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => ((out += String(chunk)), true));
    const e = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => ((err += String(chunk)), true));
    try {
      return { code: await main(argv), out, err };
    } finally {
      o.mockRestore();
      e.mockRestore();
    }
  }

  it('lists every kubectl-like command, and each command answers --help with the same text', async () => {
    const top = await capture(['--help']);
    for (const cmd of ['get pods', 'describe pod', 'logs POD', 'exec POD', '--server URL', '--runtime-endpoint URL']) expect(top.out).toContain(cmd);
    for (const cmd of ['get', 'describe', 'logs', 'exec']) {
      const r = await capture([cmd, '--help']);
      expect(r.code, cmd).toBe(0);
      expect(r.out).toBe(KUBECTL_HELP);
    }
  });

  it('every flag the help names for a command is one the command takes', async () => {
    // An unknown flag is refused before any connection is made, so a refusal here means the help lies.
    const unreachable = ['--server', 'http://127.0.0.1:1'];
    const cases: [string, string[]][] = [
      ['get', ['pods', '-n', 'x', '-A', '-o', 'wide', '-w']],
      ['describe', ['pod', 'p', '-n', 'x']],
      ['logs', ['p', '-c', 'c', '-f', '-p', '--tail', '5', '--timestamps', '-n', 'x']],
      ['exec', ['p', '-c', 'c', '-i', '-t', '-n', 'x', '--runtime-endpoint', 'unix:///nonexistent.sock', '--', 'sh']],
    ];
    for (const [cmd, args] of cases) {
      const r = await capture([cmd, ...args, ...unreachable]);
      expect(r.code, cmd).toBe(1);
      expect(r.err, cmd).toMatch(/cannot reach the node agent at http:\/\/127.0.0.1:1/);
    }
    const bad = await capture(['get', 'pods', '--bogus']);
    expect(bad.code).toBe(1);
    expect(bad.err).toMatch(/--bogus/);
  });
});

describe('skiff node --help', () => {
  it("names the node's API flag and where its kubeconfig goes", async () => {
    const out = await capture(['node', '--help']);
    expect(out).toMatch(/--api-address HOST:PORT\s+the node's Kubernetes API over HTTPS for kubectl and helm \(default\s+127\.0\.0\.1:6443/);
    expect(out).toContain('<--root-dir>/admin.kubeconfig');
  });
});
