/**
 * The manifest directory's objects, shown through the API: each one of a
 * kind the API serves is mirrored into the store, read-only and owned by its
 * file, and follows the file's edits and removal. Only the shape of the
 * agent's object store is known here, not the agent.
 */
import { createHash } from 'node:crypto';
import type { Logger } from '../log.js';
import { API_SOURCE_FILE, type ObjectSource, type StoredObject } from '../stored-object.js';
import type { Store } from './store.js';
import type { ApiObject, Kind } from './types.js';

/** A manifest file's object as the agent's store holds it; only its file is needed of where it came from. */
export type FileObject = Omit<StoredObject, 'source'> & { source: Pick<ObjectSource, 'file'> };

export interface FileObjects {
  list(): FileObject[];
  subscribe(listener: (changes: Array<{ type: 'added' | 'modified' | 'deleted'; object: FileObject }>) => void): () => void;
}

/**
 * Kinds whose file objects keep the agent's uid, which follows their content:
 * an edited Pod is a new pod (as a static pod's uid is), and an edited Job
 * starts over. Every other kind keeps one uid through its file's edits, as
 * an object updated through the API keeps its own, so what it owns (a
 * Deployment's ReplicaSets) stays owned.
 */
const CONTENT_UIDS = new Set(['Pod', 'Job']);

function stableUid(o: FileObject): string {
  const h = createHash('sha256').update(`manifest\0${o.apiVersion}\0${o.kind}\0${o.namespace}\0${o.name}`).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-8${h.slice(13, 16)}-${((parseInt(h[16]!, 16) & 0x3) | 0x8).toString(16)}${h.slice(17, 20)}-${h.slice(20, 32)}`;
}

/** Told when a file's object cannot be shown (the API refuses it, or one written through the API has its name), with why. */
export type NotShown = (o: FileObject, why: string) => void;

export function showManifestObjects(store: Store, files: FileObjects, log: Logger, notShown?: NotShown): () => void {
  const kindOf = (o: FileObject): Kind | undefined => store.kindList().find((k) => o.kind === k.kind && o.apiVersion === (k.group ? `${k.group}/${k.version}` : k.version));
  const show = (o: FileObject) => {
    if (o.source.file === API_SOURCE_FILE) return; // the API's own, handed to the agent
    const kind = kindOf(o);
    if (!kind) return;
    const meta = (typeof o.object.metadata === 'object' && o.object.metadata !== null ? o.object.metadata : {}) as Record<string, unknown>;
    const object = { ...o.object, metadata: { ...meta, name: o.name, namespace: o.namespace, uid: CONTENT_UIDS.has(o.kind) ? o.uid : stableUid(o) } } as ApiObject;
    try {
      if (!store.mirror(kind, object, `the manifest file ${o.source.file}`)) {
        log.warn('a manifest object has the name of one written through the API, which keeps it', { kind: o.kind, namespace: o.namespace, name: o.name, file: o.source.file });
        notShown?.(o, 'an object written through the API has its name, and keeps it');
      }
    } catch (err) {
      log.warn('a manifest object could not be shown through the API', { kind: o.kind, name: o.name, file: o.source.file, error: (err as Error).message });
      notShown?.(o, (err as Error).message);
    }
  };
  for (const o of files.list()) show(o);
  return files.subscribe((changes) => {
    for (const c of changes) {
      const kind = kindOf(c.object);
      if (!kind || c.object.source.file === API_SOURCE_FILE) continue;
      if (c.type === 'deleted') store.unmirror(kind, c.object.namespace, c.object.name);
      else show(c.object);
    }
  });
}
