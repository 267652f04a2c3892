/**
 * Reading a small regular file whose path someone else chose (a seccomp
 * profile named by a CRI request, say) without letting that choice hold the
 * daemon: the path is first opened O_PATH, which never blocks and never
 * starts a device or FIFO, checked to be a regular file within the size
 * bound, and only then read, through that very descriptor, up to the bound.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import { promisify } from 'node:util';
import { AT_FDCWD, O_CLOEXEC, O_PATH, openat2, RESOLVE_NO_MAGICLINKS } from './libc.js';

const fstat = promisify(fs.fstat);

/** Why a file was not read: it exists, but is not a small regular file (the message leaves the path to the caller). */
export class RefusedFile extends Error {
  constructor(
    readonly path: string,
    readonly reason: 'not-regular' | 'too-large',
    message: string,
  ) {
    super(message);
    this.name = 'RefusedFile';
  }
}

/**
 * The bytes of `file`, which must be a regular file of at most `maxBytes`.
 * A file that grows past the bound while it is read is refused too. Errors
 * from opening (ENOENT, EACCES, ...) pass through as they are.
 */
export async function readSmallRegularFile(file: string, maxBytes: number): Promise<Buffer> {
  const pathFd = openat2(AT_FDCWD, file, O_PATH | O_CLOEXEC, RESOLVE_NO_MAGICLINKS);
  try {
    const st = await fstat(pathFd);
    if (!st.isFile()) throw new RefusedFile(file, 'not-regular', 'not a regular file');
    if (st.size > maxBytes) throw new RefusedFile(file, 'too-large', `${st.size} bytes, more than the ${maxBytes} allowed`);
    // Reopens the inode checked above (a regular file: the open cannot block).
    const fh = await fsp.open(`/proc/self/fd/${pathFd}`, fs.constants.O_RDONLY | fs.constants.O_NOCTTY);
    try {
      const buf = Buffer.alloc(maxBytes + 1);
      let got = 0;
      while (got < buf.length) {
        const { bytesRead } = await fh.read(buf, got, buf.length - got, got);
        if (bytesRead === 0) break;
        got += bytesRead;
      }
      if (got > maxBytes) throw new RefusedFile(file, 'too-large', `grew past the ${maxBytes} bytes allowed while it was read`);
      return buf.subarray(0, got);
    } finally {
      await fh.close();
    }
  } finally {
    fs.closeSync(pathFd);
  }
}
