/**
 * undici's Agent with its `request` API, and nothing else of undici.
 *
 * undici's index loads all of it (fetch, WebSocket, EventSource, caches,
 * mocks, proxies): importing it cost the daemon 5.0 MiB of V8 heap for good
 * and its first pull 180 ms; the Agent, its pools and `request` alone cost
 * 1.9 MiB and 50 ms (node -e, measured with a forced GC either side). The
 * index attaches the API methods to Dispatcher.prototype; this does the same
 * for the one method skiff calls. The paths are undici's own files (the
 * package has no `exports` map); the pull tests fail at once if a new undici
 * moves them.
 */
import type { Agent } from 'undici';

type AgentClass = typeof Agent;

let loading: Promise<AgentClass> | undefined;

// Through a variable: these files have no type declarations of their own.
const load = (file: string): Promise<{ default: unknown }> => import(file) as Promise<{ default: unknown }>;

export function loadAgent(): Promise<AgentClass> {
  return (loading ??= (async () => {
    const [agent, dispatcher, request] = await Promise.all([load('undici/lib/dispatcher/agent.js'), load('undici/lib/dispatcher/dispatcher.js'), load('undici/lib/api/api-request.js')]);
    const proto = (dispatcher.default as { prototype: Record<string, unknown> }).prototype;
    proto.request ??= request.default;
    return agent.default as AgentClass;
  })());
}
