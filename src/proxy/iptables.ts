/**
 * The iptables and conntrack commands the proxier runs, behind a small
 * command runner so tests can run them inside a network namespace
 * (`nsenter --net=...`) or record them.
 */
import { SkiffError } from '../errors.js';
import { spawnChild } from '../sys/spawn.js';
import { JUMPS, type Jump } from './rules.js';

export interface CommandResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs argv with optional stdin; resolves with the exit code (a non-zero exit is a result, not an error). */
export type CommandRunner = (argv: string[], input?: string) => Promise<CommandResult>;

const MAX_CAPTURE = 64 * 1024 * 1024;

/** Runs commands directly, or behind `prefix` (e.g. ['nsenter', '--net=/run/netns/x']). */
export function processRunner(prefix: string[] = []): CommandRunner {
  return (argv, input) =>
    new Promise((resolve, reject) => {
      const full = [...prefix, ...argv];
      const child = spawnChild(full[0]!, full.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let outLen = 0;
      let errLen = 0;
      child.stdout?.on('data', (b: Buffer) => {
        if ((outLen += b.length) <= MAX_CAPTURE) out.push(b);
      });
      child.stderr?.on('data', (b: Buffer) => {
        if ((errLen += b.length) <= 1024 * 1024) err.push(b);
      });
      child.on('error', (e) => reject(new SkiffError('FailedPrecondition', `cannot run ${full[0]}: ${e.message}`, { cause: e })));
      child.on('close', (code, signal) =>
        resolve({ code: code ?? (signal ? 128 : 1), stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8') }),
      );
      child.stdin?.on('error', () => {}); // a child that dies early closes its stdin: the exit code tells
      child.stdin?.end(input ?? '');
    });
}

export class Iptables {
  constructor(private readonly run: CommandRunner) {}

  /** One `iptables-restore --noflush`: every line or none. */
  async restore(text: string): Promise<void> {
    const r = await this.run(['iptables-restore', '-w', '5', '--noflush'], text);
    if (r.code !== 0) throw new SkiffError('Internal', `iptables-restore failed (exit ${r.code}): ${firstLines(r.stderr)}${contextOf(r.stderr, text)}`);
  }

  async save(table: 'filter' | 'nat'): Promise<string> {
    const r = await this.run(['iptables-save', '-t', table]);
    if (r.code !== 0) throw new SkiffError('Internal', `iptables-save -t ${table} failed (exit ${r.code}): ${firstLines(r.stderr)}`);
    return r.stdout;
  }

  /** Chains declared in a table's iptables-save output. */
  async chains(table: 'filter' | 'nat'): Promise<string[]> {
    const text = await this.save(table);
    const out: string[] = [];
    for (const line of text.split('\n')) if (line.startsWith(':')) out.push(line.slice(1).split(' ')[0]!);
    return out;
  }

  /**
   * The jumps missing from the built-in chains. One iptables-save of the
   * (small) filter table and one listing per nat built-in chain: listing the
   * whole nat table costs seconds at 10,000 Services.
   */
  async missingJumps(jumps: Jump[] = JUMPS): Promise<Jump[]> {
    const natChains = [...new Set(jumps.filter((j) => j.table === 'nat').map((j) => j.chain))];
    const [filter, ...nat] = await Promise.all([
      this.save('filter'),
      ...natChains.map(async (chain) => {
        const r = await this.run(['iptables', '-w', '5', '-t', 'nat', '-S', chain]);
        if (r.code !== 0) throw new SkiffError('Internal', `iptables -t nat -S ${chain} failed: ${firstLines(r.stderr)}`);
        return r.stdout;
      }),
    ]);
    const lines = [filter, ...nat].join('\n').split('\n');
    return jumps.filter((j) => !lines.some((l) => jumpMatches(l, j)));
  }

  /** Puts each jump into its built-in chain, first, unless it is already there. */
  async ensureJumps(jumps: Jump[] = JUMPS): Promise<void> {
    for (const j of jumps) {
      const check = await this.run(['iptables', '-w', '5', '-t', j.table, '-C', j.chain, ...j.args]);
      if (check.code === 0) continue;
      const ins = await this.run(['iptables', '-w', '5', '-t', j.table, '-I', j.chain, ...j.args]);
      if (ins.code !== 0) throw new SkiffError('Internal', `iptables -t ${j.table} -I ${j.chain} failed: ${firstLines(ins.stderr)}`);
    }
  }

  /** Removes every copy of each jump; missing ones (or missing target chains) are fine. */
  async removeJumps(jumps: Jump[] = JUMPS): Promise<void> {
    for (const j of jumps) {
      for (let i = 0; i < 100; i++) {
        const del = await this.run(['iptables', '-w', '5', '-t', j.table, '-D', j.chain, ...j.args]);
        if (del.code !== 0) break;
      }
    }
  }

  /**
   * Deletes UDP conntrack entries that still point at `endpointIP` through
   * `dst` (the cluster IP) or through `nodePort`. Exit 1 means nothing matched.
   */
  async clearUdp(opts: { clusterIP?: string; nodePort?: number; endpointIP?: string }): Promise<void> {
    const argv = ['conntrack', '-D', '-p', 'udp'];
    if (opts.clusterIP) argv.push('--orig-dst', opts.clusterIP);
    if (opts.nodePort) argv.push('--orig-port-dst', String(opts.nodePort));
    if (opts.endpointIP) argv.push('--dst-nat', opts.endpointIP);
    const r = await this.run(argv);
    if (r.code !== 0 && r.code !== 1) throw new SkiffError('Internal', `${argv.join(' ')} failed (exit ${r.code}): ${firstLines(r.stderr)}`);
  }
}

/** True when an iptables-save line is `j` (same chain, comment and target; iptables may reorder matches). */
export function jumpMatches(line: string, j: Jump): boolean {
  if (!line.startsWith(`-A ${j.chain} `)) return false;
  const comment = j.args[j.args.indexOf('--comment') + 1]!;
  const target = j.args[j.args.length - 1]!;
  return line.includes(`--comment "${comment}"`) && line.endsWith(` -j ${target}`);
}

/** A jump as an iptables-restore line that puts it first in its chain. */
export function jumpInsertLine(j: Jump): string {
  return `-I ${j.chain} 1 ` + j.args.map((a) => (/\s/.test(a) ? `"${a}"` : a)).join(' ');
}

function firstLines(s: string): string {
  return s.split('\n').slice(0, 3).join(' / ').trim();
}

/** iptables-restore names the failing line ("line 42 failed"): show it. */
function contextOf(stderr: string, text: string): string {
  const m = /line:? (\d+)/.exec(stderr);
  if (!m) return '';
  const line = text.split('\n')[Number(m[1]) - 1];
  return line ? ` (line ${m[1]}: ${line.slice(0, 300)})` : '';
}
