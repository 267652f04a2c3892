/** The kinds the node's API serves. Adding one is a strategy file and a line here. */
import type { Kind } from '../types.js';
import { configMapKind } from './configmap.js';
import { eventKind } from './event.js';
import { namespaceKind } from './namespace.js';
import { secretKind } from './secret.js';

export const KINDS: Kind[] = [namespaceKind, configMapKind, secretKind, eventKind];
