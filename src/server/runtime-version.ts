import type { VersionRequest__Output } from '../gen/runtime/v1/VersionRequest.js';
import type { VersionResponse } from '../gen/runtime/v1/VersionResponse.js';
import { SKIFF_VERSION } from '../version.js';

export const CRI_API_VERSION = 'v1';

export async function version(_req: VersionRequest__Output): Promise<VersionResponse> {
  return {
    version: '0.1.0',
    runtimeName: 'skiff',
    runtimeVersion: SKIFF_VERSION,
    runtimeApiVersion: CRI_API_VERSION,
  };
}
