import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { OciRuntime, startConmon } from '../../src/oci/runtime.js';
import { SkiffError } from '../../src/errors.js';
import { run } from '../../src/sys/run.js';

describe('startConmon', () => {
  let dir: string | undefined;
  afterEach(async () => {
    if (dir) await fs.rm(dir, { recursive: true, force: true });
  });

  it('gives up on a conmon that never reports the pid, and kills it', async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-conmon-'));
    const pidOut = path.join(dir, 'fake.pid');
    // A stand-in conmon that holds the sync pipe open and never writes to it.
    const fake = path.join(dir, 'conmon');
    await fs.writeFile(fake, `#!/bin/sh\necho $$ > ${pidOut}\nexec sleep 300\n`, { mode: 0o755 });
    const t0 = Date.now();
    const err = await startConmon(
      {
        id: 'a'.repeat(64), name: 'x', bundle: dir, runtime: new OciRuntime('runc', '/bin/false', dir, run), logPath: path.join(dir, 'log'),
        exitDir: dir, socketDir: dir, pidFile: path.join(dir, 'pid'), conmonPidFile: path.join(dir, 'conmon.pid'),
        tty: false, stdin: false, stdinOnce: false, timeoutMs: 500,
      },
      fake,
    ).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SkiffError);
    expect((err as SkiffError).kind).toBe('DeadlineExceeded');
    expect(Date.now() - t0).toBeLessThan(5_000);
    const pid = Number((await fs.readFile(pidOut, 'utf8')).trim());
    // Killed (perhaps a zombie until the test runner reaps it), not left sleeping.
    await expect.poll(async () => {
      const stat = await fs.readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
      return stat === '' || / Z /.test(stat);
    }).toBe(true);
  });
});
