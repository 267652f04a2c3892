/**
 * Cron schedules as Kubernetes accepts them (the standard five fields —
 * minute, hour, day of month, month, day of week — with lists, ranges, steps,
 * month and weekday names, `?`, and the @yearly/@annually/@monthly/@weekly/
 * @daily/@midnight/@hourly/@every descriptors), evaluated in UTC.
 */

export interface CronSchedule {
  /** The first activation strictly after `t` (ms since the epoch), or undefined when there is none within 5 years. */
  next(t: number): number | undefined;
}

export type CronParse = { ok: true; schedule: CronSchedule } | { ok: false; error: string };

interface FieldSpec {
  name: string;
  min: number;
  max: number;
  names?: Record<string, number>;
}

const MONTHS: Record<string, number> = { jan: 1, feb: 2, mar: 3, apr: 4, may: 5, jun: 6, jul: 7, aug: 8, sep: 9, oct: 10, nov: 11, dec: 12 };
const DAYS: Record<string, number> = { sun: 0, mon: 1, tue: 2, wed: 3, thu: 4, fri: 5, sat: 6 };
const FIELDS: FieldSpec[] = [
  { name: 'minute', min: 0, max: 59 },
  { name: 'hour', min: 0, max: 23 },
  { name: 'day of month', min: 1, max: 31 },
  { name: 'month', min: 1, max: 12, names: MONTHS },
  { name: 'day of week', min: 0, max: 6, names: DAYS },
];

const DESCRIPTORS: Record<string, string> = {
  '@yearly': '0 0 1 1 *',
  '@annually': '0 0 1 1 *',
  '@monthly': '0 0 1 * *',
  '@weekly': '0 0 * * 0',
  '@daily': '0 0 * * *',
  '@midnight': '0 0 * * *',
  '@hourly': '0 * * * *',
};

interface Field {
  allowed: boolean[];
  /** Written as `*` or `?` (no step): day-of-month/day-of-week then combine with AND rather than OR. */
  star: boolean;
}

class CronError extends Error {}

function parseNumber(text: string, spec: FieldSpec): number {
  const named = spec.names?.[text.toLowerCase()];
  if (named !== undefined) return named;
  if (!/^\d+$/.test(text)) throw new CronError(`${spec.name}: ${JSON.stringify(text)} is not a number${spec.names ? ' or a name' : ''}`);
  const n = Number(text);
  if (n < spec.min || n > spec.max) throw new CronError(`${spec.name}: ${n} is outside ${spec.min}-${spec.max}`);
  return n;
}

function parseField(text: string, spec: FieldSpec): Field {
  const allowed = new Array<boolean>(spec.max + 1).fill(false);
  let star = false;
  for (const part of text.split(',')) {
    if (part === '') throw new CronError(`${spec.name}: empty list item in ${JSON.stringify(text)}`);
    const [range, stepText, ...rest] = part.split('/');
    if (rest.length) throw new CronError(`${spec.name}: too many '/' in ${JSON.stringify(part)}`);
    let lo: number;
    let hi: number;
    let isStar = false;
    if (range === '*' || range === '?') {
      lo = spec.min;
      hi = spec.max;
      isStar = true;
    } else {
      const bounds = range!.split('-');
      if (bounds.length > 2) throw new CronError(`${spec.name}: too many '-' in ${JSON.stringify(part)}`);
      lo = parseNumber(bounds[0]!, spec);
      hi = bounds.length === 2 ? parseNumber(bounds[1]!, spec) : lo;
      // "N/step" means from N to the end of the range.
      if (bounds.length === 1 && stepText !== undefined) hi = spec.max;
      if (lo > hi) throw new CronError(`${spec.name}: range ${JSON.stringify(part)} runs backwards`);
    }
    let step = 1;
    if (stepText !== undefined) {
      if (!/^\d+$/.test(stepText) || Number(stepText) === 0) throw new CronError(`${spec.name}: step ${JSON.stringify(stepText)} must be a positive number`);
      step = Number(stepText);
    }
    if (isStar && step === 1) star = true;
    for (let v = lo; v <= hi; v += step) allowed[v] = true;
  }
  return { allowed, star };
}

/** Go's time.ParseDuration for the units a schedule can use (h, m, s, ms, us, µs, ns). */
function parseGoDuration(text: string): number {
  const unit: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1000, ms: 1, us: 0.001, 'µs': 0.001, ns: 0.000001 };
  if (!/^(\d+(\.\d+)?(h|ms|m|s|us|µs|ns))+$/.test(text)) throw new CronError(`@every: ${JSON.stringify(text)} is not a duration like 1h30m`);
  let ms = 0;
  for (const m of text.matchAll(/(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)/g)) ms += Number(m[1]) * unit[m[2]!]!;
  return ms;
}

const MINUTE = 60_000;
const HORIZON = 5 * 366 * 24 * 3_600_000;

class FieldSchedule implements CronSchedule {
  constructor(private readonly f: Field[]) {}

  private dayMatches(d: Date): boolean {
    const dom = this.f[2]!;
    const dow = this.f[4]!;
    const a = dom.allowed[d.getUTCDate()]!;
    const b = dow.allowed[d.getUTCDay()]!;
    return dom.star || dow.star ? a && b : a || b;
  }

  next(t: number): number | undefined {
    const [minute, hour, , month] = this.f as [Field, Field, Field, Field, Field];
    let c = Math.floor(t / MINUTE) * MINUTE + MINUTE;
    const limit = t + HORIZON;
    while (c <= limit) {
      const d = new Date(c);
      if (!month.allowed[d.getUTCMonth() + 1]) {
        c = Date.UTC(d.getUTCFullYear(), d.getUTCMonth() + 1, 1);
        continue;
      }
      if (!this.dayMatches(d)) {
        c = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate() + 1);
        continue;
      }
      if (!hour.allowed[d.getUTCHours()]) {
        c = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate(), d.getUTCHours() + 1);
        continue;
      }
      if (!minute.allowed[d.getUTCMinutes()]) {
        c += MINUTE;
        continue;
      }
      return c;
    }
    return undefined;
  }
}

class EverySchedule implements CronSchedule {
  constructor(readonly ms: number) {}
  next(t: number): number {
    // As the cron library Kubernetes uses: whole seconds, at least one.
    return Math.floor((t + this.ms) / 1000) * 1000;
  }
}

export function parseCron(text: unknown): CronParse {
  try {
    if (typeof text !== 'string') throw new CronError('the schedule must be a string');
    const s = text.trim();
    if (/^(CRON_)?TZ=/.test(s)) throw new CronError('a time zone inside the schedule is not allowed; use spec.timeZone');
    if (s.startsWith('@')) {
      if (s.startsWith('@every ')) {
        const ms = Math.max(1000, Math.floor(parseGoDuration(s.slice(7).trim()) / 1000) * 1000);
        return { ok: true, schedule: new EverySchedule(ms) };
      }
      const expanded = DESCRIPTORS[s.toLowerCase()];
      if (!expanded) throw new CronError(`unknown descriptor ${JSON.stringify(s)}`);
      return parseCron(expanded);
    }
    const parts = s.split(/\s+/);
    if (parts.length !== 5) throw new CronError(`expected 5 fields (minute hour day-of-month month day-of-week), found ${parts.length}`);
    const fields = parts.map((p, i) => parseField(p, FIELDS[i]!));
    return { ok: true, schedule: new FieldSchedule(fields) };
  } catch (e) {
    if (e instanceof CronError) return { ok: false, error: `invalid schedule ${JSON.stringify(text)}: ${e.message}` };
    throw e;
  }
}

/**
 * The latest activation in (after, now], if any. Searches growing windows back
 * from `now` so a schedule that fired every minute for a year costs no more
 * than one that fired once.
 */
export function mostRecent(schedule: CronSchedule, after: number, now: number): number | undefined {
  if (now <= after) return undefined;
  if (schedule instanceof EverySchedule) {
    const first = schedule.next(after);
    return first > now ? undefined : first + Math.floor((now - first) / schedule.ms) * schedule.ms;
  }
  for (const window of [3_600_000, 86_400_000, 32 * 86_400_000, 367 * 86_400_000, HORIZON, Infinity]) {
    const from = Math.max(after, now - window);
    let t = schedule.next(from);
    if (t === undefined || t > now) {
      if (from === after) return undefined;
      continue;
    }
    // At most one activation a minute, and a smaller window would have found any in the last hour: this ends.
    for (;;) {
      const n = schedule.next(t);
      if (n === undefined || n > now) return t;
      t = n;
    }
  }
  return undefined;
}
