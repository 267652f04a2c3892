/**
 * How kubectl shows pods, as pure functions of the Pod (and the time): the
 * `get pods` columns (READY, STATUS and RESTARTS computed by kubectl's
 * rules), its tables, its ages, and the `describe pod` text.
 */
import type { Container, ContainerState, ContainerStatus, Event, Pod, Probe, Volume } from 'kubernetes-types/core/v1.js';

export { humanDuration } from './workload-format.js';
import { humanDuration } from './workload-format.js';

/** "5m" for a timestamp five minutes before `now`; "<unknown>" without one. */
export function age(timestamp: string | undefined, now: Date): string {
  if (!timestamp) return '<unknown>';
  const t = Date.parse(timestamp);
  if (Number.isNaN(t)) return '<unknown>';
  return humanDuration(now.getTime() - t);
}

export { podRow, type PodRow } from '../api/kinds/pod-row.js';
import { qosClass, type PodRow } from '../api/kinds/pod-row.js';
export { qosClass };

/** kubectl's table: left-aligned columns, three spaces apart, the last one unpadded. */
export function formatTable(rows: string[][]): string {
  const widths: number[] = [];
  for (const r of rows) r.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
  return rows.map((r) => r.map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i]! + 3))).join('') + '\n').join('');
}

export interface GetOptions {
  allNamespaces: boolean;
  wide: boolean;
}

export function podHeader(o: GetOptions): string[] {
  return [...(o.allNamespaces ? ['NAMESPACE'] : []), 'NAME', 'READY', 'STATUS', 'RESTARTS', 'AGE', ...(o.wide ? ['IP', 'NODE', 'NOMINATED NODE', 'READINESS GATES'] : [])];
}

export function podCells(r: PodRow, o: GetOptions): string[] {
  return [...(o.allNamespaces ? [r.namespace] : []), r.name, r.ready, r.status, r.restarts, r.age, ...(o.wide ? [r.ip, r.node, r.nominatedNode, r.readinessGates] : [])];
}

// ---------------------------------------------------------------- describe

/** Go's RFC1123Z, as kubectl describe prints times: "Mon, 30 Nov 2026 06:00:00 +0000". */
export function rfc1123z(timestamp: string | undefined): string {
  const t = timestamp ? new Date(timestamp) : undefined;
  if (!t || Number.isNaN(t.getTime())) return '<unknown>';
  const days = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
  const months = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
  const p = (n: number) => String(n).padStart(2, '0');
  return `${days[t.getUTCDay()]}, ${p(t.getUTCDate())} ${months[t.getUTCMonth()]} ${t.getUTCFullYear()} ${p(t.getUTCHours())}:${p(t.getUTCMinutes())}:${p(t.getUTCSeconds())} +0000`;
}

/** Lines of "Key:<tab>value" at an indent level, aligned per run of lines at the same level, as kubectl's tabwriter does. */
class DescribeWriter {
  private readonly lines: { level: number; key?: string; value: string }[] = [];

  field(level: number, key: string, value: string): void {
    this.lines.push({ level, key, value });
  }

  text(level: number, value: string): void {
    this.lines.push({ level, value });
  }

  render(): string {
    const out: string[] = [];
    let i = 0;
    while (i < this.lines.length) {
      const l = this.lines[i]!;
      if (l.key === undefined) {
        out.push(`${'  '.repeat(l.level)}${l.value}`);
        i++;
        continue;
      }
      // A block: consecutive keyed lines at any depth share one value column.
      let j = i;
      let width = 0;
      while (j < this.lines.length && this.lines[j]!.key !== undefined) {
        const k = this.lines[j]!;
        width = Math.max(width, 2 * k.level + (k.key ? k.key.length + 1 : 0));
        j++;
      }
      for (const k of this.lines.slice(i, j)) out.push(`${`${'  '.repeat(k.level)}${k.key ? `${k.key}:` : ''}`.padEnd(width + 2)}${k.value}`);
      i = j;
    }
    return out.map((l) => l.trimEnd()).join('\n') + '\n';
  }
}

function mapText(m: Record<string, string> | undefined): string[] {
  const entries = Object.entries(m ?? {}).sort(([a], [b]) => a.localeCompare(b));
  return entries.length ? entries.map(([k, v]) => `${k}=${v}`) : ['<none>'];
}

export function probeText(p: Probe): string {
  let what: string;
  if (p.httpGet) what = `http-get ${(p.httpGet.scheme ?? 'HTTP').toLowerCase()}://${p.httpGet.host ?? ''}:${p.httpGet.port}${p.httpGet.path ?? ''}`;
  else if (p.tcpSocket) what = `tcp-socket ${p.tcpSocket.host ?? ''}:${p.tcpSocket.port}`;
  else if (p.exec) what = `exec [${(p.exec.command ?? []).join(' ')}]`;
  else if (p.grpc) what = `grpc <pod>:${p.grpc.port} ${p.grpc.service ?? ''}`.trimEnd();
  else what = 'unknown';
  return `${what} delay=${p.initialDelaySeconds ?? 0}s timeout=${p.timeoutSeconds ?? 1}s period=${p.periodSeconds ?? 10}s #success=${p.successThreshold ?? 1} #failure=${p.failureThreshold ?? 3}`;
}

function describeState(w: DescribeWriter, level: number, key: string, s: ContainerState | undefined): void {
  if (s?.running) {
    w.field(level, key, 'Running');
    w.field(level + 1, 'Started', rfc1123z(s.running.startedAt));
  } else if (s?.waiting) {
    w.field(level, key, 'Waiting');
    if (s.waiting.reason) w.field(level + 1, 'Reason', s.waiting.reason);
    if (s.waiting.message) w.field(level + 1, 'Message', s.waiting.message);
  } else if (s?.terminated) {
    const t = s.terminated;
    w.field(level, key, 'Terminated');
    if (t.reason) w.field(level + 1, 'Reason', t.reason);
    if (t.message) w.field(level + 1, 'Message', t.message);
    w.field(level + 1, 'Exit Code', String(t.exitCode));
    if (t.signal) w.field(level + 1, 'Signal', String(t.signal));
    w.field(level + 1, 'Started', rfc1123z(t.startedAt));
    w.field(level + 1, 'Finished', rfc1123z(t.finishedAt));
  } else {
    w.field(level, key, key === 'State' ? 'Waiting' : '');
  }
}

function describeContainers(w: DescribeWriter, title: string, specs: Container[], statuses: ContainerStatus[]): void {
  if (!specs.length) return;
  w.text(0, `${title}:`);
  for (const c of specs) {
    const st = statuses.find((s) => s.name === c.name);
    w.text(1, `${c.name}:`);
    if (st?.containerID) w.field(2, 'Container ID', st.containerID);
    w.field(2, 'Image', c.image ?? '');
    w.field(2, 'Image ID', st?.imageID ?? '');
    const ports = c.ports ?? [];
    w.field(2, ports.length > 1 ? 'Ports' : 'Port', ports.length ? ports.map((p) => `${p.containerPort}/${p.protocol ?? 'TCP'}`).join(', ') : '<none>');
    w.field(2, ports.length > 1 ? 'Host Ports' : 'Host Port', ports.length ? ports.map((p) => `${p.hostPort ?? 0}/${p.protocol ?? 'TCP'}`).join(', ') : '<none>');
    if (c.command?.length) w.field(2, 'Command', c.command.join(' '));
    if (c.args?.length) w.field(2, 'Args', c.args.join(' '));
    describeState(w, 2, 'State', st?.state);
    if (st?.lastState && Object.keys(st.lastState).length) describeState(w, 2, 'Last State', st.lastState);
    w.field(2, 'Ready', st?.ready ? 'True' : 'False');
    w.field(2, 'Restart Count', String(st?.restartCount ?? 0));
    const limits = Object.entries(c.resources?.limits ?? {});
    const requests = Object.entries(c.resources?.requests ?? {});
    if (limits.length) {
      w.text(2, 'Limits:');
      for (const [k, v] of limits) w.field(3, k, String(v));
    }
    if (requests.length) {
      w.text(2, 'Requests:');
      for (const [k, v] of requests) w.field(3, k, String(v));
    }
    if (c.livenessProbe) w.field(2, 'Liveness', probeText(c.livenessProbe));
    if (c.readinessProbe) w.field(2, 'Readiness', probeText(c.readinessProbe));
    if (c.startupProbe) w.field(2, 'Startup', probeText(c.startupProbe));
    const env = c.env ?? [];
    if (env.length) {
      w.text(2, 'Environment:');
      for (const e of env) {
        let v = e.value ?? '';
        if (e.valueFrom?.configMapKeyRef) v = `<set to the key '${e.valueFrom.configMapKeyRef.key}' of config map '${e.valueFrom.configMapKeyRef.name}'>`;
        else if (e.valueFrom?.secretKeyRef) v = `<set to the key '${e.valueFrom.secretKeyRef.key}' in secret '${e.valueFrom.secretKeyRef.name}'>`;
        else if (e.valueFrom?.fieldRef) v = `(${e.valueFrom.fieldRef.apiVersion ?? 'v1'}:${e.valueFrom.fieldRef.fieldPath})`;
        w.field(3, e.name, v);
      }
    } else w.field(2, 'Environment', '<none>');
    const mounts = c.volumeMounts ?? [];
    if (mounts.length) {
      w.text(2, 'Mounts:');
      for (const m of mounts) w.text(3, `${m.mountPath} from ${m.name} (${m.readOnly ? 'ro' : 'rw'}${m.subPath ? `,path="${m.subPath}"` : ''})`);
    } else w.field(2, 'Mounts', '<none>');
  }
}

function describeVolume(w: DescribeWriter, v: Volume): void {
  w.text(1, `${v.name}:`);
  if (v.configMap) {
    w.field(2, 'Type', 'ConfigMap (a volume populated by a ConfigMap)');
    w.field(2, 'Name', v.configMap.name ?? '');
    w.field(2, 'Optional', String(v.configMap.optional ?? false));
  } else if (v.secret) {
    w.field(2, 'Type', 'Secret (a volume populated by a Secret)');
    w.field(2, 'SecretName', v.secret.secretName ?? '');
    w.field(2, 'Optional', String(v.secret.optional ?? false));
  } else if (v.emptyDir) {
    w.field(2, 'Type', "EmptyDir (a temporary directory that shares a pod's lifetime)");
    w.field(2, 'Medium', v.emptyDir.medium ?? '');
    w.field(2, 'SizeLimit', v.emptyDir.sizeLimit ? String(v.emptyDir.sizeLimit) : '<unset>');
  } else if (v.hostPath) {
    w.field(2, 'Type', 'HostPath (bare host directory volume)');
    w.field(2, 'Path', v.hostPath.path);
    w.field(2, 'HostPathType', v.hostPath.type ?? '');
  } else if (v.projected) {
    w.field(2, 'Type', 'Projected (a volume that contains injected data from multiple sources)');
  } else if (v.downwardAPI) {
    w.field(2, 'Type', 'DownwardAPI (a volume populated by information about the pod)');
    w.text(2, 'Items:');
    for (const i of v.downwardAPI.items ?? []) w.text(3, `${i.fieldRef?.fieldPath ?? i.resourceFieldRef?.resource ?? ''} -> ${i.path}`);
  } else {
    w.field(2, 'Type', 'Unknown');
  }
}

/** The QoS class the API server gives a pod, from its containers' requests and limits. */
/** `kubectl describe pod`'s text. */
export function describePod(pod: Pod, events: Event[], now: Date): string {
  const w = new DescribeWriter();
  const md = pod.metadata ?? {};
  const st = pod.status ?? {};
  w.field(0, 'Name', md.name ?? '');
  w.field(0, 'Namespace', md.namespace ?? 'default');
  w.field(0, 'Priority', String(pod.spec?.priority ?? 0));
  w.field(0, 'Service Account', pod.spec?.serviceAccountName ?? 'default');
  w.field(0, 'Node', pod.spec?.nodeName ? `${pod.spec.nodeName}${st.hostIP ? `/${st.hostIP}` : ''}` : '<none>');
  w.field(0, 'Start Time', st.startTime ? rfc1123z(st.startTime) : '<none>');
  const labels = mapText(md.labels);
  w.field(0, 'Labels', labels[0]!);
  for (const l of labels.slice(1)) w.field(0, '', l);
  const annotations = mapText(md.annotations);
  w.field(0, 'Annotations', annotations[0]!);
  for (const l of annotations.slice(1)) w.field(0, '', l);
  if (md.deletionTimestamp) w.field(0, 'Status', `Terminating (lasts ${age(md.deletionTimestamp, now)})`);
  else w.field(0, 'Status', st.phase ?? 'Unknown');
  if (st.reason) w.field(0, 'Reason', st.reason);
  if (st.message) w.field(0, 'Message', st.message);
  w.field(0, 'IP', st.podIP ?? '');
  if ((st.podIPs ?? []).length) w.text(0, 'IPs:');
  else w.field(0, 'IPs', '<none>');
  for (const ip of st.podIPs ?? []) w.field(1, 'IP', ip.ip ?? '');
  describeContainers(w, 'Init Containers', pod.spec?.initContainers ?? [], st.initContainerStatuses ?? []);
  describeContainers(w, 'Containers', pod.spec?.containers ?? [], st.containerStatuses ?? []);
  const conditions = st.conditions ?? [];
  if (conditions.length) {
    w.text(0, 'Conditions:');
    const rows = [['Type', 'Status'], ...conditions.map((c) => [c.type, c.status])];
    for (const line of formatTable(rows).trimEnd().split('\n')) w.text(1, line);
  }
  const volumes = pod.spec?.volumes ?? [];
  if (volumes.length) {
    w.text(0, 'Volumes:');
    for (const v of volumes) describeVolume(w, v);
  } else w.field(0, 'Volumes', '<none>');
  w.field(0, 'QoS Class', qosClass(pod));
  const selectors = mapText(pod.spec?.nodeSelector);
  w.field(0, 'Node-Selectors', selectors.join(', '));
  const tolerations = (pod.spec?.tolerations ?? []).map((t) => `${t.key ?? ''}${t.operator === 'Exists' ? '' : `=${t.value ?? ''}`}${t.effect ? `:${t.effect}` : ''}${t.tolerationSeconds !== undefined ? ` for ${t.tolerationSeconds}s` : ''}`);
  w.field(0, 'Tolerations', tolerations[0] ?? '<none>');
  for (const t of tolerations.slice(1)) w.field(0, '', t);
  if (!events.length) {
    w.field(0, 'Events', '<none>');
  } else {
    w.text(0, 'Events:');
    const rows = [
      ['Type', 'Reason', 'Age', 'From', 'Message'],
      ['----', '------', '----', '----', '-------'],
      ...events.map((e) => {
        const last = age(e.lastTimestamp ?? e.eventTime, now);
        const when = (e.count ?? 1) > 1 ? `${last} (x${e.count} over ${age(e.firstTimestamp, now)})` : last;
        return [e.type ?? '', e.reason ?? '', when, e.source?.component ?? e.reportingComponent ?? '', (e.message ?? '').trim()];
      }),
    ];
    for (const line of formatTable(rows).trimEnd().split('\n')) w.text(1, line);
  }
  return w.render();
}
