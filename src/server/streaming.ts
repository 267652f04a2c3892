/** Exec, Attach and PortForward: each answers with a single-use URL on the streaming server. */
import type { ExecRequest__Output } from '../gen/runtime/v1/ExecRequest.js';
import type { PortForwardRequest__Output } from '../gen/runtime/v1/PortForwardRequest.js';
import { failedPrecondition, invalidArgument } from '../errors.js';
import type { ContainerService } from '../container/service.js';
import type { SandboxService } from '../sandbox/service.js';
import type { StreamingServer } from '../streaming/server.js';
import { commandBytes } from '../streaming/tokens.js';

/** The largest command Exec and ExecSync accept: far more than any exec could run. */
export const MAX_COMMAND_BYTES = 1024 * 1024;

/** Refuses a command larger than any exec could run, before it is stored or written anywhere. */
export function checkCommand(rpc: string, cmd: string[]): void {
  if (!cmd.length) throw invalidArgument(`${rpc}: cmd is empty`);
  const n = commandBytes(cmd);
  if (n > MAX_COMMAND_BYTES) throw invalidArgument(`${rpc}: cmd is too large (${n} bytes counting 32 per argument; at most ${MAX_COMMAND_BYTES})`);
}

export function streamingHandlers(streaming: StreamingServer, sandboxes: SandboxService, containers: ContainerService) {
  return {
    Exec: async (req: ExecRequest__Output) => {
      if (!req.containerId) throw invalidArgument('Exec: container_id is required');
      const c = containers.mustGet(req.containerId);
      if (c.state !== 'CONTAINER_RUNNING') throw failedPrecondition(`container ${c.id} is not running`);
      checkCommand('Exec', req.cmd);
      if (!req.stdin && !req.stdout && !req.stderr) throw invalidArgument('Exec: one of stdin, stdout or stderr must be set');
      if (req.tty && req.stderr) throw invalidArgument('Exec: tty and stderr cannot both be set (a terminal has one output)');
      return { url: streaming.issue({ kind: 'exec', containerId: c.id, cmd: req.cmd, tty: req.tty, stdin: req.stdin, stdout: req.stdout, stderr: req.stderr }) };
    },
    Attach: async (req: { containerId: string; stdin: boolean; tty: boolean; stdout: boolean; stderr: boolean }) => {
      if (!req.containerId) throw invalidArgument('Attach: container_id is required');
      const c = containers.mustGet(req.containerId);
      if (c.state !== 'CONTAINER_RUNNING') throw failedPrecondition(`container ${c.id} is not running`);
      if (!req.stdin && !req.stdout && !req.stderr) throw invalidArgument('Attach: one of stdin, stdout or stderr must be set');
      if (req.stdin && !c.config.stdin) throw invalidArgument(`Attach: container ${c.id} was not created with stdin open`);
      // The terminal is the container's: attach follows how it was created.
      const tty = c.config.tty;
      return { url: streaming.issue({ kind: 'attach', containerId: c.id, bundle: c.bundle, tty, stdin: req.stdin, stdout: req.stdout, stderr: req.stderr && !tty }) };
    },
    PortForward: async (req: PortForwardRequest__Output) => {
      if (!req.podSandboxId) throw invalidArgument('PortForward: pod_sandbox_id is required');
      const s = sandboxes.mustGet(req.podSandboxId);
      if (s.state !== 'SANDBOX_READY') throw failedPrecondition(`pod sandbox ${s.id} is not ready`);
      for (const p of req.port) if (!Number.isInteger(p) || p <= 0 || p > 65535) throw invalidArgument(`PortForward: invalid port ${p}`);
      return { url: streaming.issue({ kind: 'portforward', sandboxId: s.id, netns: s.netns, ports: req.port }) };
    },
  };
}
