/**
 * kube-proxy's service health-check server: for each LoadBalancer Service
 * with externalTrafficPolicy Local, an HTTP server on its healthCheckNodePort
 * that tells a load balancer whether this node has endpoints of it (200) or
 * not (503), with the count, so traffic is only sent to nodes that keep it
 * local. Any path and method get the same answer, as kube-proxy's do.
 */
import http from 'node:http';
import type net from 'node:net';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';

export interface HealthCheckTarget {
  namespace: string;
  name: string;
  port: number;
  /** This node's ready endpoints of the Service. */
  localEndpoints: number;
}

/** Connections one health-check port holds at most; a load balancer's probes need a few. */
const MAX_CONNECTIONS = 32;

interface Listening {
  key: string;
  server: http.Server;
  sockets: Set<net.Socket>;
}

export class ServiceHealthServer {
  private readonly byPort = new Map<number, Listening>();
  private readonly targets = new Map<number, HealthCheckTarget>();

  constructor(private readonly opts: { address: string; log: Logger }) {}

  /** The ports served now, for tests and debugging. */
  ports(): number[] {
    return [...this.byPort.keys()].sort((a, b) => a - b);
  }

  /** Serves exactly these targets: new ports are opened, gone ones closed, counts updated in place. */
  async sync(targets: HealthCheckTarget[]): Promise<void> {
    const want = new Map(targets.map((t) => [t.port, t]));
    this.targets.clear();
    for (const [port, t] of want) this.targets.set(port, t);
    for (const [port, l] of this.byPort) {
      const t = want.get(port);
      if (!t || l.key !== `${t.namespace}/${t.name}`) await this.closeOne(port);
    }
    for (const [port, t] of want) {
      if (this.byPort.has(port)) continue;
      try {
        await this.open(port, `${t.namespace}/${t.name}`);
      } catch (err) {
        // kube-proxy logs and retries on the next sync; the port may be held by something else for now.
        this.opts.log.warn('could not serve a Service\'s health-check node port', { service: `${t.namespace}/${t.name}`, port, error: errorMessage(err) });
      }
    }
  }

  async close(): Promise<void> {
    for (const port of [...this.byPort.keys()]) await this.closeOne(port);
  }

  private open(port: number, key: string): Promise<void> {
    const sockets = new Set<net.Socket>();
    const server = http.createServer((req, res) => {
      req.resume();
      const t = this.targets.get(port);
      const [namespace, name] = key.split('/') as [string, string];
      const count = t?.localEndpoints ?? 0;
      const body = JSON.stringify({ service: { namespace, name }, localEndpoints: count, serviceProxyHealthy: true }, null, 2);
      res.writeHead(count > 0 ? 200 : 503, { 'Content-Type': 'application/json', 'X-Content-Type-Options': 'nosniff', 'Content-Length': Buffer.byteLength(body) });
      res.end(body);
    });
    server.maxConnections = MAX_CONNECTIONS;
    server.headersTimeout = 5_000;
    server.requestTimeout = 5_000;
    server.keepAliveTimeout = 5_000;
    server.on('connection', (s: net.Socket) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    });
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, this.opts.address, () => {
        server.off('error', reject);
        server.on('error', (err) => this.opts.log.warn('health-check server error', { port, error: errorMessage(err) }));
        this.byPort.set(port, { key, server, sockets });
        resolve();
      });
    });
  }

  private async closeOne(port: number): Promise<void> {
    const l = this.byPort.get(port);
    if (!l) return;
    this.byPort.delete(port);
    for (const s of l.sockets) s.destroy();
    await new Promise<void>((r) => l.server.close(() => r()));
  }
}
