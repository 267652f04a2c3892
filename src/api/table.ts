/** Objects as meta.k8s.io/v1 Tables, with each kind's columns, as `kubectl get` asks for them. */
import type { ApiObject, Kind } from './types.js';

export type IncludeObject = 'None' | 'Metadata' | 'Object';

export const TABLE_CONTENT_TYPE = 'application/json;as=Table;v=v1;g=meta.k8s.io';

/** Whether the Accept header asks for a Table (kubectl lists the v1 and v1beta1 forms, then plain JSON). */
export function wantsTable(accept: string | undefined): boolean {
  return (accept ?? '').split(',').some((part) => {
    const p = part.replace(/\s/g, '');
    return p.includes('as=Table') && p.includes('g=meta.k8s.io') && (p.includes('v=v1;') || p.endsWith('v=v1'));
  });
}

export function toTable(kind: Kind, objects: ApiObject[], meta: { resourceVersion?: string; continue?: string }, include: IncludeObject, now: number, columns = true): object {
  return {
    kind: 'Table',
    apiVersion: 'meta.k8s.io/v1',
    metadata: meta,
    ...(columns ? { columnDefinitions: kind.columns.map((c) => ({ name: c.name, type: c.type, format: c.format ?? '', description: c.description ?? '', priority: c.priority ?? 0 })) } : { columnDefinitions: null }),
    rows: objects.map((o) => ({
      cells: kind.row(o, now),
      ...(include === 'None' ? {} : { object: include === 'Object' ? o : { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: o.metadata } }),
    })),
  };
}
