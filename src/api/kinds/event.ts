/** v1 Event (core): what happened to which object, with the columns `kubectl get events` prints. */
import type { Cause } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, isObj, metaCauses, nameColumn } from './common.js';

const involved = (o: ApiObject): Obj => (isObj(o.involvedObject) ? o.involvedObject : {});
const field = (f: string) => (o: ApiObject) => String(involved(o)[f] ?? '');

function lastSeen(o: ApiObject): unknown {
  const series = isObj(o.series) ? (o.series as Obj).lastObservedTime : undefined;
  return series ?? o.lastTimestamp ?? o.eventTime ?? o.firstTimestamp ?? o.metadata.creationTimestamp;
}

export const eventKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'Event',
  plural: 'events',
  singular: 'event',
  shortNames: ['ev'],
  namespaced: true,
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    if (!isObj(o.involvedObject)) out.push({ reason: 'FieldValueRequired', field: 'involvedObject', message: 'Required value' });
    else {
      const ns = involved(o).namespace;
      if (ns !== undefined && ns !== '' && ns !== o.metadata.namespace) out.push({ reason: 'FieldValueInvalid', field: 'involvedObject.namespace', message: `Invalid value: ${JSON.stringify(ns)}: does not match event.namespace` });
    }
    if (o.type !== undefined && o.type !== 'Normal' && o.type !== 'Warning') out.push({ reason: 'FieldValueNotSupported', field: 'type', message: `Unsupported value: ${JSON.stringify(o.type)}: supported values: "Normal", "Warning"` });
    return out;
  },
  fields: {
    'involvedObject.kind': field('kind'),
    'involvedObject.namespace': field('namespace'),
    'involvedObject.name': field('name'),
    'involvedObject.uid': field('uid'),
    'involvedObject.apiVersion': field('apiVersion'),
    'involvedObject.resourceVersion': field('resourceVersion'),
    'involvedObject.fieldPath': field('fieldPath'),
    reason: (o) => String(o.reason ?? ''),
    reportingComponent: (o) => String(o.reportingComponent ?? ''),
    source: (o) => String((isObj(o.source) ? (o.source as Obj).component : undefined) ?? ''),
    type: (o) => String(o.type ?? ''),
  },
  known: {
    involvedObject: { kind: true, namespace: true, name: true, uid: true, apiVersion: true, resourceVersion: true, fieldPath: true },
    reason: true, message: true, source: { component: true, host: true }, firstTimestamp: true, lastTimestamp: true, count: true, type: true,
    eventTime: true, series: { count: true, lastObservedTime: true }, action: true, related: true, reportingComponent: true, reportingInstance: true,
  },
  columns: [
    { name: 'Last Seen', type: 'string', description: 'Time when this Event was last observed.' },
    { name: 'Type', type: 'string', description: 'Type of this event (Normal, Warning), new types could be added in the future.' },
    { name: 'Reason', type: 'string', description: 'This should be a short, machine understandable string that gives the reason for the transition into the object\'s current status.' },
    { name: 'Object', type: 'string', description: 'The object that this event is about.' },
    { name: 'Subobject', type: 'string', priority: 1, description: 'The field of the object this event is about.' },
    { name: 'Source', type: 'string', priority: 1, description: 'The component reporting this event.' },
    { name: 'Message', type: 'string', description: 'A human-readable description of the status of this operation.' },
    { name: 'First Seen', type: 'string', priority: 1, description: 'The time at which the event was first recorded.' },
    { name: 'Count', type: 'string', priority: 1, description: 'The number of times this event has occurred.' },
    { ...nameColumn, priority: 1 },
  ],
  row(o, now) {
    const inv = involved(o);
    const src = isObj(o.source) ? (o.source as Obj) : {};
    const source = [src.component ?? o.reportingComponent, src.host].filter((s) => typeof s === 'string' && s !== '').join(', ');
    return [
      age(lastSeen(o), now),
      o.type ?? '',
      o.reason ?? '',
      `${String(inv.kind ?? '').toLowerCase()}/${String(inv.name ?? '')}`,
      inv.fieldPath ?? '',
      source,
      String(o.message ?? '').trim(),
      age(o.firstTimestamp ?? o.eventTime ?? o.metadata.creationTimestamp, now),
      o.count ?? 1,
      o.metadata.name,
    ];
  },
};
