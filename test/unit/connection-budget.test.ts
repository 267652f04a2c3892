import { describe, expect, it } from 'vitest';
import { budgetLimits, ConnectionBudget, UNKNOWN_UID } from '../../src/kubelet-lite/connection-budget.js';

describe('budgetLimits', () => {
  it('keeps a quarter for root and 16 per user by default, and never more per user than the share', () => {
    expect(budgetLimits(128)).toEqual({ max: 128, perUser: 16, reservedForRoot: 32 });
    expect(budgetLimits(3)).toEqual({ max: 3, perUser: 3, reservedForRoot: 0 });
    expect(budgetLimits(24, 6, 8)).toEqual({ max: 24, perUser: 6, reservedForRoot: 8 });
    expect(budgetLimits(10, 50, 8)).toEqual({ max: 10, perUser: 2, reservedForRoot: 8 });
    expect(budgetLimits(4, 2, 9).reservedForRoot).toBe(4);
  });
});

describe('ConnectionBudget', () => {
  const fill = (b: ConnectionBudget<string>, uid: number, n: number, prefix = `u${uid}-`) => {
    for (let i = 0; i < n; i++) expect(b.admit(`${prefix}${i}`, uid)).toEqual({ admit: true });
  };

  it('refuses a non-root uid past its own bound, and root never for that', () => {
    const b = new ConnectionBudget<string>({ max: 10, perUser: 2, reservedForRoot: 4 });
    fill(b, 1000, 2);
    expect(b.admit('x', 1000)).toEqual({ admit: false, reason: 'per-user' });
    fill(b, UNKNOWN_UID, 2);
    expect(b.admit('y', UNKNOWN_UID)).toEqual({ admit: false, reason: 'per-user' });
    fill(b, 0, 6);
    expect(b.size).toBe(10);
    expect(b.heldByNonRoot).toBe(4);
  });

  it('keeps the reserved room out of reach of non-root uids together', () => {
    const b = new ConnectionBudget<string>({ max: 8, perUser: 2, reservedForRoot: 4 });
    fill(b, 1, 2);
    fill(b, 2, 2);
    // The share (4) is full: newcomers holding nothing take the place of one of those holding two...
    expect(b.admit('c', 3)).toEqual({ admit: true, shed: { conn: 'u1-0', uid: 1 } });
    expect(b.admit('d', 4)).toEqual({ admit: true, shed: { conn: 'u2-0', uid: 2 } });
    // ...until everyone holds one, and no swap would be fairer: refused.
    expect(b.admit('e', 5)).toEqual({ admit: false, reason: 'share' });
    expect(b.heldByNonRoot).toBe(4);
    fill(b, 0, 4);
    expect(b.size).toBe(8);
  });

  it('sheds for a newcomer a waiting connection of the uid holding most, before an answering one', () => {
    const b = new ConnectionBudget<string>({ max: 8, perUser: 4, reservedForRoot: 2 });
    fill(b, 1, 4);
    fill(b, 2, 2);
    b.setBusy('u1-0', true);
    // uid 3 holds nothing, uid 1 holds four: uid 1's oldest waiting connection makes way.
    expect(b.admit('c', 3)).toEqual({ admit: true, shed: { conn: 'u1-1', uid: 1 } });
    expect(b.held(1)).toBe(3);
    expect(b.heldByNonRoot).toBe(6);
    // uid 2 (two) against uid 1 (three): taking one of uid 1's would leave it no less than uid 2.
    expect(b.admit('d', 2)).toEqual({ admit: false, reason: 'share' });
  });

  it('lets root displace any non-root connection when the server is full, and refuses root only when root holds it all', () => {
    const b = new ConnectionBudget<string>({ max: 4, perUser: 4, reservedForRoot: 0 });
    fill(b, 1, 3);
    fill(b, 0, 1);
    for (let i = 0; i < 3; i++) expect(b.admit(`r${i}`, 0)).toMatchObject({ admit: true, shed: { uid: 1 } });
    expect(b.held(1)).toBe(0);
    expect(b.admit('r9', 0)).toEqual({ admit: false, reason: 'full' });
    b.remove('r0');
    b.remove('r0');
    expect(b.size).toBe(3);
    expect(b.admit('again', 1)).toEqual({ admit: true });
  });

  it('takes the busy one only when the victim has nothing else, oldest first', () => {
    const b = new ConnectionBudget<string>({ max: 3, perUser: 3, reservedForRoot: 0 });
    fill(b, 5, 3);
    for (const c of ['u5-0', 'u5-1', 'u5-2']) b.setBusy(c, true);
    expect(b.admit('root', 0)).toEqual({ admit: true, shed: { conn: 'u5-0', uid: 5 } });
    b.setBusy('u5-1', false);
    b.setBusy('u5-1', true);
    b.setBusy('u5-2', false);
    expect(b.admit('root2', 0)).toEqual({ admit: true, shed: { conn: 'u5-2', uid: 5 } });
  });
});
