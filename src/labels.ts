/**
 * Label selectors and object keys, written once for every part: CRI's
 * equality selectors (ListContainers' label_selector, a Service's selector),
 * the API's LabelSelector with matchExpressions (a Deployment's), and the
 * `namespace/name` key every store and index uses.
 */

/** The API's set-based selector (`spec.selector` of Deployments, Jobs, DaemonSets). */
export interface LabelSelector {
  matchLabels?: Record<string, string>;
  matchExpressions?: Array<{ key: string; operator: string; values?: string[] }>;
}

/** Whether `labels` hold every pair of an equality selector; the empty selector matches everything. */
export function matchesLabels(selector: Record<string, string>, labels: Record<string, string> | undefined): boolean {
  for (const [k, v] of Object.entries(selector)) if (labels?.[k] !== v) return false;
  return true;
}

/** Whether `labels` match a LabelSelector; an unknown operator matches nothing, as the API's parser refuses it. */
export function selectorMatches(sel: LabelSelector, labels: Record<string, string>): boolean {
  if (!matchesLabels(sel.matchLabels ?? {}, labels)) return false;
  for (const e of sel.matchExpressions ?? []) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const values = e.values ?? [];
    switch (e.operator) {
      case 'In':
        if (!has || !values.includes(labels[e.key]!)) return false;
        break;
      case 'NotIn':
        if (has && values.includes(labels[e.key]!)) return false;
        break;
      case 'Exists':
        if (!has) return false;
        break;
      case 'DoesNotExist':
        if (has) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

/** The key of a namespaced object in every store and index: `namespace/name`. */
export function namespacedKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

/** The key of an object from its metadata (namespace `default` when unset). */
export function keyOf(o: { metadata?: { namespace?: string; name?: string } }): string {
  return namespacedKey(o.metadata?.namespace ?? 'default', o.metadata?.name ?? '');
}
