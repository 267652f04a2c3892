/** The kubelet's sysctl admission: safe sysctls pass, unsafe ones only when allowed, never a host namespace's. */
import { describe, expect, it } from 'vitest';
import { admitPod, normalizeSysctlName, SysctlAllowlist } from '../../src/kubelet-lite/sysctls.js';

const none = { network: false, ipc: false };

describe('sysctl admission', () => {
  it('allows the safe set and refuses the rest with the kubelet message', () => {
    const allow = new SysctlAllowlist();
    expect(allow.forbidden([{ name: 'net.ipv4.ip_local_port_range' }, { name: 'kernel.shm_rmid_forced' }, { name: 'net.ipv4.tcp_rmem' }], none)).toBeUndefined();
    expect(allow.forbidden([{ name: 'kernel.msgmax' }], none)).toBe('forbidden sysctl: "kernel.msgmax" not allowlisted');
    expect(allow.forbidden([{ name: 'net.core.somaxconn' }], none)).toBe('forbidden sysctl: "net.core.somaxconn" not allowlisted');
    expect(allow.forbidden([{ name: 'kernel.core_pattern' }], none)).toMatch(/not allowlisted/);
    expect(allow.forbidden([{ name: 'net.ipv4.ip_local_port_range' }], { network: true, ipc: false })).toBe('forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host net enabled');
    expect(allow.forbidden([{ name: 'kernel.shm_rmid_forced' }], { network: false, ipc: true })).toMatch(/not allowed with host ipc enabled/);
  });

  it('allows unsafe sysctls by name or prefix, in either separator form', () => {
    const allow = new SysctlAllowlist(['kernel.msg*', 'net.core.somaxconn', 'fs/mqueue/msg_max']);
    expect(allow.forbidden([{ name: 'kernel.msgmax' }, { name: 'kernel.msgmnb' }, { name: 'net.core.somaxconn' }, { name: 'fs.mqueue.msg_max' }], none)).toBeUndefined();
    expect(allow.forbidden([{ name: 'net/core/somaxconn' }], none)).toBeUndefined();
    expect(allow.forbidden([{ name: 'kernel.sem' }], none)).toMatch(/not allowlisted/);
    expect(normalizeSysctlName('net/ipv4/conf/eth0.100/forwarding')).toBe('net.ipv4.conf.eth0/100.forwarding');
  });

  it('refuses flag patterns that are not namespaced or not names', () => {
    expect(() => new SysctlAllowlist(['kernel.core_pattern'])).toThrow(/not a namespaced sysctl/);
    expect(() => new SysctlAllowlist(['vm.*'])).toThrow(/not a namespaced sysctl/);
    expect(() => new SysctlAllowlist(['net..x'])).toThrow(/not a sysctl name/);
    expect(() => new SysctlAllowlist(['*'])).toThrow(/not a sysctl name/);
  });

  it('turns a valid pod with a forbidden sysctl into one refused with reason SysctlForbidden', () => {
    const allow = new SysctlAllowlist();
    const pod = { spec: { containers: [], securityContext: { sysctls: [{ name: 'kernel.msgmax', value: '1' }] } } };
    expect(admitPod({ ok: true, pod }, allow)).toEqual({ ok: false, reasons: ['forbidden sysctl: "kernel.msgmax" not allowlisted'], reason: 'SysctlForbidden' });
    const fine = { spec: { containers: [], securityContext: { sysctls: [{ name: 'net.ipv4.tcp_syncookies', value: '1' }] } } };
    expect(admitPod({ ok: true, pod: fine }, allow).ok).toBe(true);
    expect(admitPod({ ok: false, reasons: ['x'] }, allow)).toEqual({ ok: false, reasons: ['x'] });
  });
});
