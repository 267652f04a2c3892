import { createRequire } from 'node:module';

const pkg = createRequire(import.meta.url)('../package.json') as { version: string };
export const SKIFF_VERSION: string = pkg.version;

/** The Kubernetes version the node's API and agent speak, as /version and the Node's kubeletVersion show it. */
export const KUBE_VERSION = { major: '1', minor: '35', gitVersion: `v1.35.0-skiff.${SKIFF_VERSION}` };
