/** How every long-running `skiff` command ends: SIGTERM or SIGINT runs its stop once, then the exit code says how that went. */
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';

export function untilSignal(log: Logger, message: string, stop: () => Promise<void>): Promise<number> {
  return new Promise<number>((resolve) => {
    let stopping = false;
    const onSignal = (signal: string) => {
      if (stopping) return;
      stopping = true;
      log.info(message, { signal });
      stop().then(
        () => resolve(0),
        (err) => {
          log.error('shutdown failed', { error: errorMessage(err) });
          resolve(1);
        },
      );
    };
    process.once('SIGTERM', () => onSignal('SIGTERM'));
    process.once('SIGINT', () => onSignal('SIGINT'));
  });
}
