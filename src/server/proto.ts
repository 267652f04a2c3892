/**
 * Loads the CRI v1 definitions, and skiff's own services, with the same options the generated types assume.
 *
 * Each file is parsed once into a protobufjs Root, and its services' methods get the codecs
 * @grpc/proto-loader would give them (decode + toObject with `loaderOptions`, fromObject +
 * encode). proto-loader itself is not used: its package definition also holds a descriptor
 * object for every message type and the files' descriptors re-encoded, none of which the server
 * or grpc-js's clients read, and loading it loads protobufjs's descriptor extension and the
 * google.protobuf common files. In an idle daemon that was 1.0 MiB of V8 heap (bench/idle-rss.ts).
 */
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type * as protoLoader from '@grpc/proto-loader';
import type * as Protobuf from 'protobufjs';
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

/** One method of a service: its path and its four codecs, as grpc-js's clients take them. */
export interface MethodCodecs {
  path: string;
  requestStream: boolean;
  responseStream: boolean;
  requestSerialize: (value: object) => Buffer;
  requestDeserialize: (bytes: Buffer) => unknown;
  responseSerialize: (value: object) => Buffer;
  responseDeserialize: (bytes: Buffer) => unknown;
  /** The method's name in lower camel case: grpc-js clients answer to both. */
  originalName: string;
}

export type ServiceMethods = Record<string, MethodCodecs>;

function serializer(type: Protobuf.Type): (value: object) => Buffer {
  return (value) => {
    if (Array.isArray(value)) throw new Error(`Failed to serialize message: expected object with ${type.name} structure, got array instead`);
    return type.encode(type.fromObject(value)).finish() as Buffer;
  };
}

function deserializer(type: Protobuf.Type): (bytes: Buffer) => unknown {
  return (bytes) => type.toObject(type.decode(bytes), loaderOptions as Protobuf.IConversionOptions);
}

/** grpc-js clients also answer to a method's camel-case name; only they need it. */
function lowerCamel(name: string): string {
  return (require('lodash.camelcase') as (s: string) => string)(name);
}

/** Every service of a proto file, by its full name. */
const services = new Map<string, Map<string, ServiceMethods>>();

function servicesOf(file: string): Map<string, ServiceMethods> {
  let out = services.get(file);
  if (out) return out;
  const protobuf = require('protobufjs') as typeof Protobuf;
  const root = new protobuf.Root().loadSync(file, { keepCase: loaderOptions.keepCase });
  root.resolveAll();
  out = new Map();
  const walk = (ns: Protobuf.NamespaceBase, prefix: string): void => {
    for (const obj of ns.nestedArray) {
      const full = prefix ? `${prefix}.${obj.name}` : obj.name;
      if (obj instanceof protobuf.Service) {
        const methods: ServiceMethods = {};
        for (const m of obj.methodsArray) {
          const req = m.resolvedRequestType!;
          const res = m.resolvedResponseType!;
          const path = `/${full}/${m.name}`;
          let originalName: string | undefined;
          methods[m.name] = {
            path,
            requestStream: !!m.requestStream,
            responseStream: !!m.responseStream,
            requestSerialize: serializer(req),
            requestDeserialize: deserializer(req),
            responseSerialize: serializer(res),
            responseDeserialize: deserializer(res),
            get originalName() {
              return (originalName ??= lowerCamel(m.name));
            },
          };
        }
        out!.set(full, methods);
      } else if (obj instanceof protobuf.Namespace) {
        walk(obj, full);
      }
    }
  };
  walk(root, '');
  services.set(file, out);
  return out;
}

/** The methods of one service of a loaded proto, by proto method name. */
export function serviceMethods(file: string, service: string): ServiceMethods {
  const s = servicesOf(file).get(service);
  if (!s) throw new Error(`${service} is not a service of ${file}`);
  return s;
}

/**
 * The services of a proto file as grpc-js takes them in loadPackageDefinition: the same codecs
 * the server uses, so a process that serves and calls (`skiff node`) parses each file once.
 */
function clientDefinition(file: string): import('@grpc/grpc-js').GrpcObject {
  return grpcJs().loadPackageDefinition(Object.fromEntries(servicesOf(file)) as unknown as protoLoader.PackageDefinition);
}

let cached: ProtoGrpcType | undefined;

/** The CRI services as grpc-js client constructors (for clients: the CLI, kubelet-lite, tests). */
export function loadCri(): ProtoGrpcType {
  cached ??= clientDefinition(protoPath) as unknown as ProtoGrpcType;
  return cached;
}

export const skiffProtoPath = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../proto/skiff.proto');

let cachedSkiff: SkiffGrpcType | undefined;

/** skiff.v1: the services the `skiff` command uses beside CRI (import, pull with progress). */
export function loadSkiff(): SkiffGrpcType {
  cachedSkiff ??= clientDefinition(skiffProtoPath) as unknown as SkiffGrpcType;
  return cachedSkiff;
}
