/**
 * The masquerade rules a CNI plugin with `ipMasq` (bridge, ptp) leaves behind
 * when its DEL cannot find the pod's interface: a pod with CAP_NET_ADMIN can
 * rename or delete its eth0, and the plugin then learns no address and
 * removes nothing. Those plugins tag every rule with the comment
 * `name: "<network>" id: "<container id>"`: the pod's POSTROUTING jump, and
 * the rules of the chain it jumps to. This finds the jumps with that exact
 * comment and removes them with their CNI- chains, in one iptables-restore.
 * Rules of other pods and of anyone else are never touched.
 */
import { createHash } from 'node:crypto';
import { SkiffError } from '../errors.js';
import type { Runner } from '../sys/run.js';

export type IpFamily = 4 | 6;

/** The comment as iptables prints it (inside double quotes, with `"` and `\` escaped). */
export function masqComment(network: string, id: string): string {
  const quoted = `name: "${network}" id: "${id}"`;
  return `"${quoted.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

/**
 * From `iptables -t nat -S POSTROUTING` output: the iptables-restore lines
 * that remove the pod's jumps and the chains they jump to (none when the
 * plugin's DEL cleaned up, the usual case).
 */
export function masqCleanup(postrouting: string, network: string, id: string): string[] {
  const comment = ` --comment ${masqComment(network, id)} `;
  const rules: string[] = [];
  const chains = new Set<string>();
  for (const line of postrouting.split('\n')) {
    if (!line.startsWith('-A POSTROUTING ') || !`${line} `.includes(comment)) continue;
    rules.push(`-D ${line.slice(3)}`);
    // Only the plugins' own chains: a rule with this comment that jumps elsewhere loses just itself.
    const target = / -j (CNI-[0-9a-f]+)$/.exec(line)?.[1];
    if (target) chains.add(target);
  }
  return [...rules, ...[...chains].flatMap((c) => [`-F ${c}`, `-X ${c}`])];
}

/**
 * Removes what is left of a pod's masquerade rules in this network
 * namespace's nat table, for each family asked. Returns the lines removed
 * (rules and chains); one `iptables -S` per family when there is nothing to do.
 */
export async function removeMasqRules(runner: Runner, network: string, id: string, families: IpFamily[]): Promise<string[]> {
  const done: string[] = [];
  for (const family of families) {
    const bin = family === 4 ? 'iptables' : 'ip6tables';
    const list = await runner(bin, ['-w', '5', '-t', 'nat', '-S', 'POSTROUTING'], { timeoutMs: 15_000 });
    if (list.code !== 0 || list.timedOut) {
      throw new SkiffError('Internal', `${bin} -t nat -S POSTROUTING failed${list.timedOut ? ' (timed out)' : ''}: ${list.stderr.trim().slice(0, 500) || `exit ${list.code}`}`);
    }
    const lines = masqCleanup(list.stdout, network, id);
    if (!lines.length) continue;
    const res = await runner(`${bin}-restore`, ['-w', '5', '--noflush'], { input: `*nat\n${lines.join('\n')}\nCOMMIT\n`, timeoutMs: 15_000 });
    if (res.code !== 0 || res.timedOut) {
      throw new SkiffError('Internal', `${bin}-restore failed${res.timedOut ? ' (timed out)' : ''}: ${res.stderr.trim().slice(0, 500) || `exit ${res.code}`}`);
    }
    done.push(...lines);
  }
  return done;
}

/** The chain the bridge and ptp plugins give a pod's masquerade rules: its DEL removes the chain by this name. */
export function masqChain(network: string, id: string): string {
  return `CNI-${createHash('sha512').update(network + id).digest('hex').slice(0, 24)}`;
}

/**
 * The rules the bridge plugin's `ipMasq` makes for a pod, as one
 * iptables-restore input: a chain that accepts traffic to the pod's own
 * subnet and masquerades the rest (multicast aside), and a POSTROUTING jump
 * to it for each of the pod's IPv4 addresses, all with the plugin's comment.
 * The same rules, chain name and comment as the plugin's own, so that its
 * DEL (and masqCleanup) finds and removes them.
 */
export function masqRestoreInput(network: string, id: string, ips: string[]): string | undefined {
  const v4 = ips.filter((a) => /^\d+\.\d+\.\d+\.\d+\/\d+$/.test(a));
  if (!v4.length) return undefined;
  const chain = masqChain(network, id);
  const comment = `-m comment --comment ${masqComment(network, id)}`;
  const subnets = [...new Set(v4.map(subnetOf))];
  return [
    '*nat',
    `:${chain} - [0:0]`,
    ...subnets.map((n) => `-A ${chain} -d ${n} ${comment} -j ACCEPT`),
    `-A ${chain} ! -d 224.0.0.0/4 ${comment} -j MASQUERADE`,
    ...v4.map((a) => `-A POSTROUTING -s ${a.split('/')[0]}/32 ${comment} -j ${chain}`),
    'COMMIT',
    '',
  ].join('\n');
}

/** `a.b.c.d/n` to its network, `w.x.y.z/n`. */
function subnetOf(cidr: string): string {
  const [addr, bitsText] = cidr.split('/') as [string, string];
  const bits = Number(bitsText);
  const n = addr.split('.').reduce((v, o) => v * 256 + Number(o), 0);
  const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
  const net = (n & mask) >>> 0;
  return `${[24, 16, 8, 0].map((s) => (net >>> s) & 255).join('.')}/${bits}`;
}

/** Writes a pod's masquerade rules (see masqRestoreInput) for the IPv4 addresses of a CNI result, in one iptables-restore. */
export async function addMasqRules(runner: Runner, network: string, id: string, result: unknown): Promise<void> {
  const ips = ((result as { ips?: Array<{ address?: unknown }> } | undefined)?.ips ?? []).map((i) => String(i?.address ?? ''));
  const input = masqRestoreInput(network, id, ips);
  if (!input) return;
  const res = await runner('iptables-restore', ['-w', '5', '--noflush'], { input, timeoutMs: 15_000 });
  if (res.code !== 0 || res.timedOut) {
    throw new SkiffError('Internal', `masquerade rules for pod ${id}: iptables-restore failed${res.timedOut ? ' (timed out)' : ''}: ${res.stderr.trim().slice(0, 500) || `exit ${res.code}`}`);
  }
}
