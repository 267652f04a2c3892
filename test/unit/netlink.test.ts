import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { ipv4Addresses } from '../../src/sys/netlink.js';

describe('IPv4 addresses from one rtnetlink dump', () => {
  it('lists what `ip -4 addr show` lists, interface by interface', () => {
    const r = spawnSync('ip', ['-j', '-4', 'addr', 'show'], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    const links = JSON.parse(r.stdout) as Array<{ ifname: string; addr_info: Array<{ family: string; local: string; prefixlen: number }> }>;
    const want = links.flatMap((l) => l.addr_info.filter((a) => a.family === 'inet').map((a) => ({ ifname: l.ifname, local: a.local, prefixlen: a.prefixlen })));
    // At least the loopback's, whatever else this machine has.
    expect(want).toContainEqual({ ifname: 'lo', local: '127.0.0.1', prefixlen: 8 });
    expect(ipv4Addresses()).toEqual(want);
  });
});
