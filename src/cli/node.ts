/**
 * `skiff node`: a whole worker node in one process and one log stream — the
 * CRI runtime on its socket, kubelet-lite running the manifest directory's
 * pods and workloads through it, and the service proxy with service DNS.
 * SIGTERM stops the agent's loops first and the runtime last; pods keep
 * running and the next start adopts them.
 */
import { parseArgs } from 'node:util';
import { installCrashGuard, startDaemon } from '../daemon.js';
import { startNodeApi } from '../api/index.js';
import { localClient } from '../api/client.js';
import { AgentPodStreams } from '../kubelet-lite/pod-streams.js';
import { startKubelet } from '../kubelet-lite/run.js';
import { ControlPlane } from '../node/control-plane.js';
import { EventWriter, isKubeletEventOf } from '../node/events.js';
import { NodeReporter, parseNodeLabels, parseTaints } from '../node/node-status.js';
import { metricsSource, type MetricsInputs } from '../node/resource-metrics.js';
import { startNodeServices } from '../node/api-sources.js';
import { startNodePolicy } from '../node/node-policy.js';
import { createLogger } from '../log.js';
import type { Service } from 'kubernetes-types/core/v1.js';
import type { ServiceInfo } from '../proxy/service.js';
import { InProcessPodSource, storeServiceSource } from '../proxy/sources.js';
import { KUBELET_FLAGS, kubeletOptionsFrom } from './kubelet.js';
import { CRI_FLAGS, daemonOptionsFrom, type FlagSpec } from './flags.js';
import { PROXY_FLAGS, proxyOptionsFrom, startProxy } from './proxy.js';
import { untilSignal } from './signals.js';

export const NODE_HELP = `Flags for "skiff node" (the runtime, the agent, the proxy and service DNS in one process):
  all of "skiff cri"'s flags, all of "skiff kubelet"'s except --runtime-endpoint (the agent
  uses the node's own --socket), and all of "skiff proxy"'s except --kubelet and
  --metrics-address (the proxy's metrics are on the status API's /metrics). Defaults as there;
  --cluster-dns defaults to --dns-address, the node's own service DNS.
  --api-address HOST:PORT  the node's Kubernetes API over HTTPS for kubectl and helm (default
                           127.0.0.1:6443; "" for none): what is written there runs here, with the
                           admin kubeconfig written to <--root-dir>/admin.kubeconfig at first start
  --node-labels LIST       labels for the Node, key=value comma-separated (repeatable), put on
                           it at registration and at each start that finds them missing
  --register-with-taints LIST
                           taints for the Node, key=value:Effect or key:Effect comma-separated
                           (repeatable), as the kubelet's flag; pods must tolerate them
Try the demo (images built by ./scripts/setup.sh, no registry needed): ./scripts/demo.sh, or
  skiff node --images-dir build/images   then   kubectl apply -f examples/demo
`;

const { 'runtime-endpoint': _runtimeEndpoint, ...kubeletFlags } = KUBELET_FLAGS;
const { kubelet: _kubeletUrl, 'metrics-address': _metricsAddress, ...proxyFlags } = PROXY_FLAGS;

export const NODE_FLAGS = {
  ...CRI_FLAGS,
  ...kubeletFlags,
  ...proxyFlags,
  'api-address': { type: 'string', default: '127.0.0.1:6443' },
  'node-labels': { type: 'string', multiple: true, default: [] as string[] },
  'register-with-taints': { type: 'string', multiple: true, default: [] as string[] },
} satisfies FlagSpec;

/** The proxy's Services in the API's shape, for `skiff get services`: allocated cluster IPs, node ports, and when each was first seen. */
export function servicesFromProxy(proxier: { services(): ServiceInfo[] }, now: () => number): () => Service[] {
  const firstSeen = new Map<string, number>();
  return () => {
    const list = proxier.services();
    const live = new Set<string>();
    const out = list.map((s) => {
      live.add(s.uid);
      if (!firstSeen.has(s.uid)) firstSeen.set(s.uid, now());
      const nodePorts = s.ports.some((p) => p.nodePort !== undefined);
      return {
        apiVersion: 'v1',
        kind: 'Service',
        metadata: { name: s.name, namespace: s.namespace, uid: s.uid, creationTimestamp: new Date(firstSeen.get(s.uid)!).toISOString().replace(/\.\d{3}Z$/, 'Z') },
        spec: {
          type: nodePorts ? 'NodePort' : 'ClusterIP',
          clusterIP: s.headless ? 'None' : s.clusterIP,
          ...(s.selector ? { selector: s.selector } : {}),
          ports: s.ports.map((p) => ({ name: p.portName || undefined, protocol: p.protocol, port: p.port, targetPort: p.targetPort, ...(p.nodePort !== undefined ? { nodePort: p.nodePort } : {}) })),
        },
      } as Service;
    });
    for (const uid of firstSeen.keys()) if (!live.has(uid)) firstSeen.delete(uid);
    return out;
  };
}

export async function node(args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: { ...NODE_FLAGS, help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false });
  if (values.help) {
    process.stdout.write(NODE_HELP);
    return 0;
  }
  const daemonOpts = daemonOptionsFrom(values);
  const proxyOpts = proxyOptionsFrom(values);
  const log = createLogger(daemonOpts.logLevel);
  const kubeletOpts = kubeletOptionsFrom({ ...values, 'runtime-endpoint': `unix://${daemonOpts.socket}` }, log);
  const nodeLabels = parseNodeLabels(values['node-labels'] as string[]);
  const nodeTaints = parseTaints(values['register-with-taints'] as string[]);
  if (kubeletOpts.clusterDNS.length === 0 && proxyOpts.dnsAddress) kubeletOpts.clusterDNS = [proxyOpts.dnsAddress];
  // The runtime's backstop between the agent's rotations (every 10 s), unless one was given.
  if (!daemonOpts.containerLogSizeMax && kubeletOpts.containerLogs) daemonOpts.containerLogSizeMax = 2 * kubeletOpts.containerLogs.maxSize;
  installCrashGuard(log);
  if (process.getuid?.() !== 0) log.warn('skiff node is not running as root: pods, images and rules all need root');

  const apiAddress = values['api-address'] as string;
  // The API is up before the agent: until it is, pods/log, exec and port-forward answer that it is not running yet.
  let podStreams: AgentPodStreams | undefined;
  // metrics.k8s.io answers from the agent's stats once it runs (`kubectl top`).
  let metricsInputs: MetricsInputs | undefined;
  const metrics = metricsSource(() => metricsInputs);
  const api = apiAddress === '' ? undefined : await startNodeApi({ dir: kubeletOpts.rootDir, address: apiAddress, nodeName: kubeletOpts.nodeName, log, podStreams: () => podStreams, waitForOwners: true, server: { metrics } });
  let daemon;
  try {
    daemon = await startDaemon(daemonOpts, log);
  } catch (err) {
    await api?.stop();
    throw err;
  }
  // The API's objects are in the agent's store before its first pass, so their pods are adopted; the
  // workload controllers run on the API (as kube-controller-manager does), not in the agent.
  let plane: ControlPlane;
  let kubelet;
  // Not a flag: tests only (test/integration/api-netpol-fence.test.ts) hold every NetworkPolicy write back, standing for a slow nft.
  const netpolWriteDelayMs = Math.min(Math.max(Number(process.env.SKIFF_TEST_NETPOL_WRITE_DELAY_MS) || 0, 0), 30_000);
  try {
    plane = await ControlPlane.open({ nodeName: kubeletOpts.nodeName, rootDir: kubeletOpts.rootDir, log, netpolWriteDelayMs, ...(api ? { store: api.store, collector: api.collector } : {}) });
  } catch (err) {
    await daemon.close();
    await api?.stop();
    throw err;
  }
  try {
    kubelet = await startKubelet({ ...kubeletOpts, objects: plane.objects, workloads: () => plane.controllers.workloads(), podNetworkReady: plane.networkPolicies.podReady });
  } catch (err) {
    await plane.stop();
    await daemon.close();
    await api?.stop();
    throw err;
  }
  podStreams = new AgentPodStreams(kubelet.agent, log);
  metricsInputs = { summary: () => kubelet.summary.build(), pods: () => kubelet.agent.listPods() };
  plane.attach(kubelet);
  const reporter = api
    ? new NodeReporter({
        client: localClient(api.store),
        cri: kubelet.agent.cri,
        nodeName: kubeletOpts.nodeName,
        hostIP: kubelet.agent.opts.hostIP,
        rootDir: kubeletOpts.rootDir,
        maxPods: kubeletOpts.maxPods ?? 110,
        labels: nodeLabels,
        taints: nodeTaints,
        statusPort: Number(kubeletOpts.statusAddress.slice(kubeletOpts.statusAddress.lastIndexOf(':') + 1)),
        eviction: { conditions: () => kubelet.eviction.conditions(), thresholds: kubelet.eviction.thresholds },
        nodeEvent: (type, reason, message) => void kubelet.events.recordNode(type, reason, message),
        log,
      })
    : undefined;
  reporter?.start();
  if (reporter) kubelet.eviction.onPressure(() => reporter.poke());
  const policy = api ? await startNodePolicy({ client: localClient(api.store), nodeName: kubeletOpts.nodeName, log, events: plane.events }) : undefined;
  const eventWriter = api ? new EventWriter({ client: localClient(api.store), log }) : undefined;
  await eventWriter?.start(kubelet.events, (e) => isKubeletEventOf(e, kubeletOpts.nodeName));
  // The proxy's first sync waits for the agent's first pass over its pods: after a restart it
  // would otherwise see adopted pods as not yet Ready and take them out of every Service.
  await Promise.race([kubelet.agent.settled(), new Promise((r) => setTimeout(r, 5_000).unref())]);
  // So do the controllers' first looks: before, an adopted pod is not Ready yet and a Deployment would replace it.
  await plane.startControllers();
  const pods = new InProcessPodSource({ listPods: () => kubelet.agent.listPods(), watchPods: (l) => kubelet.agent.watchPods(l) });
  // With the API, the proxy and DNS read Services, EndpointSlices and Pods from it (its controllers write the slices).
  let nodeServices: Awaited<ReturnType<typeof startNodeServices>> | undefined;
  let proxy;
  try {
    nodeServices = api ? await startNodeServices({ client: localClient(api.store), nodeName: kubeletOpts.nodeName, serviceCidr: proxyOpts.serviceCidr, apiAddress: api.address, hostIP: kubelet.agent.opts.hostIP, log }) : undefined;
    proxy = await startProxy(proxyOpts, nodeServices?.sources.services ?? storeServiceSource(kubelet.objects), nodeServices?.sources.pods ?? pods, kubelet.metrics.registry, log, undefined, nodeServices?.slices);
  } catch (err) {
    nodeServices?.stop();
    await policy?.stop();
    await plane.stop();
    eventWriter?.stop();
    await reporter?.stop();
    pods.close();
    await kubelet.stop();
    await daemon.close();
    await api?.stop();
    throw err;
  }
  const services = servicesFromProxy(proxy.proxier, Date.now);
  kubelet.setServices(services);
  plane.attachServices(services);
  // Looked at now and then, so a Service's AGE counts from when the node first programmed it.
  const ages = setInterval(() => void services(), 5_000);
  ages.unref();
  services();
  log.info('skiff node ready', {
    socket: daemonOpts.socket,
    manifests: kubeletOpts.manifests,
    status: `http://${kubeletOpts.statusAddress}`,
    dns: proxyOpts.dnsAddress || 'off',
    proxyMode: proxyOpts.mode,
    api: api ? `https://${api.address}` : 'off',
    kubeconfig: api?.kubeconfig,
  });
  process.stderr.write(
    (api
      ? `\nskiff node is up. From another shell (scripts/setup.sh puts kubectl and helm in build/bin):\n` +
        `  export KUBECONFIG=${api.kubeconfig}\n` +
        `  kubectl get pods -o wide                    the pods, with their IPs\n` +
        `  kubectl logs job/hello                      the demo client: which replica answered\n` +
        `  kubectl scale deployment web --replicas 5   and watch: kubectl get pods -w\n` +
        `  kubectl exec -it deploy/web -- sh           a shell in one replica\n` +
        `  kubectl apply -f your-app.yaml              what you write through the API runs here\n`
      : `\nskiff node is up. From another shell:\n` +
        `  npx skiff get all -A                 pods, deployments, jobs\n` +
        `  npx skiff get pods -o wide           with pod IPs\n` +
        `  npx skiff logs job/hello             the demo client: which replica answered\n`) +
      `  curl http://<this node's IP>:30080/  the demo's NodePort\n` +
      `Manifests in ${kubeletOpts.manifests} are watched too: edit, add or remove files and the node follows.\n` +
      '\n',
  );
  return untilSignal(log, 'skiff node stopping: agent, proxy, then runtime; pods keep running', async () => {
    clearInterval(ages);
    await policy?.stop();
    await plane.stop();
    eventWriter?.stop();
    await reporter?.stop();
    await kubelet.stop();
    pods.close();
    await proxy.stop();
    nodeServices?.stop();
    await daemon.close();
    await api?.stop();
  });
}
