/** The kinds the node's API serves. Adding one is a strategy file and a line here. */
import type { Kind } from '../types.js';
import { configMapKind } from './configmap.js';
import { eventKind } from './event.js';
import { leaseKind } from './lease.js';
import { namespaceKind } from './namespace.js';
import { nodeKind } from './node.js';
import { podKind } from './pod.js';
import { secretKind } from './secret.js';

/** Every kind, for the node named `nodeName` (where pods nobody placed are placed). */
export function nodeKinds(nodeName: string): Kind[] {
  return [namespaceKind, configMapKind, secretKind, eventKind, podKind(nodeName), nodeKind, leaseKind];
}
