/**
 * Builds the gRPC server for both CRI services and skiff.v1.Images. Every method in the proto is
 * registered: the ones skiff implements get their handler, the others answer
 * UNIMPLEMENTED with a message, so no client ever hangs on a missing method.
 */
import * as grpc from '@grpc/grpc-js';
import { SkiffError } from '../errors.js';
import type { Logger } from '../log.js';
import { answerTracker, toServiceError, unary, unimplemented, type UnaryHandler } from './boundary.js';
import { loadCri, loadSkiff } from './proto.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Handlers = Record<string, UnaryHandler<any, any>>;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type StreamHandlers = Record<string, (call: grpc.ServerWritableStream<any, any>) => void>;

function register(server: grpc.Server, service: grpc.ServiceDefinition, serviceName: string, handlers: Handlers, streams: StreamHandlers, log: Logger): void {
  const impl: grpc.UntypedServiceImplementation = {};
  for (const [name, method] of Object.entries(service)) {
    // `name` is the proto's method name (PullImage); grpc-js also accepts it as the implementation key.
    const full = `${serviceName}/${name}`;
    const key = name;
    const h = handlers[key];
    if (method.responseStream && streams[key]) {
      const handler = streams[key]!;
      impl[key] = (call: grpc.ServerWritableStream<unknown, unknown>) => {
        log.info('rpc stream opened', { method: full });
        call.on('close', () => log.info('rpc stream closed', { method: full }));
        handler(call);
      };
    } else if (method.responseStream) {
      impl[key] = (call: grpc.ServerWritableStream<unknown, unknown>) => {
        log.info('rpc', { method: full, code: 'UNIMPLEMENTED' });
        call.emit('error', toServiceError(new SkiffError('Unimplemented', `${full} is not implemented by skiff yet`)));
      };
    } else if (h) {
      impl[key] = unary(full, log, h);
    } else {
      impl[key] = unimplemented(full, log, 'see the project issues for what is planned');
    }
  }
  server.addService(acceptEncoded(service), impl);
}

/** A unary handler may answer with its response already encoded (a Buffer, see EncodedList): it is sent as it is. */
function acceptEncoded(service: grpc.ServiceDefinition): grpc.ServiceDefinition {
  const out: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const [name, m] of Object.entries(service)) out[name] = { ...m, responseSerialize: (v: unknown) => (Buffer.isBuffer(v) ? v : m.responseSerialize(v)) };
  return out as grpc.ServiceDefinition;
}

export function createGrpcServer(runtime: Handlers, image: Handlers, log: Logger, streams: StreamHandlers = {}, skiffImages: StreamHandlers = {}): grpc.Server {
  const cri = loadCri();
  const server = new grpc.Server({
    'grpc.max_receive_message_length': 16 << 20,
    'grpc.max_send_message_length': 16 << 20,
    // ExecSync answers can be large: their output stays counted until the client has taken them.
    interceptors: [answerTracker(new Set(['/runtime.v1.RuntimeService/ExecSync']))],
  });
  register(server, cri.runtime.v1.RuntimeService.service, 'runtime.v1.RuntimeService', runtime, streams, log);
  register(server, cri.runtime.v1.ImageService.service, 'runtime.v1.ImageService', image, {}, log);
  // On the same root-only socket: whoever may call CRI may call these.
  register(server, loadSkiff().skiff.v1.Images.service, 'skiff.v1.Images', {}, skiffImages, log);
  return server;
}

export function bindUnix(server: grpc.Server, socketPath: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.bindAsync(`unix:${socketPath}`, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolve()));
  });
}
