/** Loads the CRI v1 definitions, and skiff's own services, with the same options the generated types assume. */
import * as grpc from '@grpc/grpc-js';
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

let cached: ProtoGrpcType | undefined;

export function loadCri(): ProtoGrpcType {
  if (!cached) {
    const def = protoLoader.loadSync(protoPath, loaderOptions);
    cached = grpc.loadPackageDefinition(def) as unknown as ProtoGrpcType;
  }
  return cached;
}

export const skiffProtoPath = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../proto/skiff.proto');

let cachedSkiff: SkiffGrpcType | undefined;

/** skiff.v1: the services the `skiff` command uses beside CRI (import, pull with progress). */
export function loadSkiff(): SkiffGrpcType {
  if (!cachedSkiff) {
    const def = protoLoader.loadSync(skiffProtoPath, loaderOptions);
    cachedSkiff = grpc.loadPackageDefinition(def) as unknown as SkiffGrpcType;
  }
  return cachedSkiff;
}
