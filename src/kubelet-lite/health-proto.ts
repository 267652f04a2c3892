/** Loads grpc.health.v1 (proto/health.proto) for the gRPC probe, and for tests that serve it. */
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { loaderOptions } from '../server/proto.js';

export const healthProtoPath = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../proto/health.proto');

export type ServingStatus = 'UNKNOWN' | 'SERVING' | 'NOT_SERVING' | 'SERVICE_UNKNOWN';

export interface HealthCheckRequest {
  service: string;
}

export interface HealthCheckResponse {
  /** A number when the server sent a value the enum does not name. */
  status: ServingStatus | number;
}

export interface HealthClient extends grpc.Client {
  Check(
    req: Partial<HealthCheckRequest>,
    options: grpc.CallOptions,
    cb: (err: grpc.ServiceError | null, res?: HealthCheckResponse) => void,
  ): grpc.ClientUnaryCall;
}

export interface HealthPackage {
  Health: (new (address: string, creds: grpc.ChannelCredentials, options?: grpc.ChannelOptions) => HealthClient) & {
    service: grpc.ServiceDefinition;
  };
}

let cachedDef: protoLoader.PackageDefinition | undefined;
let cached: HealthPackage | undefined;

function definition(): protoLoader.PackageDefinition {
  cachedDef ??= protoLoader.loadSync(healthProtoPath, loaderOptions);
  return cachedDef;
}

/** The service as grpc-js clients and servers use it. */
export function loadHealth(): HealthPackage {
  if (!cached) {
    const root = grpc.loadPackageDefinition(definition()) as unknown as { grpc: { health: { v1: HealthPackage } } };
    cached = root.grpc.health.v1;
  }
  return cached;
}

/** Check's path and its message codecs, for a caller that speaks HTTP/2 itself. */
export function healthCheckMethod(): {
  path: string;
  serialize(req: HealthCheckRequest): Buffer;
  deserialize(buf: Buffer): HealthCheckResponse;
} {
  const m = (definition()['grpc.health.v1.Health'] as protoLoader.ServiceDefinition).Check!;
  return {
    path: m.path,
    serialize: (req) => m.requestSerialize(req),
    deserialize: (buf) => m.responseDeserialize(buf) as HealthCheckResponse,
  };
}
