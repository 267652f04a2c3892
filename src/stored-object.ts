/**
 * The node's objects as its parts exchange them: one Kubernetes object of
 * any kind, as written (no defaults applied), with the identity the agent
 * gives it and where it came from. The agent, the controllers and the proxy
 * all read these, so the type lives beneath all three.
 */

/** Where an object was read from: the file, the document's index in it and its first line (1-based). */
export interface ObjectSource {
  file: string;
  document: number;
  /** For an item of a List: its index in the document's `items`. */
  item?: number;
  line: number;
  /**
   * For the node API's copy of an object a manifest file defines (with what
   * the node's controllers set on it, as a claim's binding): that file. It
   * stands in for the file's copy, which is then no duplicate.
   */
  amends?: string;
}

/** One object from the manifest directory, of any kind, as parsed (no defaults applied). */
export interface StoredObject {
  apiVersion: string;
  kind: string;
  namespace: string;
  name: string;
  /** Stable for an unchanged object; changes when its content changes (as the kubelet's static pod UID). */
  uid: string;
  object: Record<string, unknown>;
  source: ObjectSource;
  /**
   * For an object whose uid does not follow its content (one written through
   * the node's API): changes whenever its content does, so an edit is seen.
   */
  revision?: string;
}

/** The source "file" of the objects written through the node's API, beside the manifest directory's files. */
export const API_SOURCE_FILE = '(the node API)';
