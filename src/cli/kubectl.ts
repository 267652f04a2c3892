/**
 * `skiff get|describe|logs|exec`: a small kubectl for one node, reading the
 * agent's read-only status API (and, for exec, calling CRI Exec on the
 * runtime and speaking Kubernetes' WebSocket channel protocol to the URL it
 * returns).
 */
import http from 'node:http';
import { parseArgs } from 'node:util';
import type { Event, Pod, Service } from 'kubernetes-types/core/v1.js';
import WebSocket from 'ws';
import YAML from 'yaml';
import { connectCri } from '../kubelet-lite/cri-client.js';
import { describePod, formatTable, podCells, podHeader, podRow, type GetOptions } from './kubectl-format.js';
import { serviceCells } from '../api/kinds/workload-rows.js';
import { describeWorkload, humanDuration, formatCronJobs, formatDaemonSets, formatDeployments, formatJobs, rolloutStatus } from './workload-format.js';
import type { WorkloadKind, WorkloadStatus } from '../controllers/types.js';

export const DEFAULT_SERVER = 'http://127.0.0.1:10255';
export const DEFAULT_RUNTIME_ENDPOINT = 'unix:///run/skiff/skiff.sock';

export const KUBECTL_HELP = `Commands that read a node agent's status API (kubectl's, for one node):
  skiff get pods [NAME] [-n NS | -A] [-o wide|yaml|json] [-w]
                        list pods as kubectl does (NAME READY STATUS RESTARTS AGE); -w follows changes
  skiff get services|deployments|daemonsets|jobs|cronjobs|all [NAME] [-n NS | -A] [-o yaml|json]
                        Services (as skiff node's proxy programs them) and the workloads the
                        node's controllers run, with kubectl's columns
  skiff rollout status deployment/NAME [-n NS] [--timeout D]
                        wait until a Deployment's rollout has finished, printing its progress
  skiff describe pod|service|deployment|daemonset|job|cronjob [NAME] [-n NS]
                        details, conditions and (for pods) containers, volumes and events
  skiff logs POD|job/NAME|-l SELECTOR [-c CONTAINER] [-f] [-p] [--tail N] [--timestamps] [-n NS]
                        a container's output (-p: the previous instance's)
  skiff exec POD [-c CONTAINER] [-i] [-t] [-n NS] -- COMMAND [ARG...]
                        run a command in a container through the runtime's CRI Exec
Flags for these:
  --server URL             the agent's status API (default ${DEFAULT_SERVER})
  --runtime-endpoint URL   the CRI endpoint exec calls (default ${DEFAULT_RUNTIME_ENDPOINT})
`;

/** An error the user made or the server reported: printed without a stack, exit code 1. */
export class CliError extends Error {}

export interface Io {
  /** Writes; `false` means the output is full, and a streaming caller waits for drained() before reading on. */
  out: (s: string | Uint8Array) => unknown;
  err: (s: string | Uint8Array) => unknown;
  /** Resolves once the output (`out` or `err`) that said `false` can take more. */
  drained?: (which: 'out' | 'err') => Promise<void>;
}

function drainOf(s: NodeJS.WriteStream): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      s.off('drain', done);
      s.off('close', done);
      s.off('error', done);
      resolve();
    };
    s.on('drain', done);
    s.on('close', done);
    s.on('error', done);
  });
}

const stdio: Io = {
  out: (s) => process.stdout.write(s),
  err: (s) => process.stderr.write(s),
  drained: (which) => drainOf(which === 'out' ? process.stdout : process.stderr),
};

function serverUrl(server: string, path: string): string {
  return `${server.replace(/\/+$/, '')}${path}`;
}

/** A response whose body streams: no overall or idle deadline, so `-w` and `-f` can wait as long as the user does. */
interface StreamResponse {
  ok: boolean;
  status: number;
  statusText: string;
  body: http.IncomingMessage;
}

function request(server: string, path: string): Promise<StreamResponse> {
  return new Promise((resolve, reject) => {
    let url: URL;
    try {
      url = new URL(serverUrl(server, path));
    } catch {
      reject(new CliError(`--server must be a URL such as ${DEFAULT_SERVER}, not "${server}"`));
      return;
    }
    if (url.protocol !== 'http:') {
      reject(new CliError(`--server must be an http:// URL, not "${server}"`));
      return;
    }
    const req = http.get(url, (res) => {
      const status = res.statusCode ?? 0;
      resolve({ ok: status >= 200 && status < 300, status, statusText: res.statusMessage ?? '', body: res });
    });
    req.on('error', (err) => reject(new CliError(`cannot reach the node agent at ${server}: ${err.message}`)));
  });
}

/** A whole (small) body as text: status API answers other than streams are bounded by the server's object sizes. */
async function text(res: StreamResponse): Promise<string> {
  const parts: Buffer[] = [];
  for await (const chunk of res.body as AsyncIterable<Buffer>) parts.push(chunk);
  return Buffer.concat(parts).toString('utf8');
}

/** The error kubectl prints for a Status from the server. */
async function serverError(res: StreamResponse): Promise<CliError> {
  const body = await text(res).catch(() => '');
  try {
    const s = JSON.parse(body) as { reason?: string; message?: string };
    return new CliError(`Error from server (${s.reason ?? res.statusText}): ${s.message ?? body}`);
  } catch {
    return new CliError(`Error from server (${res.status}): ${body.trim()}`);
  }
}

async function getJson<T>(server: string, path: string): Promise<T> {
  const res = await request(server, path);
  if (!res.ok) throw await serverError(res);
  return JSON.parse(await text(res)) as T;
}

const enc = encodeURIComponent;

/** Newline-delimited JSON from a streaming response, one parsed object at a time. */
async function* ndjson<T>(res: StreamResponse): AsyncGenerator<T> {
  let buf = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body as AsyncIterable<Buffer>) {
    buf += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line) as T;
    }
  }
}

function isPodsResource(r: string | undefined): boolean {
  return r === 'pods' || r === 'pod' || r === 'po';
}

const WORKLOAD_RESOURCES: Record<string, WorkloadKind> = {
  deployments: 'Deployment',
  deployment: 'Deployment',
  deploy: 'Deployment',
  daemonsets: 'DaemonSet',
  daemonset: 'DaemonSet',
  ds: 'DaemonSet',
  jobs: 'Job',
  job: 'Job',
  cronjobs: 'CronJob',
  cronjob: 'CronJob',
  cj: 'CronJob',
};

const FORMATS: Record<WorkloadKind, (items: WorkloadStatus[], opts: { now: number; allNamespaces?: boolean }) => string> = {
  Deployment: formatDeployments,
  DaemonSet: formatDaemonSets,
  Job: formatJobs,
  CronJob: formatCronJobs,
};

async function workloads(server: string, kind?: WorkloadKind): Promise<WorkloadStatus[]> {
  return (await getJson<{ items: WorkloadStatus[] }>(server, kind ? `/workloads/${kind.toLowerCase()}` : '/workloads')).items;
}

/** kubectl's `describe service`, with the endpoints the proxy uses: Ready pods the selector matches. */
export function describeService(svc: Service, pods: Pod[]): string {
  const sel = svc.spec?.selector;
  const matching = sel ? pods.filter((p) => Object.entries(sel).every(([k, v]) => p.metadata?.labels?.[k] === v)) : [];
  const ready = matching.filter((p) => p.status?.podIP && p.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') && !p.metadata?.deletionTimestamp);
  const lines = [
    ['Name:', svc.metadata?.name ?? ''],
    ['Namespace:', svc.metadata?.namespace ?? ''],
    ['Selector:', sel ? Object.entries(sel).map(([k, v]) => `${k}=${v}`).join(',') : '<none>'],
    ['Type:', svc.spec?.type ?? 'ClusterIP'],
    ['IP:', svc.spec?.clusterIP ?? '<none>'],
  ];
  for (const p of svc.spec?.ports ?? []) {
    const label = p.name ?? '<unset>';
    lines.push(['Port:', `${label}  ${p.port}/${p.protocol ?? 'TCP'}`]);
    lines.push(['TargetPort:', `${p.targetPort ?? p.port}/${p.protocol ?? 'TCP'}`]);
    if (p.nodePort) lines.push(['NodePort:', `${label}  ${p.nodePort}/${p.protocol ?? 'TCP'}`]);
    const eps = ready.map((pod) => {
      const t = p.targetPort ?? p.port;
      const num = typeof t === 'number' ? t : pod.spec?.containers.flatMap((c) => c.ports ?? []).find((cp) => cp.name === t)?.containerPort;
      return num ? `${pod.status!.podIP}:${num}` : undefined;
    }).filter(Boolean);
    lines.push(['Endpoints:', eps.length ? eps.join(',') : '<none>']);
  }
  const width = Math.max(...lines.map(([k]) => k!.length)) + 1;
  return lines.map(([k, v]) => `${k!.padEnd(width)}${v}`).join('\n') + '\n';
}

function serviceHeader(all: boolean): string[] {
  return [...(all ? ['NAMESPACE'] : []), 'NAME', 'TYPE', 'CLUSTER-IP', 'EXTERNAL-IP', 'PORT(S)', 'AGE'];
}

/** kubectl's service row (the API's table cells): `80:30080/TCP` for a node port, `53/UDP` otherwise. */
export function serviceRow(svc: Service, all: boolean, now: Date): string[] {
  const cells = serviceCells((svc.spec ?? {}) as Record<string, unknown>, (svc.status ?? {}) as Record<string, unknown>);
  const created = svc.metadata?.creationTimestamp ? Date.parse(svc.metadata.creationTimestamp) : NaN;
  const age = Number.isFinite(created) ? humanDuration(now.getTime() - created) : '<unknown>';
  return [...(all ? [svc.metadata?.namespace ?? ''] : []), svc.metadata?.name ?? '', ...cells, age];
}

/** `get deployments` and friends, and `get all`. */
async function getWorkloads(kinds: WorkloadKind[], name: string | undefined, ns: string, all: boolean, output: string, server: string, io: Io, now: () => Date, withPods: boolean): Promise<number> {
  const items = (await workloads(server)).filter((w) => kinds.includes(w.kind) && (all || w.namespace === ns) && (name === undefined || w.name === name));
  if (name !== undefined && items.length === 0) throw new CliError(`Error from server (NotFound): ${kinds[0]!.toLowerCase()}s "${name}" not found`);
  if (output === 'json' || output === 'yaml') {
    const obj = { apiVersion: 'v1', kind: 'List', items: items.map((w) => ({ kind: w.kind, metadata: { name: w.name, namespace: w.namespace }, spec: w.spec, status: w.status })) };
    io.out(output === 'json' ? `${JSON.stringify(obj, null, 4)}\n` : YAML.stringify(obj));
    return 0;
  }
  const sections: string[] = [];
  if (withPods) {
    const pods = (await getJson<{ items: Pod[] }>(server, all ? '/pods' : `/pods/${enc(ns)}`)).items;
    const opts: GetOptions = { allNamespaces: all, wide: false };
    if (pods.length) sections.push(formatTable([podHeader(opts), ...pods.map((p) => podCells(podRow(p, now()), opts))]));
  }
  if (withPods) {
    const svcs = (await getJson<{ items: Service[] }>(server, all ? '/services' : `/services/${enc(ns)}`).catch(() => ({ items: [] as Service[] }))).items;
    if (svcs.length) sections.push(formatTable([serviceHeader(all), ...svcs.map((x) => serviceRow(x, all, now()))]));
  }
  for (const kind of kinds) {
    const mine = items.filter((w) => w.kind === kind);
    if (mine.length || !withPods) sections.push(FORMATS[kind](mine, { now: now().getTime(), allNamespaces: all }));
  }
  if (!sections.length) {
    io.err(all ? 'No resources found\n' : `No resources found in ${ns} namespace.\n`);
    return 0;
  }
  io.out(sections.join('\n'));
  return 0;
}

// ---------------------------------------------------------------- get

export async function get(args: string[], io: Io = stdio, now: () => Date = () => new Date()): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      namespace: { type: 'string', short: 'n', default: 'default' },
      'all-namespaces': { type: 'boolean', short: 'A' },
      output: { type: 'string', short: 'o' },
      watch: { type: 'boolean', short: 'w' },
      server: { type: 'string', default: DEFAULT_SERVER },
    },
    allowPositionals: true,
    strict: true,
  });
  const [resource, name, ...extra] = positionals;
  if (resource !== undefined && (WORKLOAD_RESOURCES[resource] || resource === 'all')) {
    if (extra.length) throw new CliError(`skiff get ${resource} takes at most one name`);
    const output = values.output ?? '';
    if (!['', 'yaml', 'json'].includes(output)) throw new CliError(`--output must be yaml or json for ${resource}, not "${output}"`);
    const all = !!values['all-namespaces'];
    const kinds = resource === 'all' ? (['Deployment', 'DaemonSet', 'Job', 'CronJob'] as WorkloadKind[]) : [WORKLOAD_RESOURCES[resource]!];
    return getWorkloads(kinds, name, values.namespace!, all, output, values.server!, io, now, resource === 'all');
  }
  if (resource === 'services' || resource === 'service' || resource === 'svc') {
    const all = !!values['all-namespaces'];
    const list = (await getJson<{ items: Service[] }>(values.server!, all ? '/services' : `/services/${enc(values.namespace!)}`)).items.filter((x) => name === undefined || x.metadata?.name === name);
    const output = values.output ?? '';
    if (output === 'json' || output === 'yaml') {
      const obj = { apiVersion: 'v1', items: list, kind: 'List', metadata: { resourceVersion: '' } };
      io.out(output === 'json' ? `${JSON.stringify(obj, null, 4)}\n` : YAML.stringify(obj));
      return 0;
    }
    if (!list.length) {
      io.err(all ? 'No resources found\n' : `No resources found in ${values.namespace} namespace.\n`);
      return 0;
    }
    io.out(formatTable([serviceHeader(all), ...list.map((x) => serviceRow(x, all, now()))]));
    return 0;
  }
  if (!isPodsResource(resource)) throw new CliError(`skiff get knows pods, services, deployments, daemonsets, jobs, cronjobs and all, not "${resource ?? ''}"`);
  if (extra.length) throw new CliError('skiff get pods takes at most one pod name');
  const output = values.output ?? '';
  if (!['', 'wide', 'yaml', 'json'].includes(output)) throw new CliError(`--output must be wide, yaml or json, not "${output}"`);
  const ns = values.namespace!;
  const all = !!values['all-namespaces'] && name === undefined;
  const opts: GetOptions = { allNamespaces: all, wide: output === 'wide' };
  const server = values.server!;
  const path = name !== undefined ? `/pods/${enc(ns)}/${enc(name)}` : all ? '/pods' : `/pods/${enc(ns)}`;

  if (values.watch) return watch(server, path, output, opts, io, now);

  if (name !== undefined) {
    const pod = await getJson<Pod>(server, path);
    if (output === 'json') io.out(`${JSON.stringify(pod, null, 4)}\n`);
    else if (output === 'yaml') io.out(YAML.stringify(pod));
    else io.out(formatTable([podHeader(opts), podCells(podRow(pod, now()), opts)]));
    return 0;
  }
  const list = await getJson<{ items: Pod[] }>(server, path);
  const pods = list.items.sort((a, b) => `${a.metadata?.namespace}/${a.metadata?.name}`.localeCompare(`${b.metadata?.namespace}/${b.metadata?.name}`));
  if (output === 'json' || output === 'yaml') {
    const obj = { apiVersion: 'v1', items: pods, kind: 'List', metadata: { resourceVersion: '' } };
    io.out(output === 'json' ? `${JSON.stringify(obj, null, 4)}\n` : YAML.stringify(obj));
    return 0;
  }
  if (!pods.length) {
    io.err(all ? 'No resources found\n' : `No resources found in ${ns} namespace.\n`);
    return 0;
  }
  io.out(formatTable([podHeader(opts), ...pods.map((p) => podCells(podRow(p, now()), opts))]));
  return 0;
}

async function watch(server: string, path: string, output: string, opts: GetOptions, io: Io, now: () => Date): Promise<number> {
  const res = await request(server, `${path}?watch=true`);
  if (!res.ok) throw await serverError(res);
  // Columns are sized once, from the header, as kubectl's watch prints them line by line.
  let headerDone = false;
  const widths = podHeader(opts).map((h) => Math.max(h.length, 8));
  for await (const e of ndjson<{ type: string; object: Pod }>(res)) {
    if (output === 'json') io.out(`${JSON.stringify(e.object, null, 4)}\n`);
    else if (output === 'yaml') io.out(`---\n${YAML.stringify(e.object)}`);
    else {
      const cells = podCells(podRow(e.object, now()), opts);
      cells.forEach((c, i) => (widths[i] = Math.max(widths[i]!, c.length)));
      const line = (row: string[]) => row.map((c, i) => (i === row.length - 1 ? c : c.padEnd(widths[i]! + 3))).join('') + '\n';
      if (!headerDone) {
        headerDone = true;
        io.out(line(podHeader(opts)));
      }
      io.out(line(cells));
    }
  }
  return 0;
}

// ---------------------------------------------------------------- describe

export async function describe(args: string[], io: Io = stdio, now: () => Date = () => new Date()): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      namespace: { type: 'string', short: 'n', default: 'default' },
      server: { type: 'string', default: DEFAULT_SERVER },
    },
    allowPositionals: true,
    strict: true,
  });
  let [resource, name] = positionals;
  // `describe pod/web` as kubectl takes it.
  if (resource?.includes('/') && name === undefined) [resource, name] = resource.split('/', 2) as [string, string];
  if (resource === 'service' || resource === 'services' || resource === 'svc') {
    const list = (await getJson<{ items: Service[] }>(values.server!, `/services/${enc(values.namespace!)}`)).items.filter((x) => name === undefined || x.metadata?.name === name);
    if (name !== undefined && !list.length) throw new CliError(`Error from server (NotFound): services "${name}" not found`);
    const podList = (await getJson<{ items: Pod[] }>(values.server!, `/pods/${enc(values.namespace!)}`)).items;
    io.out(list.map((svc) => describeService(svc, podList)).join('\n\n'));
    return 0;
  }
  if (resource !== undefined && WORKLOAD_RESOURCES[resource]) {
    const kind = WORKLOAD_RESOURCES[resource]!;
    const items = (await workloads(values.server!, kind)).filter((w) => w.namespace === values.namespace && (name === undefined || w.name === name));
    if (name !== undefined && !items.length) throw new CliError(`Error from server (NotFound): ${kind.toLowerCase()}s "${name}" not found`);
    io.out(items.map((w) => describeWorkload(w, { now: now().getTime() })).join('\n\n'));
    return 0;
  }
  if (!isPodsResource(resource)) throw new CliError(`skiff describe knows pods, services, deployments, daemonsets, jobs and cronjobs, not "${resource ?? ''}"`);
  const ns = values.namespace!;
  const server = values.server!;
  const pods = name !== undefined ? [await getJson<Pod>(server, `/pods/${enc(ns)}/${enc(name)}`)] : (await getJson<{ items: Pod[] }>(server, `/pods/${enc(ns)}`)).items;
  if (!pods.length) {
    io.err(`No resources found in ${ns} namespace.\n`);
    return 0;
  }
  const texts: string[] = [];
  for (const pod of pods) {
    const events = (await getJson<{ items: Event[] }>(server, `/events/${enc(pod.metadata?.namespace ?? ns)}/${enc(pod.metadata?.name ?? '')}`)).items.filter(
      (e) => !e.involvedObject.uid || e.involvedObject.uid === pod.metadata?.uid,
    );
    texts.push(describePod(pod, events, now()));
  }
  io.out(texts.join('\n\n'));
  return 0;
}

// ---------------------------------------------------------------- logs

/** The container a command acts on: the one named, else the pod's only one. */
export function pickContainer(pod: Pod, named: string | undefined, what: 'logs' | 'exec'): string {
  const specs = [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])];
  const name = pod.metadata?.name ?? '';
  if (named !== undefined) {
    if (!specs.some((c) => c.name === named) && !(pod.spec?.ephemeralContainers ?? []).some((c) => c.name === named)) {
      throw new CliError(`container ${named} is not valid for pod ${name}`);
    }
    return named;
  }
  const app = pod.spec?.containers ?? [];
  if (app.length === 1) return app[0]!.name;
  if (what === 'exec' && app.length) return app[0]!.name;
  throw new CliError(`a container name must be specified for pod ${name}, choose one of: [${app.map((c) => c.name).join(' ')}]`);
}

export async function logs(args: string[], io: Io = stdio): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      namespace: { type: 'string', short: 'n', default: 'default' },
      container: { type: 'string', short: 'c' },
      follow: { type: 'boolean', short: 'f' },
      previous: { type: 'boolean', short: 'p' },
      tail: { type: 'string' },
      timestamps: { type: 'boolean' },
      selector: { type: 'string', short: 'l' },
      server: { type: 'string', default: DEFAULT_SERVER },
    },
    allowPositionals: true,
    strict: true,
  });
  let [podName, extra]: Array<string | undefined> = positionals;
  const ns = values.namespace!;
  const server = values.server!;
  // `-l app=web` and `job/NAME` as kubectl takes them: the matching pods' logs, one pod after another.
  let selector = values.selector;
  if (podName?.startsWith('job/') || podName?.startsWith('jobs/')) {
    selector = `job-name=${podName.slice(podName.indexOf('/') + 1)}`;
    podName = undefined;
  }
  if (selector !== undefined) {
    if (podName !== undefined) throw new CliError('skiff logs takes a pod name or a selector, not both');
    const want = parseSelector(selector);
    const pods = (await getJson<{ items: Pod[] }>(server, `/pods/${enc(ns)}`)).items.filter((p) => Object.entries(want).every(([k, v]) => p.metadata?.labels?.[k] === v));
    if (!pods.length) {
      io.err(`No resources found in ${ns} namespace.\n`);
      return 0;
    }
    for (const p of pods) {
      const rest = [p.metadata!.name!, ...(values.container ? ['-c', values.container] : []), '-n', ns, '--server', server, ...(values.previous ? ['-p'] : []), ...(values.tail ? ['--tail', values.tail] : []), ...(values.timestamps ? ['--timestamps'] : [])];
      await logs(rest, io);
    }
    return 0;
  }
  if (podName?.startsWith('pod/') || podName?.startsWith('pods/')) podName = podName.slice(podName.indexOf('/') + 1);
  if (!podName) throw new CliError('skiff logs needs a pod name (or -l SELECTOR, or job/NAME)');
  const container = values.container ?? extra;
  const pod = await getJson<Pod>(server, `/pods/${enc(ns)}/${enc(podName)}`);
  const c = pickContainer(pod, container, 'logs');
  const q = new URLSearchParams();
  if (values.follow) q.set('follow', 'true');
  if (values.previous) q.set('previous', 'true');
  if (values.timestamps) q.set('timestamps', 'true');
  if (values.tail !== undefined && values.tail !== '-1') {
    if (!/^\d+$/.test(values.tail)) throw new CliError(`--tail must be a number of lines, not "${values.tail}"`);
    q.set('tailLines', values.tail);
  }
  const res = await request(server, `/containerLogs/${enc(ns)}/${enc(podName)}/${enc(c)}${q.size ? `?${q}` : ''}`);
  if (!res.ok) throw await serverError(res);
  // The bytes as the container wrote them: logs need not be UTF-8.
  // Read no faster than the output takes it: a container's output must not pile up in memory here.
  for await (const chunk of res.body as AsyncIterable<Buffer>) if (io.out(chunk) === false) await io.drained?.('out');
  return 0;
}

// ---------------------------------------------------------------- exec

/** The runtime's ID from a status containerID ("containerd://abc" → "abc"). */
export function runtimeContainerId(containerID: string | undefined): string | undefined {
  if (!containerID) return undefined;
  const i = containerID.indexOf('://');
  return i < 0 ? containerID : containerID.slice(i + 3);
}

/** The exit code a v4/v5 error-channel status means: 0 for Success, the ExitCode cause otherwise. */
export function exitCodeOfStatus(text: string): { code: number; message?: string } {
  if (!text.trim()) return { code: 0 };
  let s: { status?: string; message?: string; reason?: string; details?: { causes?: { reason?: string; message?: string }[] } };
  try {
    s = JSON.parse(text) as typeof s;
  } catch {
    // The old protocols' plain-text error.
    return { code: 1, message: text };
  }
  if (s.status === 'Success') return { code: 0 };
  const cause = s.details?.causes?.find((c) => c.reason === 'ExitCode');
  if (s.reason === 'NonZeroExitCode' && cause && /^\d+$/.test(cause.message ?? '')) return { code: Number(cause.message) };
  return { code: 1, message: s.message ?? text };
}

export const EXEC_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'];

export async function exec(argv: string[], io: Io = stdio): Promise<number> {
  const dash = argv.indexOf('--');
  const args = dash < 0 ? argv : argv.slice(0, dash);
  const { values, positionals } = parseArgs({
    args,
    options: {
      namespace: { type: 'string', short: 'n', default: 'default' },
      container: { type: 'string', short: 'c' },
      stdin: { type: 'boolean', short: 'i' },
      tty: { type: 'boolean', short: 't' },
      server: { type: 'string', default: DEFAULT_SERVER },
      'runtime-endpoint': { type: 'string', default: DEFAULT_RUNTIME_ENDPOINT },
    },
    allowPositionals: true,
    strict: true,
  });
  const cmd = dash < 0 ? positionals.slice(1) : argv.slice(dash + 1);
  let podName = positionals[0];
  if (podName?.startsWith('pod/') || podName?.startsWith('pods/')) podName = podName.slice(podName.indexOf('/') + 1);
  if (!podName) throw new CliError('skiff exec needs a pod name');
  if (dash >= 0 && positionals.length > 1) throw new CliError('skiff exec takes the pod name before "--" and the command after it');
  if (!cmd.length) throw new CliError('skiff exec needs a command after "--"');
  const ns = values.namespace!;
  const pod = await getJson<Pod>(values.server!, `/pods/${enc(ns)}/${enc(podName)}`);
  const app = pod.spec?.containers ?? [];
  if (values.container === undefined && app.length > 1) io.err(`Defaulted container "${app[0]!.name}" out of: ${app.map((c) => c.name).join(', ')}\n`);
  const container = pickContainer(pod, values.container, 'exec');
  const statuses = [...(pod.status?.initContainerStatuses ?? []), ...(pod.status?.containerStatuses ?? []), ...(pod.status?.ephemeralContainerStatuses ?? [])];
  const st = statuses.find((s) => s.name === container);
  const id = runtimeContainerId(st?.containerID);
  if (!id || !st?.state?.running) throw new CliError(`container ${container} in pod ${podName} is not running`);
  // As kubectl: a terminal only when asked for with -i and stdin is one.
  const tty = !!values.tty && !!values.stdin && !!process.stdin.isTTY;
  if (values.tty && !tty) io.err('Unable to use a TTY - input is not a terminal or the right kind of file\n');

  const cri = connectCri(values['runtime-endpoint']!);
  let url: string;
  try {
    const r = await cri.runtime.Exec({ containerId: id, cmd, tty, stdin: !!values.stdin, stdout: true, stderr: !tty }, 30_000);
    url = r.url;
  } catch (err) {
    throw new CliError(`exec in container ${container} failed: ${(err as { details?: string }).details ?? (err as Error).message}`);
  } finally {
    cri.close();
  }
  return streamExec(url, { stdin: !!values.stdin, tty }, io);
}

/** Runs an exec session over WebSocket (v5, else v4): stdin in, stdout/stderr out, the exit code from the status channel. */
export function streamExec(url: string, opts: { stdin: boolean; tty: boolean }, io: Io): Promise<number> {
  const ws = new WebSocket(url.replace(/^http/, 'ws'), EXEC_PROTOCOLS, { maxPayload: 16 * 1024 * 1024 });
  const input = process.stdin;
  let status: string | undefined;
  let raw = false;
  const cleanups: (() => void)[] = [];
  return new Promise<number>((resolve, reject) => {
    ws.on('error', (err) => reject(new CliError(`exec stream failed: ${err.message}`)));
    ws.on('open', () => {
      const v5 = ws.protocol === 'v5.channel.k8s.io';
      const send = (channel: number, data: Buffer) => ws.send(Buffer.concat([Buffer.from([channel]), data]));
      if (opts.tty) {
        const resize = () => {
          if (process.stdout.columns) send(4, Buffer.from(JSON.stringify({ Width: process.stdout.columns, Height: process.stdout.rows })));
        };
        resize();
        process.on('SIGWINCH', resize);
        cleanups.push(() => process.off('SIGWINCH', resize));
        if (input.isTTY) {
          input.setRawMode(true);
          raw = true;
        }
      }
      if (opts.stdin) {
        const onData = (d: Buffer) => {
          send(0, d);
          // Never let a fast producer fill memory: wait for the socket to drain.
          if (ws.bufferedAmount > 1024 * 1024) {
            input.pause();
            const again = setInterval(() => {
              if (ws.bufferedAmount < 256 * 1024 || ws.readyState !== ws.OPEN) {
                clearInterval(again);
                input.resume();
              }
            }, 10);
          }
        };
        const onEnd = () => {
          // v5 can say "no more input"; v4 cannot, the command sees EOF only when the session ends.
          if (v5 && ws.readyState === ws.OPEN) send(255, Buffer.from([0]));
        };
        input.on('data', onData);
        input.on('end', onEnd);
        cleanups.push(() => {
          input.off('data', onData);
          input.off('end', onEnd);
          input.pause();
        });
      }
    });
    // While an output is full the socket is not read: the container's output waits in the kernel and the
    // server, never in this process's memory.
    let holding = 0;
    const hold = (which: 'out' | 'err') => {
      if (!io.drained) return;
      if (holding++ === 0) ws.pause();
      void io.drained(which).then(() => {
        if (--holding === 0) ws.resume();
      });
    };
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (!isBinary || data.length === 0) return;
      const payload = data.subarray(1);
      switch (data[0]) {
        case 1:
          if (io.out(payload) === false) hold('out');
          break;
        case 2:
          if (io.err(payload) === false) hold('err');
          break;
        case 3:
          status = (status ?? '') + payload.toString();
          break;
      }
    });
    ws.on('close', () => {
      for (const c of cleanups) c();
      if (raw) input.setRawMode(false);
      // The server always ends a session with a status; without one the connection was lost.
      const r = status === undefined ? { code: 1, message: 'the exec session ended without an exit status (connection lost)' } : exitCodeOfStatus(status);
      if (r.message) io.err(`error: ${r.message}\n`);
      resolve(r.code);
    });
  });
}

/** Runs a kubectl-like command; undefined when `cmd` is not one of them. */
/** `app=web,tier=front`: equality selectors, which is what kubectl's -l most often carries. */
export function parseSelector(s: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of s.split(',')) {
    const m = /^\s*([A-Za-z0-9._/-]+)\s*==?\s*([A-Za-z0-9._-]*)\s*$/.exec(part);
    if (!m) throw new CliError(`the selector must be key=value[,key=value], not "${s}"`);
    out[m[1]!] = m[2]!;
  }
  return out;
}

// ---------------------------------------------------------------- rollout

/** `skiff rollout status deployment/NAME`: prints each new progress message until the rollout is done. */
export async function rollout(args: string[], io: Io = stdio, sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      namespace: { type: 'string', short: 'n', default: 'default' },
      server: { type: 'string', default: DEFAULT_SERVER },
      timeout: { type: 'string', default: '0' },
      watch: { type: 'boolean', short: 'w', default: true },
    },
    allowPositionals: true,
    strict: true,
  });
  let [verb, target, name] = positionals;
  if (verb !== 'status') throw new CliError(`skiff rollout knows only "status", not "${verb ?? ''}"`);
  if (target?.includes('/') && name === undefined) [target, name] = target.split('/', 2) as [string, string];
  if (!target || WORKLOAD_RESOURCES[target] !== 'Deployment' || !name) throw new CliError('usage: skiff rollout status deployment/NAME');
  const timeoutMs = parseTimeout(values.timeout!);
  const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : Infinity;
  let last = '';
  for (;;) {
    const d = (await workloads(values.server!, 'Deployment')).find((w) => w.namespace === values.namespace && w.name === name);
    if (!d) throw new CliError(`Error from server (NotFound): deployments.apps "${name}" not found`);
    const r = rolloutStatus(d);
    if ('error' in r) throw new CliError(r.error);
    if (r.message !== last) io.out(`${r.message}\n`);
    last = r.message;
    if (r.done || !values.watch) return r.done ? 0 : 1;
    if (Date.now() > deadline) throw new CliError('timed out waiting for the condition');
    await sleep(250);
  }
}

function parseTimeout(s: string): number {
  const m = /^(\d+)(ms|s|m|h)?$/.exec(s.trim());
  if (!m) throw new CliError(`--timeout must be a duration such as 30s or 5m, not "${s}"`);
  return Number(m[1]) * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? 's') as 'ms' | 's' | 'm' | 'h'];
}

export async function runKubectl(cmd: string, args: string[]): Promise<number | undefined> {
  const table: Record<string, (a: string[]) => Promise<number>> = { get, describe, logs, exec, rollout };
  const fn = table[cmd];
  if (!fn) return undefined;
  const own = args.indexOf('--') < 0 ? args : args.slice(0, args.indexOf('--'));
  if (own.includes('--help') || own.includes('-h')) {
    process.stdout.write(KUBECTL_HELP);
    return 0;
  }
  try {
    return await fn(args);
  } catch (err) {
    if (err instanceof CliError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      process.stderr.write(`${err instanceof CliError && err.message.startsWith('Error from server') ? '' : 'error: '}${(err as Error).message}\n`);
      return 1;
    }
    throw err;
  }
}
