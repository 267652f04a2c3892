/** Loads the CRI v1 definitions with the same options the generated types assume. */
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ProtoGrpcType } from '../gen/cri.js';

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
