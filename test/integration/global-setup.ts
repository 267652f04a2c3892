/** One registry for the integration suite; each test pushes its own images under unique names. */
import type { TestProject } from 'vitest/node';
import { startRegistry, type RunningRegistry } from '../helpers/registry.js';

let registry: RunningRegistry | undefined;

export async function setup(project: TestProject): Promise<void> {
  // Without root the suites skip themselves with a message; a missing registry binary is an error.
  if (process.getuid?.() !== 0) {
    project.provide('registryHost', '');
    return;
  }
  registry = await startRegistry();
  project.provide('registryHost', registry.host);
}

export async function teardown(): Promise<void> {
  await registry?.stop();
}

declare module 'vitest' {
  export interface ProvidedContext {
    registryHost: string;
  }
}
