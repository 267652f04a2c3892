/** What every kind shares: the object's shape, and what a kind adds to the generic store (its strategy). */
import type { Cause } from './errors.js';

export type Obj = Record<string, unknown>;

/** The fields a kind knows, for fieldValidation: `true` a leaf, `'map'` any keys, a nested shape, or `{ list }` of one. */
export type Known = true | 'map' | { [field: string]: Known } | { list: Known };

export interface ObjectMeta {
  name?: string;
  generateName?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  deletionGracePeriodSeconds?: number;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: Obj[];
  managedFields?: Obj[];
  [k: string]: unknown;
}

export interface ApiObject {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
  [k: string]: unknown;
}

export interface TableColumn {
  name: string;
  type: 'string' | 'integer' | 'date' | 'number' | 'boolean';
  format?: string;
  description?: string;
  priority?: number;
}

/**
 * A kind: its names as discovery shows them, and the strategy the generic
 * store calls (kube-apiserver's RESTCreateStrategy / RESTUpdateStrategy and
 * table convertor), so adding a kind never copies CRUD or watch code.
 */
export interface Kind {
  group: string;
  version: string;
  kind: string;
  /** The resource: lower-case plural, as in URLs. */
  plural: string;
  singular: string;
  shortNames: string[];
  /** As discovery lists them: `all` puts the kind in `kubectl get all`. */
  categories?: string[];
  namespaced: boolean;
  /** The verbs discovery lists; all of them unless a kind says (a review that is only created). */
  verbs?: string[];
  /**
   * The kind has a status subresource: writes to the object keep its status,
   * writes to /status change only the status (kube-apiserver's status strategy).
   */
  status?: boolean;
  /**
   * Deleted gracefully: a delete marks the object with deletionTimestamp and
   * deletionGracePeriodSeconds (this default unless the request says), and
   * the node deletes it again with 0 once it has stopped it. 0 removes at once.
   */
  graceful?: (o: ApiObject) => number;
  /**
   * The kind has a scale subresource (autoscaling/v1 Scale, as `kubectl
   * scale` writes it): where its replicas are wanted and counted, as dotted
   * paths, and its pods' label selector in the text form Scale carries.
   */
  scale?: { specReplicasPath: string; statusReplicasPath: string; selector: (o: ApiObject) => string };
  /** The part of the object whose change bumps metadata.generation; none: the kind has no generation. */
  spec?: (o: ApiObject) => unknown;
  /** Defaults and normalisation on create (and on update, after PrepareForUpdate). */
  prepare?: (o: ApiObject, old?: ApiObject) => void;
  /**
   * On an object a manifest file defines, the fields the node's controllers
   * set, as a cluster's controllers set them on any object (a claim's
   * volumeName and binding annotations): copies those `from` has and `into`
   * lacks. A write to a file's object that changes only these is taken, and
   * the file's next reading keeps them.
   */
  nodeSet?: (from: ApiObject, into: ApiObject) => void;
  validate: (o: ApiObject) => Cause[];
  /**
   * Checks against the other objects the store holds (a Service's cluster IP
   * or node port taken by another), after validate; `others` lists the
   * stored objects of a resource, read-only.
   */
  admit?: (o: ApiObject, others: (resource: string) => Iterable<ApiObject>) => Cause[];
  /**
   * A mutating admission on create, before validation, with the stored
   * objects to read (the DefaultStorageClass admission giving a claim the
   * default class); it changes `o` in place.
   */
  admitCreate?: (o: ApiObject, others: (resource: string) => Iterable<ApiObject>) => void;
  /** The fields the kind has, for fieldValidation (apiVersion, kind and metadata are everyone's). */
  known: Record<string, Known>;
  /** Field selectors beyond metadata.name and metadata.namespace: label → value in the object. */
  fields?: Record<string, (o: ApiObject) => string | undefined>;
  columns: TableColumn[];
  /** One table row's cells, in the columns' order, as kubectl prints them (ages already as "5m"). */
  row: (o: ApiObject, now: number) => unknown[];
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

export interface WatchEvent {
  type: WatchEventType;
  object: ApiObject;
}

/** The kind's resource as the store and its clients name it: "pods", or "deployments.apps" for a named group. */
export function resourceOf(k: Pick<Kind, 'group' | 'plural'>): string {
  return k.group ? `${k.plural}.${k.group}` : k.plural;
}

/** apiVersion as objects of the kind carry it: "v1" or "apps/v1". */
export function groupVersionOf(k: Pick<Kind, 'group' | 'version'>): string {
  return k.group ? `${k.group}/${k.version}` : k.version;
}
