/**
 * The history a DaemonSet or StatefulSet keeps as ControllerRevisions, as
 * upstream's controllers keep it: one revision per pod template it has run,
 * named `<owner>-<hash>`, whose `data` is the strategic merge patch that puts
 * that template back (what `kubectl rollout undo` sends) and whose
 * `revision` numbers them. A template seen before (a rollback) makes its old
 * revision the newest again instead of a new one; old revisions nothing runs
 * any more go beyond revisionHistoryLimit, oldest first. Pure: the caller
 * writes what the plan says.
 */
import { templateHash } from './common.js';

export const CONTROLLER_REVISION_HASH = 'controller-revision-hash';

export interface Revision {
  name: string;
  revision: number;
  /** The template the revision restores (its data's spec.template without the directive). */
  template: Record<string, unknown>;
}

export interface RevisionPlan {
  /** The revision of the owner's current template. */
  update: Revision;
  hash: string;
  /** A revision to create (the update one, new). */
  create?: Revision & { data: Record<string, unknown> };
  /** Revisions whose number moves (name → new revision). */
  renumber: Array<{ name: string; revision: number }>;
  /** Revisions to delete. */
  prune: string[];
}

/** The patch a revision stores: the whole template, replacing what is there. */
export function revisionData(template: Record<string, unknown>): Record<string, unknown> {
  return { spec: { template: { ...structuredClone(template), $patch: 'replace' } } };
}

/** A stored revision's template, out of its data (undefined when it holds none). */
export function templateOfData(data: unknown): Record<string, unknown> | undefined {
  const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObj(data) || !isObj(data.spec) || !isObj(data.spec.template)) return undefined;
  const { $patch: _p, ...t } = data.spec.template;
  return t;
}

/**
 * What to write so that `existing` (the owner's revisions) holds the current
 * `template` as the newest revision; `inUse` names revisions still run by
 * some pod (or named in the status), never pruned.
 */
export function planRevisions(owner: string, template: Record<string, unknown>, existing: Revision[], limit: number, inUse: Set<string>): RevisionPlan {
  const hash = templateHash(template);
  const name = `${owner}-${hash}`;
  const max = existing.reduce((m, r) => Math.max(m, r.revision), 0);
  const renumber: RevisionPlan['renumber'] = [];
  let update = existing.find((r) => r.name === name);
  let create: RevisionPlan['create'];
  if (!update) {
    update = { name, revision: max + 1, template };
    create = { ...update, data: revisionData(template) };
  } else if (update.revision < max || existing.some((r) => r !== update && r.revision === update!.revision)) {
    // A rollback to a template run before: that revision is the newest again.
    update = { ...update, revision: max + 1 };
    renumber.push({ name, revision: max + 1 });
  }
  const keep = new Set([...inUse, name]);
  const old = existing.filter((r) => !keep.has(r.name)).sort((a, b) => a.revision - b.revision);
  const prune = old.slice(0, Math.max(0, old.length - Math.max(0, limit))).map((r) => r.name);
  return { update, hash, ...(create ? { create } : {}), renumber, prune };
}
