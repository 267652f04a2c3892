/** `skiff cri`: wires the stores, services and servers together and runs them. */
import fsp from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import type * as grpc from '@grpc/grpc-js';
import { openDb, type Db } from './db.js';
import { SkiffError } from './errors.js';
import type { Logger } from './log.js';
import { LocalContentStore } from './image/content.js';
import { RegistryClient } from './image/registry.js';
import { ImageService } from './image/service.js';
import { OverlaySnapshotter } from './image/snapshot.js';
import { createGrpcServer, bindUnix } from './server/grpc-server.js';
import { startAuthorityProxy, type AuthorityProxy } from './server/h2-authority-proxy.js';
import { imageFsInfo } from './server/image-fs-info.js';
import { listImages } from './server/image-list.js';
import { pullImage } from './server/image-pull.js';
import { removeImage } from './server/image-remove.js';
import { imageStatus } from './server/image-status.js';
import { status, type Readiness } from './server/runtime-status.js';
import { version } from './server/runtime-version.js';

export interface DaemonOptions {
  socket: string;
  root: string;
  state: string;
  registryConfig: string;
  pinnedImages: string[];
}

export interface Daemon {
  images: ImageService;
  /** Stops accepting, lets in-flight RPCs finish, and closes the stores. */
  close(): Promise<void>;
}

async function socketInUse(p: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect(p);
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}

function listen(server: net.Server): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.once('listening', () => {
      server.off('error', reject);
      resolve();
    });
  });
}

export async function startDaemon(opts: DaemonOptions, log: Logger): Promise<Daemon> {
  for (const dir of [opts.root, opts.state, path.dirname(opts.socket)]) await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
  if (await socketInUse(opts.socket)) {
    throw new SkiffError('FailedPrecondition', `another process is serving ${opts.socket}; stop it first`);
  }
  await fsp.rm(opts.socket, { force: true });
  const privateSocket = path.join(opts.state, 'grpc.sock');
  await fsp.rm(privateSocket, { force: true });

  const db: Db = openDb(path.join(opts.root, 'metadata.db'));
  const content = new LocalContentStore(path.join(opts.root, 'content'));
  await content.init();
  const snapshots = new OverlaySnapshotter(opts.root, db);
  await snapshots.init();
  // Read at every pull: a directory or hosts.toml added later takes effect without a restart.
  const registry = new RegistryClient({ configRoot: opts.registryConfig, logger: log });
  const images = new ImageService({ db, content, snapshots, registry, log, pinned: opts.pinnedImages });
  await images.gc();

  const readiness: Readiness = {
    runtime: () => ({ ready: true }),
    network: () => ({
      ready: false,
      reason: 'NetworkPluginNotReady',
      message: 'skiff does not run pod sandboxes yet, so no pod network is configured',
    }),
    info: () => ({ root: opts.root, state: opts.state, registryConfig: opts.registryConfig }),
  };
  const server: grpc.Server = createGrpcServer(
    { Version: version, Status: status(readiness) },
    {
      PullImage: pullImage(images),
      ListImages: listImages(images),
      ImageStatus: imageStatus(images),
      RemoveImage: removeImage(images),
      ImageFsInfo: imageFsInfo(images),
    },
    log,
  );
  await bindUnix(server, privateSocket);
  await fsp.chmod(privateSocket, 0o600);

  const oldMask = process.umask(0o117);
  let proxy: AuthorityProxy;
  try {
    proxy = startAuthorityProxy(opts.socket, privateSocket, log);
    await listen(proxy.server);
  } finally {
    process.umask(oldMask);
  }
  await fsp.chmod(opts.socket, 0o660);
  log.info('skiff cri serving', { socket: opts.socket, root: opts.root, state: opts.state, registryConfig: opts.registryConfig });

  let closing: Promise<void> | undefined;
  return {
    images,
    close: () =>
      (closing ??= (async () => {
        proxy.server.close();
        // In-flight RPCs finish; a call still running after the grace period is cut off.
        const grace = setTimeout(() => server.forceShutdown(), 30_000);
        await new Promise<void>((r) => server.tryShutdown(() => r()));
        clearTimeout(grace);
        proxy.destroyConnections();
        await registry.close();
        db.close();
        await fsp.rm(opts.socket, { force: true });
        await fsp.rm(privateSocket, { force: true });
      })()),
  };
}
