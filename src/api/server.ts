/**
 * The node's API over HTTPS, in the Kubernetes API's shape: discovery,
 * /version and health, and for every kind the store serves get, list,
 * watch, create, update, patch, delete and deletecollection, as JSON or as
 * Tables. Every request needs a client certificate signed by the node's CA;
 * bodies, watches and their unread bytes are bounded. Errors leave as v1
 * Status objects, made in one place (`fail`).
 */
import https from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { silentLogger, type Logger } from '../log.js';
import { KUBE_VERSION } from '../version.js';
import { aggregated, aggregatedVersion, apiVersions, groupList, groupOf, resourceList, type Subresources } from './discovery.js';
import { ApiError, badRequest } from './errors.js';
import { writeStatus } from './upgrade-status.js';
import { applyPatch, checkDepth, PATCH_TYPES } from './patch.js';
import { applyObject, APPLY_PATCH_TYPE, parseApplyBody } from './apply.js';
import { typeOf } from './list-types.js';
import { checkManager, managerFromUserAgent, optionsInvalid, updateTracker, type Scope } from './managed-fields.js';
import { decodeDeleteOptions, decodeProtobuf, PROTOBUF_TYPE } from './protobuf.js';
import { propagationOf } from './owners.js';
import { checkFields, fieldValidationOf, META, type Known } from './fields.js';
import { OPENAPI_V2_TYPE, openApiV2 } from './openapi.js';
import { fromScale, toScale } from './scale.js';
import { parseFieldSelector, parseLabelSelector } from './selectors.js';
import { timestamp, type Store, type WriteOptions } from './store.js';
import { TABLE_CONTENT_TYPE, toTable, wantsTable, type IncludeObject } from './table.js';
import { groupVersionOf, resourceOf, type ApiObject, type Kind, type Obj } from './types.js';
import type { Change } from './watch.js';
import { REVIEW_GROUP, REVIEW_VERSIONS, reviewKinds, selfSubjectReview } from './whoami.js';
import { METRICS_GROUP, metricsKinds, metricsRequest, type MetricsSource } from './metrics.js';
import { CRD_GROUP, crdKind, crdRequest } from './crds.js';
import { ACCESS_GROUP, ACCESS_VERSION, accessReview, accessReviewKinds } from './access-review.js';

export const MAX_BODY_BYTES = 3 * 1024 * 1024;

export interface ApiServerOptions {
  store: Store;
  /** host:port; port 0 picks a free one. */
  address: string;
  tls: { ca: Buffer; cert: Buffer; key: Buffer };
  log?: Logger;
  now?: () => number;
  /** A watcher with more than this many bytes written but not yet read by its client is dropped. */
  maxUnreadWatchBytes?: number;
  /**
   * Bytes written but not yet read summed over every watcher: beyond them, a
   * watcher that would hold more than its share (this over the number of
   * watches) is dropped rather than written to.
   */
  maxUnreadWatchBytesTotal?: number;
  bookmarkIntervalMs?: number;
  maxWatchSeconds?: number;
  /** Bytes of list answers being sent at once; a list beyond them waits its turn (429). */
  maxListBytes?: number;
  /**
   * Subresources beyond status, by resource and name ("pods/log"): what
   * discovery lists for them, and the handler that answers the request
   * (given after the credential and the route are checked).
   */
  subresources?: Record<string, Subresource>;
  /** Called as the server closes (the subresources end the upgraded connections they relay). */
  onClose?: () => void;
  /** metrics.k8s.io's numbers (the node's stats); without it the group is not served. */
  metrics?: MetricsSource;
}

export interface SubresourceTarget {
  kind: Kind;
  namespace: string;
  name: string;
  query: URLSearchParams;
}

export interface Subresource {
  /** The kind its responses are, for discovery ("Pod", "Status", "Scale"). */
  kind: string;
  /** The group and version of that kind, when not the resource's own (an Eviction is policy/v1). */
  group?: string;
  version?: string;
  verbs: string[];
  handle(req: IncomingMessage, res: ServerResponse, target: SubresourceTarget): Promise<void>;
  /** An HTTP Upgrade to it (exec, attach, port-forward); without this, upgrades are refused. A thrown ApiError is answered as a Status. */
  upgrade?(req: IncomingMessage, socket: Duplex, head: Buffer, target: SubresourceTarget): Promise<void>;
}

export interface ApiServer {
  /** host:port actually bound. */
  address: string;
  /** Bytes the watches have been written but their clients have not yet read (summed over every watch). */
  unreadWatchBytes(): number;
  close(): Promise<void>;
}

const JSON_TYPE = 'application/json';

export async function startApiServer(opts: ApiServerOptions): Promise<ApiServer> {
  const log = opts.log ?? silentLogger;
  const now = opts.now ?? Date.now;
  const store = opts.store;
  const maxUnread = opts.maxUnreadWatchBytes ?? 1024 * 1024;
  const maxUnreadTotal = opts.maxUnreadWatchBytesTotal ?? 64 * 1024 * 1024;
  const bookmarkEvery = opts.bookmarkIntervalMs ?? 60_000;
  const maxWatchSeconds = opts.maxWatchSeconds ?? 1800;
  const maxListBytes = opts.maxListBytes ?? 256 * 1024 * 1024;
  const watches = new Set<ServerResponse>();
  const unreadNow = (): number => {
    let n = 0;
    for (const w of watches) n += w.writableLength;
    return n;
  };
  /**
   * The unread total, summed afresh when a change starts its fan-out (the
   * clients read between changes, not during one) and kept up by each write.
   */
  let unreadTotal = 0;
  let unreadAt: Change | undefined;
  /**
   * The latest change's watch event lines (by type as each watcher sees it), encoded once and the
   * same Buffer written to every watcher rather than a string and its UTF-8 copy each. Only the
   * latest is kept: the history's changes are not doubled in memory.
   */
  let linesOf: Change | undefined;
  let lines = new Map<string, Buffer>();
  const lineOf = (c: Change, type: string): Buffer => {
    if (c !== linesOf) {
      linesOf = c;
      lines = new Map();
    }
    let b = lines.get(type);
    if (!b) lines.set(type, (b = Buffer.from(`{"type":"${type}","object":${c.json}}\n`)));
    return b;
  };
  const subresources = opts.subresources ?? {};
  const subresourcesFor = (k: Kind): Subresources => {
    const out: Subresources = {};
    if (k.status) out.status = { kind: k.kind, verbs: ['get', 'patch', 'update'] };
    if (k.scale) out.scale = { kind: 'Scale', group: 'autoscaling', version: 'v1', verbs: ['get', 'patch', 'update'] };
    const prefix = `${resourceOf(k)}/`;
    for (const [key, s] of Object.entries(subresources)) if (key.startsWith(prefix)) out[key.slice(prefix.length)] = { kind: s.kind, verbs: s.verbs, ...(s.group !== undefined ? { group: s.group, version: s.version } : {}) };
    return out;
  };
  const [host, portText] = splitHostPort(opts.address);
  let advertised = opts.address;

  const server = https.createServer(
    // Headers must arrive within 10 s; the check runs every second (Node's default is every 30).
    { ca: opts.tls.ca, cert: opts.tls.cert, key: opts.tls.key, requestCert: true, rejectUnauthorized: false, minVersion: 'TLSv1.2', connectionsCheckingInterval: 1000 },
    (req, res) => {
      handle(req, res).catch((err: unknown) => fail(res, err));
    },
  );
  // An upgrade comes here, not to the request handler: the same credential and route checks, then the subresource.
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    upgrade(req, socket, head).catch((err: unknown) => {
      const e = err instanceof ApiError ? err : new ApiError('InternalError', `Internal error occurred: ${(err as Error)?.message ?? String(err)}`);
      if (!(err instanceof ApiError)) log.error('API upgrade failed', { error: e.message });
      writeStatus(socket, e);
    });
  });
  server.headersTimeout = 10_000;
  server.requestTimeout = 60_000;
  server.keepAliveTimeout = 30_000;
  server.maxConnections = 1024;
  server.maxHeadersCount = 100;

  function send(res: ServerResponse, code: number, body: unknown, type = JSON_TYPE): void {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const text = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
    res.writeHead(code, { 'Content-Type': type, 'Content-Length': Buffer.byteLength(text), 'Cache-Control': 'no-cache, private' });
    res.end(text);
  }

  /**
   * Reserves `bytes` of list answers in flight until `res` is done, or
   * refuses with 429 when that would pass maxListBytes (one list alone is
   * always let through, so no list is unservable; lists of at most 64 KiB
   * are not counted: with at most 1024 connections they hold 64 MiB). A
   * client that does not take its answer within 2 minutes is cut off, so it
   * cannot hold the reservation.
   */
  let listBytes = 0;
  function holdListBytes(res: ServerResponse, bytes: number): void {
    if (bytes <= 64 * 1024) return;
    if (listBytes > 0 && listBytes + bytes > maxListBytes) {
      res.setHeader('Retry-After', '1');
      throw new ApiError('TooManyRequests', `the node's API is sending ${listBytes} bytes of lists already; retry, or ask for pages with limit`);
    }
    listBytes += bytes;
    const timer = setTimeout(() => res.destroy(), 120_000);
    timer.unref();
    res.once('close', () => {
      clearTimeout(timer);
      listBytes -= bytes;
    });
  }

  function fail(res: ServerResponse, err: unknown): void {
    const e = err instanceof ApiError ? err : new ApiError('InternalError', `Internal error occurred: ${(err as Error)?.message ?? String(err)}`);
    if (!(err instanceof ApiError)) log.error('API request failed', { error: e.message });
    send(res, e.code, e.status());
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (!(req.socket as TLSSocket).authorized) {
      req.resume();
      throw new ApiError('Unauthorized', 'Unauthorized');
    }
    const url = new URL(req.url ?? '/', 'https://api');
    const segs = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
    const method = req.method ?? 'GET';
    const accept = req.headers.accept;
    const readOnly = () => {
      if (method !== 'GET' && method !== 'HEAD') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
    };
    switch (url.pathname.replace(/\/$/, '')) {
      case '/version':
        readOnly();
        return send(res, 200, { ...KUBE_VERSION, gitCommit: '', gitTreeState: 'clean', buildDate: '', goVersion: process.version, compiler: 'node', platform: `${process.platform}/${process.arch}` });
      case '/healthz':
      case '/livez':
      case '/readyz':
        readOnly();
        return send(res, 200, 'ok', 'text/plain; charset=utf-8');
      case '/api': {
        readOnly();
        const v = aggregatedVersion(accept);
        if (v) return send(res, 200, aggregated(discoverable(), v, true, subresourcesFor), `application/json;g=apidiscovery.k8s.io;v=${v};as=APIGroupDiscoveryList`);
        return send(res, 200, apiVersions(advertised));
      }
      case '/apis': {
        readOnly();
        const v = aggregatedVersion(accept);
        if (v) return send(res, 200, aggregated(discoverable(), v, false, subresourcesFor), `application/json;g=apidiscovery.k8s.io;v=${v};as=APIGroupDiscoveryList`);
        return send(res, 200, groupList(discoverable()));
      }
      case '/openapi/v2':
        readOnly();
        return send(res, 200, openApiV2(store.kindList(), KUBE_VERSION.gitVersion), OPENAPI_V2_TYPE);
      case '/api/v1':
        readOnly();
        return send(res, 200, resourceList(kindsIn('', 'v1'), 'v1', subresourcesFor));
    }
    if (segs[0] === 'api' && segs[1] === 'v1') return resource(req, res, url, routeOf('', 'v1', segs.slice(2)));
    if (segs[0] === 'apis' && segs[1] === REVIEW_GROUP && (segs.length === 2 || REVIEW_VERSIONS.includes(segs[2]!))) return review(req, res, segs);
    if (segs[0] === 'apis' && segs[1] === ACCESS_GROUP && (segs.length === 2 || segs[2] === ACCESS_VERSION)) return accessReviewRequest(req, res, segs);
    if (segs[0] === 'apis' && segs[1] === CRD_GROUP) {
      const r = crdRequest(req, segs, store.resourceVersion);
      return send(res, r.code, r.body, r.table ? TABLE_CONTENT_TYPE : undefined);
    }
    if (segs[0] === 'apis' && segs[1] === METRICS_GROUP && opts.metrics) {
      const r = await metricsRequest(req, segs, url, opts.metrics);
      return send(res, r.code, r.body);
    }
    if (segs[0] === 'apis' && segs.length >= 2) {
      const group = segs[1]!;
      const versions = [...new Set(kindsIn(group).map((k) => k.version))];
      if (versions.length === 0) throw new ApiError('NotFound', 'the server could not find the requested resource');
      if (segs.length === 2) {
        readOnly();
        return send(res, 200, { kind: 'APIGroup', apiVersion: 'v1', ...groupOf(group, versions) });
      }
      const version = segs[2]!;
      if (!versions.includes(version)) throw new ApiError('NotFound', 'the server could not find the requested resource');
      if (segs.length === 3) {
        readOnly();
        return send(res, 200, resourceList(kindsIn(group, version), `${group}/${version}`, subresourcesFor));
      }
      return resource(req, res, url, routeOf(group, version, segs.slice(3)));
    }
    throw new ApiError('NotFound', 'the server could not find the requested resource');
  }

  async function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    if (!(req.socket as TLSSocket).authorized) throw new ApiError('Unauthorized', 'Unauthorized');
    const url = new URL(req.url ?? '/', 'https://api');
    const segs = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
    const r = segs[0] === 'api' && segs[1] === 'v1' ? routeOf('', 'v1', segs.slice(2)) : segs[0] === 'apis' && segs.length >= 4 ? routeOf(segs[1]!, segs[2]!, segs.slice(3)) : undefined;
    const s = r?.subresource !== undefined ? subresources[`${resourceOf(r.kind)}/${r.subresource}`] : undefined;
    if (!r || !s?.upgrade) throw new ApiError('BadRequest', 'the requested resource does not take an upgraded connection');
    return s.upgrade(req, socket, head, { kind: r.kind, namespace: r.namespace, name: r.name!, query: url.searchParams });
  }

  /** The stored kinds and those discovery lists though nothing stores them: the reviews, metrics, and the (empty) CRDs. */
  function discoverable(): Kind[] {
    return [...store.kindList(), ...reviewKinds, ...accessReviewKinds, ...(opts.metrics ? metricsKinds : []), crdKind];
  }

  async function accessReviewRequest(req: IncomingMessage, res: ServerResponse, segs: string[]): Promise<void> {
    if (segs.length === 2) return send(res, 200, { kind: 'APIGroup', apiVersion: 'v1', ...groupOf(ACCESS_GROUP, [ACCESS_VERSION]) });
    if (segs.length === 3) return send(res, 200, resourceList(accessReviewKinds, `${ACCESS_GROUP}/${ACCESS_VERSION}`));
    const plural = segs[3]!;
    if (segs.length !== 4 || !accessReviewKinds.some((k) => k.plural === plural)) throw new ApiError('NotFound', 'the server could not find the requested resource');
    if (req.method !== 'POST') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
    // The answer does not depend on the question; its spec is echoed when it came as JSON (a protobuf body is read, not decoded).
    const text = (await readBody(req)).toString('utf8');
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    return send(res, 201, accessReview(plural, body));
  }

  async function review(req: IncomingMessage, res: ServerResponse, segs: string[]): Promise<void> {
    const version = segs[2]!;
    const method = req.method ?? 'GET';
    if (segs.length === 2) return send(res, 200, { kind: 'APIGroup', apiVersion: 'v1', ...groupOf(REVIEW_GROUP, REVIEW_VERSIONS) });
    if (segs.length === 3) return send(res, 200, resourceList(reviewKinds.filter((k) => k.version === version), `${REVIEW_GROUP}/${version}`));
    if (segs.length !== 4 || segs[3] !== 'selfsubjectreviews') throw new ApiError('NotFound', 'the server could not find the requested resource');
    if (method !== 'POST') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
    // The body says nothing the answer depends on, but it is read (bounded) as any other.
    await readBody(req);
    return send(res, 201, selfSubjectReview(req, version));
  }

  function kindsIn(group: string, version?: string): Kind[] {
    return store.kindList().filter((k) => k.group === group && (version === undefined || k.version === version));
  }

  type Route = { kind: Kind; namespace: string; name?: string; allNamespaces: boolean; subresource?: string };

  function routeOf(group: string, version: string, rest: string[]): Route {
    const notFoundHere = () => new ApiError('NotFound', 'the server could not find the requested resource');
    let namespace = '';
    let allNamespaces = true;
    let tail = rest;
    if (rest[0] === 'namespaces' && rest.length >= 3) {
      namespace = rest[1]!;
      allNamespaces = false;
      tail = rest.slice(2);
    }
    if (tail.length < 1 || tail.length > 3) throw notFoundHere();
    const kind = store.kind(resourceOf({ group, plural: tail[0]! }));
    if (!kind || kind.version !== version) throw notFoundHere();
    if (!allNamespaces && !kind.namespaced) throw notFoundHere();
    const subresource = tail[2];
    if (subresource !== undefined && !subresourcesOf(kind).includes(subresource)) throw notFoundHere();
    if (subresource !== undefined && kind.namespaced && allNamespaces) throw notFoundHere();
    return { kind, namespace, name: tail[1], allNamespaces: allNamespaces && kind.namespaced, subresource };
  }

  function subresourcesOf(kind: Kind): string[] {
    return Object.keys(subresourcesFor(kind));
  }

  async function resource(req: IncomingMessage, res: ServerResponse, url: URL, r: Route): Promise<void> {
    const q = url.searchParams;
    const method = req.method ?? 'GET';
    const dryRun = dryRunOf(q);
    const { kind, namespace, name } = r;
    const item = name !== undefined;
    const listVersion = groupVersionOf(kind);
    if (r.subresource === 'scale' && kind.scale) {
      const m = q.get('fieldManager') ?? '';
      checkManager(m, 'PatchOptions');
      const fields = updateTracker({ manager: m || managerFromUserAgent(req.headers['user-agent']), apiVersion: listVersion, type: typeOf(kind), scope: 'main', subresource: 'scale', now: () => timestamp(now()) });
      return scale(req, res, kind, namespace, name!, dryRun, fields);
    }
    if (r.subresource !== undefined && r.subresource !== 'status') return subresources[`${resourceOf(kind)}/${r.subresource}`]!.handle(req, res, { kind, namespace, name: name!, query: q });
    const table = wantsTable(req.headers.accept);
    const validation = fieldValidationOf(q.get('fieldValidation'));
    const known: Known = { apiVersion: true, kind: true, metadata: META, ...kind.known };
    const checked = (o: Obj): Obj => {
      const warnings = checkFields(o, known, validation, kind.kind);
      if (warnings.length > 0) res.setHeader('Warning', warnings.map((w) => `299 - ${JSON.stringify(w)}`));
      return o;
    };
    const include = includeOf(q);
    const status = r.subresource === 'status';
    // Who writes, for metadata.managedFields: fieldManager, else the User-Agent's product.
    const manager = (options: string): string => {
      const m = q.get('fieldManager') ?? '';
      checkManager(m, options);
      return m !== '' ? m : managerFromUserAgent(req.headers['user-agent']);
    };
    const scopeOf = (sub: string | undefined): Scope => (sub === 'status' ? 'status' : kind.status ? 'main' : 'all');
    const tracker = (options: string, sub = r.subresource) =>
      updateTracker({ manager: manager(options), apiVersion: listVersion, type: typeOf(kind), scope: scopeOf(sub), subresource: sub, now: () => timestamp(now()) });
    const objectOut = (code: number, o: ApiObject) => (table ? send(res, code, toTable(kind, [o], {}, include, now()), TABLE_CONTENT_TYPE) : send(res, code, o));
    const listOpts = () => ({
      namespace: r.allNamespaces && !item ? undefined : namespace,
      labelSelector: q.get('labelSelector') ?? undefined,
      fieldSelector: q.get('fieldSelector') ?? undefined,
    });
    if (method === 'GET' && !item && isTrue(q.get('watch'))) return watch(req, res, kind, { ...listOpts(), resourceVersion: q.get('resourceVersion') ?? undefined }, q, table, include);
    if (method === 'GET' && item && isTrue(q.get('watch'))) return watch(req, res, kind, { namespace, fieldSelector: `metadata.name=${name}`, resourceVersion: q.get('resourceVersion') ?? undefined }, q, table, include);
    if (status && method !== 'GET' && method !== 'HEAD' && method !== 'PUT' && method !== 'PATCH') {
      req.resume();
      throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
    }
    if (r.allNamespaces && method !== 'GET') throw new ApiError('MethodNotAllowed', `the server does not allow this method on the requested resource: ${kind.plural} are namespaced`);
    switch (method) {
      case 'GET':
      case 'HEAD': {
        if (item) return objectOut(200, store.get(kind, namespace, name));
        const limit = q.get('limit');
        const l = limit === null || limit === '' ? undefined : Number(limit);
        if (l !== undefined && (!Number.isInteger(l) || l < 0)) throw badRequest(`invalid limit "${limit}"`);
        const out = store.listJson(kind, { ...listOpts(), limit: l, continue: q.get('continue') ?? undefined });
        const meta = { resourceVersion: out.resourceVersion, ...(out.continue ? { continue: out.continue } : {}) };
        // Lists are the one answer as large as the store: the bytes of those being sent at once are bounded.
        holdListBytes(res, out.bytes);
        if (table) return send(res, 200, toTable(kind, out.items.map((j) => JSON.parse(j) as ApiObject), meta, include, now()), TABLE_CONTENT_TYPE);
        return send(res, 200, `{"kind":${JSON.stringify(`${kind.kind}List`)},"apiVersion":${JSON.stringify(listVersion)},"metadata":${JSON.stringify(meta)},"items":[${out.items.join(',')}]}`);
      }
      case 'POST': {
        if (item) throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
        const body = await readObject(req);
        return objectOut(201, store.create(kind, namespace, checked(body), { dryRun, fields: tracker('CreateOptions') }));
      }
      case 'PUT': {
        if (!item) throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
        const body = await readObject(req);
        return objectOut(200, store.update(kind, namespace, name, checked(body), { dryRun, status, fields: tracker('UpdateOptions') }));
      }
      case 'PATCH': {
        if (!item) throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
        const media = mediaType(req.headers['content-type']);
        if (media === APPLY_PATCH_TYPE) {
          const force = q.get('force');
          if (force !== null && force !== 'true' && force !== 'false') throw badRequest(`force must be true or false, not "${force}"`);
          const fieldManager = q.get('fieldManager') ?? '';
          if (fieldManager === '') {
            req.resume();
            throw optionsInvalid('PatchOptions', [{ reason: 'FieldValueRequired', field: 'fieldManager', message: 'Required value: is required for apply patch' }]);
          }
          checkManager(fieldManager, 'PatchOptions');
          const config = checked(parseApplyBody((await readBody(req)).toString('utf8'), validation === 'Strict'));
          const out = applyObject(store, kind, namespace, name, config, { manager: fieldManager, force: force === 'true', dryRun, status, now: () => timestamp(now()) });
          return objectOut(out.created ? 201 : 200, out.object);
        }
        const type = PATCH_TYPES[media];
        if (!type) {
          req.resume();
          throw new ApiError('UnsupportedMediaType', `the body of the request was in an unknown format - accepted media types include: ${[...Object.keys(PATCH_TYPES), APPLY_PATCH_TYPE].join(', ')}`);
        }
        if (q.has('force')) {
          req.resume();
          throw optionsInvalid('PatchOptions', [{ reason: 'FieldValueForbidden', field: 'force', message: 'Forbidden: may not be specified for non-apply patch' }]);
        }
        const fields = tracker('PatchOptions');
        const patch = await readJson(req);
        return objectOut(200, store.patch(kind, namespace, name, (cur) => checked(applyPatch(type, cur as Obj, patch)), { dryRun, status, fields }));
      }
      case 'DELETE': {
        const { body, given } = await readOptional(req);
        const pre = (body.preconditions ?? {}) as Obj;
        const dry = dryRun || (Array.isArray(body.dryRun) && body.dryRun.includes('All'));
        const propagation = propagationOf(body, q, given);
        if (!item) {
          const items = store.deleteCollection(kind, { ...listOpts(), dryRun: dry, ...propagation });
          return send(res, 200, { kind: `${kind.kind}List`, apiVersion: listVersion, metadata: { resourceVersion: store.resourceVersion }, items });
        }
        const graceText = q.get('gracePeriodSeconds');
        const grace = typeof body.gracePeriodSeconds === 'number' ? body.gracePeriodSeconds : graceText !== null ? Number(graceText) : undefined;
        if (grace !== undefined && (!Number.isInteger(grace) || grace < 0)) throw badRequest(`gracePeriodSeconds must be a whole number of seconds, not ${String(grace)}`);
        const out = store.delete(kind, namespace, name, { dryRun: dry, uid: pre.uid as string | undefined, resourceVersion: pre.resourceVersion as string | undefined, gracePeriodSeconds: grace, ...propagation });
        if (!out.removed || kind.plural === 'namespaces') return objectOut(200, out.object);
        return send(res, 200, { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', details: { name, kind: kind.plural, uid: out.object.metadata.uid } });
      }
      default:
        req.resume();
        throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
    }
  }

  /** GET, PUT and PATCH of a Scale: read from the object, written back through the kind's own update. */
  async function scale(req: IncomingMessage, res: ServerResponse, kind: Kind, namespace: string, name: string, dryRun: boolean, fields: WriteOptions['fields']): Promise<void> {
    switch (req.method) {
      case 'GET':
      case 'HEAD':
        return send(res, 200, toScale(kind, store.get(kind, namespace, name)));
      case 'PUT': {
        const body = await readObject(req);
        return send(res, 200, toScale(kind, store.patch(kind, namespace, name, (cur) => fromScale(kind, cur, body), { dryRun, fields })));
      }
      case 'PATCH': {
        const type = PATCH_TYPES[mediaType(req.headers['content-type'])];
        if (!type) {
          req.resume();
          throw new ApiError('UnsupportedMediaType', `the body of the request was in an unknown format - accepted media types include: ${Object.keys(PATCH_TYPES).join(', ')}`);
        }
        const patch = await readJson(req);
        return send(res, 200, toScale(kind, store.patch(kind, namespace, name, (cur) => fromScale(kind, cur, applyPatch(type, toScale(kind, cur) as Obj, patch)), { dryRun, fields })));
      }
      default:
        req.resume();
        throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
    }
  }

  function watch(req: IncomingMessage, res: ServerResponse, kind: Kind, opts: { namespace?: string; labelSelector?: string; fieldSelector?: string; resourceVersion?: string }, q: URLSearchParams, table: boolean, include: IncludeObject): void {
    // Checked before the 200 goes out, so a bad selector is a 400, not an error event.
    parseLabelSelector(opts.labelSelector);
    parseFieldSelector(opts.fieldSelector, kind);
    const rv = opts.resourceVersion ?? '';
    if (rv !== '' && !/^\d{1,15}$/.test(rv)) throw badRequest(`invalid resource version "${rv}"`);
    const initialEnd = isTrue(q.get('sendInitialEvents'));
    if (initialEnd && rv !== '' && rv !== '0') throw badRequest('sendInitialEvents is only allowed with an unset or "0" resourceVersion');
    const bookmarks = isTrue(q.get('allowWatchBookmarks'));
    const timeoutText = q.get('timeoutSeconds');
    const seconds = timeoutText === null ? maxWatchSeconds : Math.min(Math.max(Number(timeoutText) || 0, 1), maxWatchSeconds);
    res.writeHead(200, { 'Content-Type': table ? TABLE_CONTENT_TYPE : JSON_TYPE, 'Cache-Control': 'no-cache, private', 'Transfer-Encoding': 'chunked' });
    res.flushHeaders();
    watches.add(res);
    let first = true;
    // The current objects sent first (a watch from no version) may exceed the bound: the listing is
    // as large as the store allows, and a client could not ask for it otherwise. Beyond it, maxUnread.
    let initial = true;
    let allowance = maxUnread;
    const line = (type: string, object: ApiObject, json?: string): string => {
      if (!table || type === 'BOOKMARK' || type === 'ERROR') return `{"type":"${type}","object":${json ?? JSON.stringify(object)}}\n`;
      const t = toTable(kind, [object], { resourceVersion: object.metadata.resourceVersion }, include, now(), first);
      first = false;
      return `{"type":"${type}","object":${JSON.stringify(t)}}\n`;
    };
    const bookmark = (annotations?: Record<string, string>) => {
      const apiVersion = kind.group ? `${kind.group}/${kind.version}` : kind.version;
      res.write(line('BOOKMARK', { apiVersion, kind: kind.kind, metadata: { resourceVersion: store.resourceVersion, ...(annotations ? { annotations } : {}) } }));
    };
    let stop = () => undefined as void;
    let ended = false;
    const end = (destroy: boolean) => {
      if (ended) return;
      ended = true;
      clearTimeout(timer);
      clearInterval(ticker);
      stop();
      watches.delete(res);
      if (destroy) res.destroy();
      else res.end();
    };
    const timer = setTimeout(() => end(false), seconds * 1000);
    timer.unref();
    const ticker = setInterval(() => {
      if (bookmarks && res.writableLength <= maxUnread) bookmark();
    }, bookmarkEvery);
    ticker.unref();
    res.on('close', () => end(true));
    try {
      stop = store.watch(kind, opts, {
        deliver: (c: Change, type) => {
          if (ended) return false;
          if (initial) {
            // The listing and the replay that open a watch: its own allowance grows by them, and the total is summed afresh at the next change.
            const text = table ? line(type, c.object, c.json) : lineOf(c, type);
            allowance += text.length;
            res.write(text);
            return true;
          }
          const before = res.writableLength;
          if (before > allowance) return false;
          const text = table ? line(type, c.object, c.json) : lineOf(c, type);
          if (c !== unreadAt) {
            unreadAt = c;
            unreadTotal = unreadNow();
          }
          // Past the total, only a watcher within its share of it is written to: one that never
          // reads cannot hold more than that, and a thousand of them not more than the total.
          if (unreadTotal + text.length > maxUnreadTotal && before + text.length > maxUnreadTotal / watches.size) {
            unreadTotal -= before;
            return false;
          }
          res.write(text);
          unreadTotal += res.writableLength - before;
          return true;
        },
        closed: (reason) => {
          log.debug('API watch closed', { resource: kind.plural, reason });
          // A watcher that fell behind cannot be told in-band (its buffer is full): the connection goes.
          setImmediate(() => end(reason.includes('behind')));
        },
      });
      initial = false;
      if (initialEnd && bookmarks) bookmark({ 'k8s.io/initial-events-end': 'true' });
    } catch (err) {
      const e = err instanceof ApiError ? err : new ApiError('InternalError', String(err));
      res.write(`{"type":"ERROR","object":${JSON.stringify(e.status())}}\n`);
      end(false);
    }
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(Number(portText), host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = server.address() as AddressInfo;
  advertised = `${host.includes(':') ? `[${host}]` : host}:${bound.port}`;
  return {
    address: advertised,
    unreadWatchBytes: unreadNow,
    close: async () => {
      for (const res of watches) res.end();
      opts.onClose?.();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

export function splitHostPort(address: string): [string, string] {
  const m = /^\[?([^\]]*?)\]?:(\d{1,5})$/.exec(address);
  if (!m || Number(m[2]) > 65535) throw new Error(`--api-address must be host:port, such as 127.0.0.1:6443, not "${address}"`);
  return [m[1]!, m[2]!];
}

const isTrue = (v: string | null) => v === 'true' || v === '1';

function mediaType(v: string | undefined): string {
  return (v ?? '').split(';')[0]!.trim().toLowerCase();
}

function dryRunOf(q: URLSearchParams): boolean {
  const v = q.getAll('dryRun');
  if (v.length === 0) return false;
  if (v.every((x) => x === 'All')) return true;
  throw badRequest(`Invalid dry run value: ${v.join(',')}: valid values are "All"`);
}

function includeOf(q: URLSearchParams): IncludeObject {
  const v = q.get('includeObject') ?? 'Metadata';
  if (v === 'None' || v === 'Metadata' || v === 'Object') return v;
  throw badRequest(`includeObject must be None, Metadata or Object, not "${v}"`);
}

/** The body, at most MAX_BODY_BYTES, or 413 without reading the rest. */
async function readBody(req: IncomingMessage): Promise<Buffer> {
  const tooLarge = () => new ApiError('RequestEntityTooLarge', `the request body is larger than ${MAX_BODY_BYTES} bytes`);
  const declared = Number(req.headers['content-length'] ?? 0);
  if (declared > MAX_BODY_BYTES) {
    req.socket.setTimeout(1000, () => req.socket.destroy());
    throw tooLarge();
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) {
      req.socket.setTimeout(1000, () => req.socket.destroy());
      throw tooLarge();
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const body = await readBody(req);
  let v: unknown;
  try {
    v = JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw badRequest(`the request body is not JSON: ${(err as Error).message}`);
  }
  checkDepth(v);
  return v;
}

async function readObject(req: IncomingMessage): Promise<Obj> {
  const type = mediaType(req.headers['content-type']);
  if (type === PROTOBUF_TYPE) return decodeProtobuf(await readBody(req));
  if (type !== JSON_TYPE && type !== '') {
    req.resume();
    throw new ApiError('UnsupportedMediaType', `the body of the request was in an unknown format - accepted media types include: application/json, ${PROTOBUF_TYPE}`);
  }
  const v = await readJson(req);
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw badRequest('the request body must be a JSON object');
  return v as Obj;
}

/** A DELETE's DeleteOptions, and whether it had a body (without one, its options are in the query). */
async function readOptional(req: IncomingMessage): Promise<{ body: Obj; given: boolean }> {
  const body = await readBody(req);
  if (body.length === 0) return { body: {}, given: false };
  if (mediaType(req.headers['content-type']) === PROTOBUF_TYPE) return { body: decodeDeleteOptions(body), given: true };
  try {
    const v = JSON.parse(body.toString('utf8')) as unknown;
    return { body: typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Obj) : {}, given: true };
  } catch {
    throw badRequest('the DeleteOptions in the body are not JSON');
  }
}
