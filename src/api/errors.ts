/**
 * The API's errors: one type with the reason and code a v1 Status carries
 * (apimachinery's StatusError), turned into a Status once, at the server.
 */
export type Reason =
  | 'BadRequest'
  | 'Unauthorized'
  | 'Forbidden'
  | 'NotFound'
  | 'AlreadyExists'
  | 'Conflict'
  | 'Gone'
  | 'Expired'
  | 'Invalid'
  | 'MethodNotAllowed'
  | 'NotAcceptable'
  | 'UnsupportedMediaType'
  | 'RequestEntityTooLarge'
  | 'TooManyRequests'
  | 'Timeout'
  | 'ServiceUnavailable'
  | 'InternalError';

const codes: Record<Reason, number> = {
  BadRequest: 400,
  Unauthorized: 401,
  Forbidden: 403,
  NotFound: 404,
  MethodNotAllowed: 405,
  NotAcceptable: 406,
  AlreadyExists: 409,
  Conflict: 409,
  Gone: 410,
  Expired: 410,
  RequestEntityTooLarge: 413,
  UnsupportedMediaType: 415,
  Invalid: 422,
  TooManyRequests: 429,
  InternalError: 500,
  ServiceUnavailable: 503,
  Timeout: 504,
};

export interface Cause {
  reason: string;
  message: string;
  field?: string;
}

export interface Details {
  name?: string;
  group?: string;
  kind?: string;
  causes?: Cause[];
}

export class ApiError extends Error {
  readonly code: number;
  constructor(
    readonly reason: Reason,
    message: string,
    readonly details?: Details,
  ) {
    super(message);
    this.code = codes[reason];
  }

  status(): Record<string, unknown> {
    return {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: this.message,
      reason: this.reason,
      // A NotFound always carries details, empty for an unknown path, as the API server's does (kubectl debug reads them).
      ...(this.details ? { details: this.details } : this.reason === 'NotFound' ? { details: {} } : {}),
      code: this.code,
    };
  }
}

/** `configmaps "x" not found`, as the API server words it. */
export function notFound(resource: string, name: string, group = ''): ApiError {
  return new ApiError('NotFound', `${resource}${group ? `.${group}` : ''} "${name}" not found`, { name, group, kind: resource });
}

export function alreadyExists(resource: string, name: string): ApiError {
  return new ApiError('AlreadyExists', `${resource} "${name}" already exists`, { name, group: '', kind: resource });
}

export function conflict(resource: string, name: string, why: string): ApiError {
  return new ApiError('Conflict', `Operation cannot be fulfilled on ${resource} "${name}": ${why}`, { name, group: '', kind: resource });
}

/** Invalid (422) with one cause per field, the message as kubectl prints it. */
export function invalid(kind: string, name: string, causes: Cause[], group = ''): ApiError {
  const list = causes.map((c) => (c.field ? `${c.field}: ${c.message}` : c.message));
  const text = list.length === 1 ? list[0] : `[${list.join(', ')}]`;
  return new ApiError('Invalid', `${kind}${group ? `.${group}` : ''} "${name}" is invalid: ${text}`, { name, group, kind, causes });
}

export function badRequest(message: string): ApiError {
  return new ApiError('BadRequest', message);
}
