/**
 * The smallest OpenAPI v2 document kubectl needs before `apply`, `create
 * -f` and friends: it fetches /openapi/v2 (protobuf, gnostic's
 * openapi_v2.Document) to learn whether the server validates fields
 * itself, by looking for the `fieldValidation` query parameter on each
 * kind's PATCH operation (tagged x-kubernetes-group-version-kind). It names
 * no schemas, so kubectl's client-side checks pass and it computes apply
 * patches from its own built-in types; the server validates.
 */
import type { Kind } from './types.js';

/** What kubectl asks for is application/com.github.proto-openapi.spec.v2@v1.0+protobuf, which Go's mime parser refuses as a response type; the API server answers octet-stream. */
export const OPENAPI_V2_TYPE = 'application/octet-stream';

type Value = string | Buffer;

function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return Buffer.from(out);
}

/** A message of length-delimited fields (strings and sub-messages: all this document needs). */
function msg(...fields: Array<[number, Value]>): Buffer {
  return Buffer.concat(
    fields.flatMap(([no, v]) => {
      const b = typeof v === 'string' ? Buffer.from(v, 'utf8') : v;
      return [varint((no << 3) | 2), varint(b.length), b];
    }),
  );
}

function patchPath(k: Kind): Buffer {
  const base = k.group ? `/apis/${k.group}/${k.version}` : `/api/${k.version}`;
  const path = `${base}${k.namespaced ? '/namespaces/{namespace}' : ''}/${k.plural}/{name}`;
  // QueryParameterSubSchema{in: query, name: fieldValidation, type: string} inside ParametersItem → Parameter → NonBodyParameter.
  const param = msg([1, msg([2, msg([3, msg([2, 'query'], [4, 'fieldValidation'], [6, 'string'])])])]);
  const gvk = msg([1, 'x-kubernetes-group-version-kind'], [2, msg([2, `group: "${k.group}"\nkind: ${k.kind}\nversion: ${k.version}\n`])]);
  const operation = msg([5, `patch${k.kind}`], [8, param], [9, Buffer.alloc(0)], [13, gvk]);
  return msg([1, path], [2, msg([8, operation])]);
}

export function openApiV2(kinds: Kind[], version: string): Buffer {
  const paths = msg(...kinds.map((k): [number, Value] => [2, patchPath(k)]));
  return msg([1, '2.0'], [2, msg([1, 'Kubernetes'], [2, version])], [8, paths]);
}
