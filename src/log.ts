/** Structured logs: one JSON object per line on stderr. */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
const order: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
}

export function isLogLevel(s: string): s is LogLevel {
  return s in order;
}

let stderrGone = false;

/**
 * Writes a line to stderr, unless whoever read it has gone (EPIPE): logging
 * is best effort. Without a listener, that write error would reach the crash
 * guard, whose log line fails the same way, and so on for ever at full CPU,
 * while the daemon answers nothing.
 */
function writeStderr(line: string): void {
  if (stderrGone) return;
  if (process.stderr.listenerCount('error') === 0) {
    process.stderr.on('error', () => {
      stderrGone = true;
    });
  }
  process.stderr.write(line);
}

export function createLogger(level: LogLevel, write: (line: string) => void = writeStderr): Logger {
  const emit = (lvl: LogLevel, msg: string, fields?: Record<string, unknown>) => {
    if (order[lvl] < order[level]) return;
    write(JSON.stringify({ time: new Date().toISOString(), level: lvl, msg, ...fields }) + '\n');
  };
  return {
    debug: (m, f) => emit('debug', m, f),
    info: (m, f) => emit('info', m, f),
    warn: (m, f) => emit('warn', m, f),
    error: (m, f) => emit('error', m, f),
  };
}

export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };

/**
 * A warning that a peer can set off at will (a refused connection): the first
 * is written at once, the ones after it are counted and written as one line
 * per interval, so a flood of them costs a few lines, not a disk.
 */
export class ThrottledWarning {
  private pending = 0;
  private latest: Record<string, unknown> = {};
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly log: Logger,
    private readonly msg: string,
    private readonly intervalMs = 10_000,
  ) {}

  note(fields: Record<string, unknown> = {}): void {
    if (this.timer) {
      this.pending++;
      this.latest = fields;
      return;
    }
    this.log.warn(this.msg, { ...fields, count: 1 });
    this.arm();
  }

  /** Writes what is still counted and stops the timer. */
  flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.writePending();
  }

  private writePending(): boolean {
    if (!this.pending) return false;
    this.log.warn(this.msg, { ...this.latest, count: this.pending });
    this.pending = 0;
    return true;
  }

  private arm(): void {
    this.timer = setTimeout(() => {
      this.timer = undefined;
      // Another window only while they keep coming.
      if (this.writePending()) this.arm();
    }, this.intervalMs);
    this.timer.unref();
  }
}
