#!/usr/bin/env node
// First: it sizes V8's young generation before the rest is loaded.
import '../dist/heap.js';
import { main } from '../dist/cli/main.js';

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`skiff: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
