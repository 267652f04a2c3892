/**
 * fieldValidation: fields a kind does not have are refused (Strict), named
 * in a warning (Warn, the default), or let through (Ignore), as the API
 * server's decoder does. The known fields are each kind's `known`; maps
 * of user keys (data, labels) are `'map'` and not looked into.
 */
import { badRequest } from './errors.js';
import type { Known, Obj } from './types.js';

export type { Known };
export type FieldValidation = 'Strict' | 'Warn' | 'Ignore';

const ownerReference: Known = { list: { apiVersion: true, kind: true, name: true, uid: true, controller: true, blockOwnerDeletion: true } };
export const META: Known = {
  name: true, generateName: true, namespace: true, selfLink: true, uid: true, resourceVersion: true, generation: true,
  creationTimestamp: true, deletionTimestamp: true, deletionGracePeriodSeconds: true, labels: 'map', annotations: 'map',
  ownerReferences: ownerReference, finalizers: true, managedFields: true,
};

export function fieldValidationOf(v: string | null): FieldValidation {
  if (v === null || v === '') return 'Warn';
  if (v === 'Strict' || v === 'Warn' || v === 'Ignore') return v;
  throw badRequest(`fieldValidation must be Strict, Warn or Ignore, not "${v}"`);
}

const isList = (k: Known): k is { list: Known } => typeof k === 'object' && Object.keys(k).length === 1 && 'list' in k;

/** The paths of fields not in `known`, at most 20 (a hostile body could name thousands). */
export function unknownFields(o: unknown, known: Known, path = '', out: string[] = []): string[] {
  if (out.length >= 20 || known === true || known === 'map' || o === null || typeof o !== 'object') return out;
  if (isList(known)) {
    if (Array.isArray(o)) o.forEach((x, i) => unknownFields(x, known.list, `${path}[${i}]`, out));
    return out;
  }
  if (Array.isArray(o)) return out;
  for (const [k, v] of Object.entries(o as Obj)) {
    const sub = (known as Record<string, Known>)[k];
    const p = path ? `${path}.${k}` : k;
    if (sub === undefined) out.push(p);
    else unknownFields(v, sub, p, out);
    if (out.length >= 20) break;
  }
  return out;
}

/** Refuses or warns as `mode` says (unknown fields are kept either way: the store keeps what it was given); returns the warnings to send. */
export function checkFields(o: Obj, known: Known, mode: FieldValidation, kind: string): string[] {
  if (mode === 'Ignore') return [];
  const unknown = unknownFields(o, known);
  if (unknown.length === 0) return [];
  if (mode === 'Strict') {
    throw badRequest(`${kind} in version "v1" cannot be handled as a ${kind}: strict decoding error: ${unknown.map((f) => `unknown field "${f}"`).join(', ')}`);
  }
  return unknown.map((f) => `unknown field "${f}"`);
}
