/**
 * Runs benchPods (pods.ts) for one runtime in a process of its own, so that
 * each runtime's latency windows are measured by a client as fresh as the
 * other's. In one process the runtime measured second got a client that had
 * already decoded some 5000 ListContainers answers (grpc-js's decoder
 * compiled): 0.2-0.3 ms less per call in the first windows, whichever it was.
 *
 *   tsx bench/pods-child.ts SPEC_JSON RESULT_FILE
 *
 * SPEC_JSON: { name, socket, pids, monitors (a regular expression for the
 * per-container monitors' command lines), image, logDir }.
 */
import fs from 'node:fs/promises';
import { benchPods, pidsMatching } from './pods.js';

export interface PodsChildSpec {
  name: string;
  socket: string;
  pids: number[];
  monitors: string;
  image: string;
  logDir: string;
}

async function main(): Promise<void> {
  const [specJson, resultFile] = process.argv.slice(2);
  if (!specJson || !resultFile) throw new Error('usage: pods-child.ts SPEC_JSON RESULT_FILE');
  const spec = JSON.parse(specJson) as PodsChildSpec;
  const monitors = new RegExp(spec.monitors);
  const results = await benchPods({ name: spec.name, socket: spec.socket, processes: async () => [...spec.pids, ...(await pidsMatching(monitors))] }, spec.image, spec.logDir);
  await fs.writeFile(resultFile, JSON.stringify(results));
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(`pods bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  },
);
