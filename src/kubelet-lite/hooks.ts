/**
 * postStart and preStop handlers, as the kubelet's lifecycle handler runner
 * runs them: exec through ExecSync, an HTTP GET, or a sleep. Each is bounded
 * by the caller's timeout (the pod's grace period for preStop) and by its
 * signal, never throws, and says what failed the way the kubelet's
 * FailedPostStartHook / FailedPreStopHook events do.
 */
import type { LifecycleHandler } from 'kubernetes-types/core/v1.js';
import { errorMessage } from '../errors.js';
import type { CriEndpoint } from './cri-client.js';
import type { ProbeTarget } from './model.js';
import { boundedGet, expandCommand, goDuration, KUBE_VERSION, probeURL, requestHeaders, resolvePort, runExec, timerMs } from './probes.js';

export interface HookOutcome {
  ok: boolean;
  /** Empty when ok. */
  message: string;
}

/** `name_namespace(uid)`, the kubelet's way of naming a pod in messages. */
function podName(t: ProbeTarget): string {
  return t.pod ? `${t.pod.name}_${t.pod.namespace}(${t.pod.uid})` : '';
}

/** Go's %v of a []string: `[sh -c echo hi]`. */
const goList = (a: string[]) => `[${a.join(' ')}]`;

export async function runHook(
  handler: LifecycleHandler,
  target: ProbeTarget,
  cri: CriEndpoint,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<HookOutcome> {
  const where = `for Container ${JSON.stringify(target.container.name)} in Pod ${JSON.stringify(podName(target))}`;
  // A grace period of a month would otherwise be a 1 ms timer.
  timeoutMs = timerMs(timeoutMs);
  try {
    if (handler.exec) {
      const command = handler.exec.command ?? [];
      const fail = (error: string, output: string): HookOutcome => ({
        ok: false,
        message: `Exec lifecycle hook (${goList(command)}) ${where} failed - error: ${error}, message: ${JSON.stringify(output)}`,
      });
      const cmd = expandCommand(command, target.container.env);
      // No grace past timeoutMs: the call's deadline cancels the exec, and the runtime kills the command.
      const r = await runExec(cri, target.containerId, cmd, timeoutMs, 0, signal);
      switch (r.kind) {
        case 'exited':
          if (r.exitCode === 0) return { ok: true, message: '' };
          return fail(`command '${cmd.join(' ')}' exited with ${r.exitCode}: ${r.output}`, r.output);
        case 'timeout':
          return fail(`command '${cmd.join(' ')}' timed out after ${goDuration(timeoutMs)}`, '');
        case 'error':
          return fail(signal?.aborted ? 'container terminated before the hook finished' : r.message, '');
      }
    }
    if (handler.httpGet) {
      const h = handler.httpGet;
      const path = h.path ?? '/';
      const fail = (error: string): HookOutcome => ({ ok: false, message: `HTTP lifecycle hook (${path}) ${where} failed - error: ${error}` });
      const port = resolvePort(h.port, target.container);
      if (typeof port === 'string') return fail(port);
      const host = h.host || target.podIP;
      if (!host) return fail('no pod IP to send the request to');
      const url = probeURL(h.scheme ?? 'HTTP', host, port, path);
      if (typeof url === 'string') return fail(url);
      try {
        const answer = await boundedGet(url, requestHeaders(h.httpHeaders ?? [], `kube-lifecycle/${KUBE_VERSION}`), timeoutMs, signal);
        if (answer.status >= 200 && answer.status < 400) return { ok: true, message: '' };
        return fail(`HTTP lifecycle hook failed with statuscode: ${answer.status}`);
      } catch (err) {
        return fail(errorMessage(err));
      }
    }
    if (handler.sleep) {
      const seconds = handler.sleep.seconds;
      const finished = await sleep(seconds * 1000, timeoutMs, signal);
      if (finished) return { ok: true, message: '' };
      return {
        ok: false,
        message: `Sleep lifecycle hook (${seconds}) ${where} failed - error: container terminated before sleep hook finished`,
      };
    }
    return { ok: false, message: `Cannot run handler: invalid handler: ${JSON.stringify(handler)}` };
  } catch (err) {
    return { ok: false, message: `lifecycle hook ${where} failed - error: ${errorMessage(err)}` };
  }
}

/** True when `ms` passed; false when the timeout or the signal came first. */
function sleep(ms: number, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    if (ms <= 0) return resolve(true);
    const end = (v: boolean) => {
      clearTimeout(done);
      clearTimeout(cut);
      signal?.removeEventListener('abort', onAbort);
      resolve(v);
    };
    const onAbort = () => end(false);
    const done = setTimeout(() => end(true), timerMs(ms));
    const cut = setTimeout(() => end(false), timeoutMs);
    done.unref();
    cut.unref();
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
