/**
 * The young generation's size, set before anything else is loaded.
 *
 * V8 doubles the young generation's semi-spaces after busy spells, up to
 * 8 MiB each, and an idle daemon never collects again to give them back:
 * after a burst of calls they stay resident for good. Held at their initial
 * 1 MiB, the daemon's RSS after a burst of 3000 calls was 84 MiB instead of
 * 98 MiB. The flag is read by V8 each time it would grow the space, so
 * setting it here, once the process runs, takes effect.
 *
 * A node started with its own semi-space flags keeps them.
 */
import v8 from 'node:v8';

const own = process.execArgv.some((a) => /^--(max|min)-semi-space-size|^--semi-space-growth-factor/.test(a)) || /semi-space/.test(process.env.NODE_OPTIONS ?? '');
if (!own) v8.setFlagsFromString('--semi-space-growth-factor=1');
