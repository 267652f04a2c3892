/**
 * Why a manifest's object is not acted on by this node: every document of a
 * kind nothing here serves or runs is named with a reason, so that a user
 * can tell "skipped" from "running". The reasons say what the node lacks,
 * by API group first (RBAC as a whole), then by kind.
 */

/** A kind as a manifest names it. */
export interface ManifestKind {
  apiVersion: string;
  kind: string;
}

const BY_GROUP: Record<string, string> = {
  'apiextensions.k8s.io': 'custom resource definitions are not served by this node',
  'admissionregistration.k8s.io': 'admission webhooks and policies are not run by this node',
  'apiregistration.k8s.io': 'API aggregation is not served by this node',
  autoscaling: 'no autoscaler runs on this node (nor a metrics server)',
  'certificates.k8s.io': 'certificates are not signed by this node',
  'flowcontrol.apiserver.k8s.io': 'API priority and fairness is not used by this node',
  'storage.k8s.io': 'CSI drivers, volume attachments and storage capacities are not used by this node (its local provisioner needs none)',
  'node.k8s.io': 'runtime classes are not used by this node',
  'scheduling.k8s.io': 'pod priority and preemption are not used by this node',
  'resource.k8s.io': 'dynamic resource allocation is not used by this node',
  'gateway.networking.k8s.io': 'no Gateway API controller on this node',
  'monitoring.coreos.com': 'a Prometheus operator resource; no operator for it on this node',
};

const BY_KIND: Record<string, string> = {
  'networking.k8s.io/Ingress': 'no ingress controller on this node',
  'networking.k8s.io/IngressClass': 'no ingress controller on this node',
  'networking.k8s.io/IPAddress': 'service IPs are allocated by this node itself',
  'networking.k8s.io/ServiceCIDR': 'service IPs are allocated by this node itself (--service-cidr)',
  'policy/PodSecurityPolicy': 'PodSecurityPolicy was removed from Kubernetes (1.25) and is not enforced',
  '/LimitRange': 'limit ranges are not enforced on this node',
  '/ResourceQuota': 'resource quotas are not enforced on this node',
  '/PodTemplate': 'pod templates are not kept by this node',
  '/Binding': 'a Binding is an action on the API, not an object to keep',
  '/ComponentStatus': 'a report of the API server, not an object to keep',
};

function groupOf(apiVersion: string): string {
  const slash = apiVersion.indexOf('/');
  return slash < 0 ? '' : apiVersion.slice(0, slash);
}

/**
 * Why an object of `k` is skipped here, or undefined when the node acts on
 * it. `acts` lists what the node serves or runs; a kind it serves under
 * another version says so (a `policy/v1beta1` PodDisruptionBudget).
 */
export function skipReason(k: ManifestKind, acts: ReadonlyArray<ManifestKind>): string | undefined {
  if (acts.some((a) => a.kind === k.kind && a.apiVersion === k.apiVersion)) return undefined;
  const group = groupOf(k.apiVersion);
  const served = acts.filter((a) => a.kind === k.kind && groupOf(a.apiVersion) === group).map((a) => a.apiVersion);
  if (served.length > 0) return `${k.apiVersion} is not served by this node; it serves ${k.kind} as ${served.join(', ')}`;
  const why = BY_KIND[`${group}/${k.kind}`] ?? BY_GROUP[group];
  if (why) return why;
  if (group === '' || group.endsWith('.k8s.io') || !group.includes('.')) return `${k.apiVersion} ${k.kind} is not a kind this node serves`;
  return `a custom resource (${k.apiVersion}); no controller for it on this node`;
}

/** The problem's reason for a skipped object: `skipped: Ingress — no ingress controller on this node`. */
export function skippedMessage(kind: string, reason: string): string {
  return `skipped: ${kind} — ${reason}`;
}
