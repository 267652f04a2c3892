/**
 * The masquerade rules a CNI plugin with `ipMasq` (bridge, ptp) leaves behind
 * when its DEL cannot find the pod's interface: a pod with CAP_NET_ADMIN can
 * rename or delete its eth0, and the plugin then learns no address and
 * removes nothing. Those plugins tag every rule with the comment
 * `name: "<network>" id: "<container id>"`: the pod's POSTROUTING jump, and
 * the rules of the chain it jumps to. This finds the jumps with that exact
 * comment and removes them with their CNI- chains, in one iptables-restore.
 * Rules of other pods and of anyone else are never touched.
 *
 * skiff's own network masquerades differently: one chain and one jump for
 * its whole pod CIDR (networkMasqRestoreInput), so no pod has rules to leave.
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

/** `a.b.c.d/n` to its network, `w.x.y.z/n`. */
function subnetOf(cidr: string): string {
  const [addr, bitsText] = cidr.split('/') as [string, string];
  const bits = Number(bitsText);
  const n = addr.split('.').reduce((v, o) => v * 256 + Number(o), 0);
  const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
  const net = (n & mask) >>> 0;
  return `${[24, 16, 8, 0].map((s) => (net >>> s) & 255).join('.')}/${bits}`;
}

// --- skiff's own network: one masquerade rule set for the whole pod CIDR. ---

/**
 * The chain of skiff's own network on `bridge`. Per bridge, so that two
 * daemons on one host (each with its own bridge and pod CIDR) keep their own.
 */
export function networkMasqChain(bridge: string): string {
  return `SKIFF-MASQ-${createHash('sha256').update(bridge).digest('hex').slice(0, 16)}`;
}

/**
 * The iptables-restore input that makes skiff's masquerade for its network
 * exactly right, given `iptables -t nat -S POSTROUTING`: the chain refilled
 * (traffic to the pod CIDR or to multicast goes unchanged, the rest leaves
 * with the node's address, as the bridge plugin's per-pod rules do), one
 * POSTROUTING jump for the pods' source CIDR, and no jump for a CIDR the
 * network had before.
 */
export function networkMasqRestoreInput(postrouting: string, bridge: string, cidr: string): string {
  const chain = networkMasqChain(bridge);
  const subnet = subnetOf(cidr);
  const jumps = postrouting.split('\n').filter((l) => l.startsWith('-A POSTROUTING ') && l.endsWith(` -j ${chain}`));
  const keep = jumps.find((l) => l.includes(` -s ${subnet} `));
  return [
    '*nat',
    // Declared under --noflush, an existing user chain is emptied before the lines below refill it.
    `:${chain} - [0:0]`,
    `-A ${chain} -d ${subnet} -j RETURN`,
    `-A ${chain} -d 224.0.0.0/4 -j RETURN`,
    `-A ${chain} -j MASQUERADE`,
    ...jumps.filter((l) => l !== keep).map((l) => `-D ${l.slice(3)}`),
    ...(keep ? [] : [`-A POSTROUTING -s ${subnet} -m comment --comment "skiff pods on ${bridge}" -j ${chain}`]),
    'COMMIT',
    '',
  ].join('\n');
}

/** Writes skiff's masquerade for its network (see networkMasqRestoreInput): one `iptables -S` and one `iptables-restore`. */
export async function ensureNetworkMasq(runner: Runner, bridge: string, cidr: string): Promise<void> {
  const list = await runner('iptables', ['-w', '5', '-t', 'nat', '-S', 'POSTROUTING'], { timeoutMs: 15_000 });
  if (list.code !== 0 || list.timedOut) {
    throw new SkiffError('Internal', `masquerade for the pod network: iptables -t nat -S POSTROUTING failed${list.timedOut ? ' (timed out)' : ''}: ${list.stderr.trim().slice(0, 500) || `exit ${list.code}`}`);
  }
  const input = networkMasqRestoreInput(list.stdout, bridge, cidr);
  const res = await runner('iptables-restore', ['-w', '5', '--noflush'], { input, timeoutMs: 15_000 });
  if (res.code !== 0 || res.timedOut) {
    throw new SkiffError('Internal', `masquerade for the pod network: iptables-restore failed${res.timedOut ? ' (timed out)' : ''}: ${res.stderr.trim().slice(0, 500) || `exit ${res.code}`}`);
  }
}
