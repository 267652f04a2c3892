/** What the kinds' strategies share: field errors as Status causes, ages as kubectl prints them. */
import type { Cause } from '../errors.js';
import { formatFieldPath, metadataErrors, type FieldError } from '../../kubelet-lite/validate.js';
import type { ApiObject, Obj, TableColumn } from '../types.js';

export function causes(errs: FieldError[]): Cause[] {
  return errs.map((e) => {
    const reason = e.message.startsWith('Required value')
      ? 'FieldValueRequired'
      : e.message.startsWith('Unsupported value')
        ? 'FieldValueNotSupported'
        : e.message.startsWith('Forbidden')
          ? 'FieldValueForbidden'
          : e.message.startsWith('Invalid value') || !e.message.includes(':')
            ? 'FieldValueInvalid'
            : 'FieldValueTypeInvalid';
    return { reason, message: e.message, field: formatFieldPath(e.path) };
  });
}

export function metaCauses(o: ApiObject, namespaced: boolean): Cause[] {
  if (typeof o.metadata.labels === 'object' && o.metadata.labels !== null) {
    for (const [k, v] of Object.entries(o.metadata.labels)) if (typeof v !== 'string') return [{ reason: 'FieldValueTypeInvalid', field: `metadata.labels[${k}]`, message: 'Invalid value: must be a string' }];
  }
  return causes(metadataErrors(o.metadata as Obj, namespaced));
}

export const nameColumn: TableColumn = { name: 'Name', type: 'string', format: 'name', description: 'Name must be unique within a namespace.' };
export const ageColumn: TableColumn = { name: 'Age', type: 'string', description: 'CreationTimestamp is a timestamp representing the server time when this object was created.' };

/** apimachinery's HumanDuration: "45s", "3m20s", "5h", "12d". */
export function humanDuration(ms: number): string {
  const s = Math.floor(ms / 1000);
  if (s < -1) return '<invalid>';
  if (s < 0) return '0s';
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 10) return s % 60 === 0 ? `${m}m` : `${m}m${s % 60}s`;
  if (m < 180) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 8) return m % 60 === 0 ? `${h}h` : `${h}h${m % 60}m`;
  if (h < 48) return `${h}h`;
  const d = Math.floor(h / 24);
  if (h < 24 * 8) return h % 24 === 0 ? `${d}d` : `${d}d${h % 24}h`;
  if (h < 24 * 365 * 2) return `${d}d`;
  const y = Math.floor(d / 365);
  if (h < 24 * 365 * 8) return d % 365 === 0 ? `${y}y` : `${y}y${d % 365}d`;
  return `${y}y`;
}

export function age(ts: unknown, now: number): string {
  if (typeof ts !== 'string') return '<unknown>';
  const t = Date.parse(ts);
  return Number.isNaN(t) ? '<unknown>' : humanDuration(now - t);
}

export const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
export const size = (v: unknown): number => (isObj(v) ? Object.keys(v).length : 0);

/** Sets a default the way the API server's defaulters do: only where the field is unset. */
export function setDefault(o: Obj, field: string, value: unknown): void {
  if (o[field] === undefined || o[field] === null) o[field] = value;
}
