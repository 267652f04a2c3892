/**
 * The manifest directory's problems, where a kubectl user looks: each
 * document the node skips (a kind it does not serve or run, with why) and
 * each one it could not load becomes a Warning Event on that object, once
 * when the problem appears (`kubectl get events` lists them beside the
 * pods'). The status port's /manifests lists the same problems.
 */
import type { ManifestProblem } from '../kubelet-lite/model.js';
import type { ObjectStore } from '../kubelet-lite/store.js';
import type { ApiObject } from '../api/types.js';
import type { ControllerEvents } from './controller-events.js';

/** Events written for one change of the files at most; the rest are counted in one event on the Node. */
const MAX_PER_CHANGE = 200;

export function reportManifestProblems(objects: ObjectStore, events: ControllerEvents, nodeName: string): () => void {
  let told = new Set<string>();
  const node: ApiObject = { apiVersion: 'v1', kind: 'Node', metadata: { name: nodeName, namespace: 'default', uid: nodeName } };
  const look = () => {
    const now = new Set<string>();
    let written = 0;
    let more = 0;
    for (const p of objects.problems()) {
      const key = `${p.file}\0${p.line}\0${p.object ?? ''}\0${p.reason}`;
      now.add(key);
      if (told.has(key)) continue;
      if (written >= MAX_PER_CHANGE) {
        more++;
        continue;
      }
      written++;
      const skipped = p.reason.startsWith('skipped: ');
      events.record(involved(p) ?? node, 'Warning', skipped ? 'Skipped' : 'FailedToLoad', `${p.reason} (${p.file}, line ${p.line})`);
    }
    if (more > 0) events.record(node, 'Warning', 'ManifestProblems', `${more} more manifest problems than are written as events at once; the status port's /manifests lists them all`);
    told = now;
  };
  look();
  return objects.subscribe(() => look());
}

/** A file's object the API would not show (refused by its validation, or its name taken through the API), as a Warning event on it. */
export function notShownEvents(events: ControllerEvents): (o: { kind: string; namespace: string; name: string; source: { file: string } }, why: string) => void {
  return (o, why) => events.record({ apiVersion: '', kind: o.kind, metadata: { name: o.name, namespace: o.namespace || 'default' } }, 'Warning', 'FailedToLoad', `not shown through the API: ${why} (${o.source.file})`);
}

/** The object a problem names ("Kind/namespace/name"), as an Event's involvedObject. */
function involved(p: ManifestProblem): ApiObject | undefined {
  const m = /^([^/]+)\/([^/]*)\/(.+)$/.exec(p.object ?? '');
  if (!m) return undefined;
  return { apiVersion: '', kind: m[1]!, metadata: { name: m[3]!, namespace: m[2] || 'default' } };
}
