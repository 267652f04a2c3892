import { describe, expect, it } from 'vitest';
import { mostRecent, parseCron } from '../../src/controllers/cron.js';

const at = (s: string) => Date.parse(s);
const iso = (t: number | undefined) => (t === undefined ? undefined : new Date(t).toISOString().replace('.000Z', 'Z'));

function nexts(expr: string, from: string, n: number): Array<string | undefined> {
  const p = parseCron(expr);
  if (!p.ok) throw new Error(p.error);
  const out: Array<string | undefined> = [];
  let t: number | undefined = at(from);
  for (let i = 0; i < n && t !== undefined; i++) {
    t = p.schedule.next(t);
    out.push(iso(t));
  }
  return out;
}

describe('cron parser', () => {
  const cases: Array<[string, string, string[]]> = [
    ['* * * * *', '2026-01-01T00:00:30Z', ['2026-01-01T00:01:00Z', '2026-01-01T00:02:00Z']],
    ['*/15 * * * *', '2026-01-01T00:07:00Z', ['2026-01-01T00:15:00Z', '2026-01-01T00:30:00Z', '2026-01-01T00:45:00Z', '2026-01-01T01:00:00Z']],
    ['5 4 * * *', '2026-01-01T04:05:00Z', ['2026-01-02T04:05:00Z']],
    ['0 22 * * 1-5', '2026-01-02T23:00:00Z', ['2026-01-05T22:00:00Z', '2026-01-06T22:00:00Z']], // Fri → Mon
    ['0 0,12 1 */2 *', '2026-01-01T06:00:00Z', ['2026-01-01T12:00:00Z', '2026-03-01T00:00:00Z', '2026-03-01T12:00:00Z']],
    ['0 9 * JAN-mar Mon', '2026-03-29T00:00:00Z', ['2026-03-30T09:00:00Z', '2027-01-04T09:00:00Z']],
    ['30 2 15 * ?', '2026-01-20T00:00:00Z', ['2026-02-15T02:30:00Z']],
    // Both day fields restricted: either matches (1st of the month OR a Sunday).
    ['0 0 1 * 0', '2026-01-01T00:00:00Z', ['2026-01-04T00:00:00Z', '2026-01-11T00:00:00Z', '2026-01-18T00:00:00Z', '2026-01-25T00:00:00Z', '2026-02-01T00:00:00Z']],
    // A stepped star is a restriction too: 1st of the month OR an even weekday.
    ['0 0 1 * */2', '2026-01-01T00:00:00Z', ['2026-01-03T00:00:00Z', '2026-01-04T00:00:00Z', '2026-01-06T00:00:00Z']],
    ['0 0 29 2 *', '2026-01-01T00:00:00Z', ['2028-02-29T00:00:00Z']],
    ['10/20 * * * *', '2026-01-01T00:00:00Z', ['2026-01-01T00:10:00Z', '2026-01-01T00:30:00Z', '2026-01-01T00:50:00Z', '2026-01-01T01:10:00Z']],
    ['@hourly', '2026-01-01T00:00:00Z', ['2026-01-01T01:00:00Z']],
    ['@daily', '2026-01-01T00:00:00Z', ['2026-01-02T00:00:00Z']],
    ['@midnight', '2026-01-01T10:00:00Z', ['2026-01-02T00:00:00Z']],
    ['@weekly', '2026-01-01T00:00:00Z', ['2026-01-04T00:00:00Z']],
    ['@monthly', '2026-01-15T00:00:00Z', ['2026-02-01T00:00:00Z']],
    ['@yearly', '2026-01-15T00:00:00Z', ['2027-01-01T00:00:00Z']],
    ['@annually', '2026-01-15T00:00:00Z', ['2027-01-01T00:00:00Z']],
    ['@every 1h30m', '2026-01-01T00:00:00Z', ['2026-01-01T01:30:00Z', '2026-01-01T03:00:00Z']],
  ];
  it.each(cases)('%s from %s', (expr, from, want) => {
    expect(nexts(expr, from, want.length)).toEqual(want);
  });

  it('never finds an impossible date', () => {
    expect(nexts('0 0 30 2 *', '2026-01-01T00:00:00Z', 1)).toEqual([undefined]);
  });

  const bad: Array<[unknown, RegExp]> = [
    ['', /expected 5 fields/],
    ['* * * *', /expected 5 fields .*found 4/],
    ['* * * * * *', /found 6/],
    ['60 * * * *', /minute: 60 is outside 0-59/],
    ['* 24 * * *', /hour: 24/],
    ['* * 0 * *', /day of month: 0/],
    ['* * * 13 *', /month: 13/],
    ['* * * * 7', /day of week: 7 is outside 0-6/],
    ['*/0 * * * *', /step "0"/],
    ['5-1 * * * *', /runs backwards/],
    ['a * * * *', /"a" is not a number/],
    ['* * * FOO *', /"FOO" is not a number or a name/],
    ['1,,2 * * * *', /empty list item/],
    ['1-2-3 * * * *', /too many '-'/],
    ['*/2/3 * * * *', /too many '\/'/],
    ['@often', /unknown descriptor/],
    ['@every soon', /not a duration/],
    ['CRON_TZ=UTC * * * * *', /time zone inside the schedule/],
    ['TZ=Europe/Paris 0 * * * *', /time zone/],
    [42, /must be a string/],
    [null, /must be a string/],
  ];
  it.each(bad)('rejects %j', (expr, msg) => {
    const p = parseCron(expr);
    expect(p.ok).toBe(false);
    if (!p.ok) expect(p.error).toMatch(msg);
  });

  it('mostRecent finds the latest activation in (after, now], however dense or sparse', () => {
    const every = parseCron('* * * * *');
    const yearly = parseCron('@yearly');
    const evry = parseCron('@every 10s');
    if (!every.ok || !yearly.ok || !evry.ok) throw new Error('parse');
    expect(iso(mostRecent(every.schedule, at('2025-01-01T00:00:00Z'), at('2026-01-01T10:20:30Z')))).toBe('2026-01-01T10:20:00Z');
    expect(iso(mostRecent(yearly.schedule, at('2020-06-01T00:00:00Z'), at('2026-03-01T00:00:00Z')))).toBe('2026-01-01T00:00:00Z');
    expect(mostRecent(yearly.schedule, at('2026-01-01T00:00:00Z'), at('2026-03-01T00:00:00Z'))).toBeUndefined();
    expect(mostRecent(every.schedule, at('2026-01-01T00:00:00Z'), at('2026-01-01T00:00:59Z'))).toBeUndefined();
    expect(iso(mostRecent(every.schedule, at('2026-01-01T00:00:00Z'), at('2026-01-01T00:01:00Z')))).toBe('2026-01-01T00:01:00Z');
    expect(iso(mostRecent(evry.schedule, at('2026-01-01T00:00:00Z'), at('2026-01-01T00:00:35Z')))).toBe('2026-01-01T00:00:30Z');
    const t0 = performance.now();
    mostRecent(every.schedule, 0, at('2026-01-01T00:00:00Z'));
    expect(performance.now() - t0).toBeLessThan(500);
  });
});
