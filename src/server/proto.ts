/** Loads the CRI v1 definitions, and skiff's own services, with the same options the generated types assume. */
import { createRequire } from 'node:module';
import * as protoLoader from '@grpc/proto-loader';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ProtoGrpcType } from '../gen/cri.js';
import type { ProtoGrpcType as SkiffGrpcType } from '../gen/skiff.js';

export const protoPath = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../proto/cri.proto');

export const loaderOptions: protoLoader.Options = {
  keepCase: false,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
};

const require = createRequire(import.meta.url);
/** grpc-js is loaded only by clients: the daemon's server works from the definitions alone. */
const grpcJs = (): typeof import('@grpc/grpc-js') => require('@grpc/grpc-js') as typeof import('@grpc/grpc-js');

const definitions = new Map<string, protoLoader.PackageDefinition>();

/** The parsed definitions of a proto file, each service a map of its methods with their codecs. */
export function definitionOf(file: string): protoLoader.PackageDefinition {
  let def = definitions.get(file);
  if (!def) {
    def = protoLoader.loadSync(file, loaderOptions);
    definitions.set(file, def);
  }
  return def;
}

/** The methods of one service of a loaded proto, by proto method name. */
export function serviceMethods(file: string, service: string): protoLoader.ServiceDefinition {
  const s = definitionOf(file)[service];
  if (!s || 'format' in s) throw new Error(`${service} is not a service of ${file}`);
  return s as protoLoader.ServiceDefinition;
}

let cached: ProtoGrpcType | undefined;

/** The CRI services as grpc-js client constructors (for clients: the CLI, kubelet-lite, tests). */
export function loadCri(): ProtoGrpcType {
  cached ??= grpcJs().loadPackageDefinition(definitionOf(protoPath)) as unknown as ProtoGrpcType;
  return cached;
}

export const skiffProtoPath = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../proto/skiff.proto');

let cachedSkiff: SkiffGrpcType | undefined;

/** skiff.v1: the services the `skiff` command uses beside CRI (import, pull with progress). */
export function loadSkiff(): SkiffGrpcType {
  cachedSkiff ??= grpcJs().loadPackageDefinition(definitionOf(skiffProtoPath)) as unknown as SkiffGrpcType;
  return cachedSkiff;
}
