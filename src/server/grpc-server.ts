/**
 * The routes for both CRI services and skiff.v1.Images. Every method in the
 * proto is routed: the ones skiff implements to their handler, the others
 * answer UNIMPLEMENTED with a message, so no client ever hangs on a missing
 * method.
 */
import { SkiffError } from '../errors.js';
import type { Logger } from '../log.js';
import { toServiceError, unary, unimplemented, type UnaryHandler } from './boundary.js';
import { protoPath, serviceMethods, skiffProtoPath } from './proto.js';
import { DEFAULT_RPC_LIMITS, RpcServer, type Route, type RpcLimits, type ServerStream } from './rpc.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Handlers = Record<string, UnaryHandler<any, any>>;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type StreamHandlers = Record<string, (call: ServerStream<any>) => void>;

function routesOf(routes: Map<string, Route>, file: string, serviceName: string, handlers: Handlers, streams: StreamHandlers, log: Logger): void {
  for (const [name, method] of Object.entries(serviceMethods(file, serviceName))) {
    const full = `${serviceName}/${name}`;
    const route: Route = {
      path: method.path,
      responseStream: method.responseStream,
      decode: (b) => method.requestDeserialize(b),
      encode: (m) => method.responseSerialize(m as object),
    };
    const h = handlers[name];
    const s = streams[name];
    if (method.requestStream) {
      // No CRI or skiff method takes a client stream; one appearing in the proto is answered, not served.
      route.responseStream = false;
      route.unary = unimplemented(full, log, 'client streams are not served');
    } else if (method.responseStream && s) {
      route.stream = (call) => {
        log.info('rpc stream opened', { method: full });
        call.on('close', () => log.info('rpc stream closed', { method: full }));
        s(call);
      };
    } else if (method.responseStream) {
      route.stream = (call) => {
        log.info('rpc', { method: full, code: 'UNIMPLEMENTED' });
        call.fail(toServiceError(new SkiffError('Unimplemented', `${full} is not implemented by skiff yet`)));
      };
    } else if (h) {
      route.unary = unary(full, log, h);
    } else {
      route.unary = unimplemented(full, log, 'see the project issues for what is planned');
    }
    routes.set(method.path, route);
  }
}

export function createGrpcServer(
  runtime: Handlers,
  image: Handlers,
  log: Logger,
  streams: StreamHandlers = {},
  skiffImages: StreamHandlers = {},
  limits: RpcLimits = DEFAULT_RPC_LIMITS,
): RpcServer {
  const routes = new Map<string, Route>();
  routesOf(routes, protoPath, 'runtime.v1.RuntimeService', runtime, streams, log);
  routesOf(routes, protoPath, 'runtime.v1.ImageService', image, {}, log);
  // On the same root-only socket: whoever may call CRI may call these.
  routesOf(routes, skiffProtoPath, 'skiff.v1.Images', {}, skiffImages, log);
  return new RpcServer(routes, limits, (what, err) => log.debug('HTTP/2 connection error', { what, error: err.message }));
}
