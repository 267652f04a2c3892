/**
 * The image's /etc/passwd and /etc/group are read as a process chrooted into
 * the rootfs would read them: symlinks on the way resolve inside the rootfs,
 * never onto the host's files.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { readInRoot, resolveUser } from '../../src/container/user.js';

describe('user lookup stays inside the rootfs', () => {
  let base: string;
  let rootfs: string;
  let host: string;
  beforeEach(async () => {
    base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-userlookup-'));
    rootfs = path.join(base, 'images/rootfs');
    host = path.join(base, 'host');
    await fs.mkdir(rootfs, { recursive: true });
    await fs.mkdir(host);
    // What the host would give away: a user the image does not have.
    await fs.writeFile(path.join(host, 'passwd'), 'root:x:0:0::/root:/bin/sh\nhostuser:x:4321:4321::/home/hostuser:/bin/sh\n');
    await fs.writeFile(path.join(host, 'group'), 'hostgroup:x:4321:\nwheel:x:10:hostuser,root\n');
  });
  afterEach(() => fs.rm(base, { recursive: true, force: true }));

  it('does not read the host files when /etc is a symlink to an absolute host dir', async () => {
    await fs.symlink(host, path.join(rootfs, 'etc'));
    expect(await readInRoot(rootfs, 'etc/passwd')).toBe('');
    await expect(resolveUser(rootfs, { imageUser: 'hostuser', supplementalGroups: [] })).rejects.toThrow(/not in the image's \/etc\/passwd/);
    await expect(resolveUser(rootfs, { imageUser: '0:hostgroup', supplementalGroups: [] })).rejects.toThrow(/not in the image's \/etc\/group/);
    // uid 0 stays uid 0 with none of the host's groups or home.
    expect(await resolveUser(rootfs, { imageUser: '', supplementalGroups: [] })).toEqual({ uid: 0, gid: 0, additionalGids: [], home: undefined });
  });

  it('resolves that absolute symlink inside the rootfs instead, as chroot would', async () => {
    // The same link, but the rootfs has its own copy of that path.
    await fs.symlink(host, path.join(rootfs, 'etc'));
    await fs.mkdir(path.join(rootfs, host), { recursive: true });
    await fs.writeFile(path.join(rootfs, host, 'passwd'), 'app:x:1000:1001::/home/app:/bin/sh\n');
    expect(await resolveUser(rootfs, { imageUser: 'app', supplementalGroups: [] })).toEqual({ uid: 1000, gid: 1001, additionalGids: [], home: '/home/app' });
  });

  it('does not read the host file through etc/passwd -> ../../../host/passwd', async () => {
    await fs.mkdir(path.join(rootfs, 'etc'));
    await fs.symlink('../../../host/passwd', path.join(rootfs, 'etc/passwd'));
    await fs.symlink('../../../host/group', path.join(rootfs, 'etc/group'));
    // Followed on the host, the links do reach the host's files.
    expect(await fs.readFile(path.join(rootfs, 'etc/passwd'), 'utf8')).toContain('hostuser');
    expect(await fs.readFile(path.join(rootfs, 'etc/group'), 'utf8')).toContain('hostgroup');
    expect(await readInRoot(rootfs, 'etc/passwd')).toBe('');
    expect(await readInRoot(rootfs, 'etc/group')).toBe('');
    await expect(resolveUser(rootfs, { imageUser: 'hostuser', supplementalGroups: [] })).rejects.toThrow(/not in the image/);
    // Inside the rootfs, `..` stops at its root: ../../../host/passwd is /host/passwd of the image.
    await fs.mkdir(path.join(rootfs, 'host'));
    await fs.writeFile(path.join(rootfs, 'host/passwd'), 'img:x:7:7::/home/img:/bin/sh\n');
    expect(await resolveUser(rootfs, { imageUser: 'img', supplementalGroups: [] })).toMatchObject({ uid: 7, gid: 7, home: '/home/img' });
  });

  it('never opens a fifo or device in place of the file', async () => {
    await fs.mkdir(path.join(rootfs, 'etc'));
    await fs.symlink('/dev/zero', path.join(rootfs, 'etc/passwd'));
    expect(await readInRoot(rootfs, 'etc/passwd')).toBe('');
    const { execFileSync } = await import('node:child_process');
    execFileSync('mkfifo', [path.join(rootfs, 'etc/group')]);
    expect(await readInRoot(rootfs, 'etc/group')).toBe('');
  });

  it('looks a user up in 4 MiB passwd and group files of one-line entries without holding them parsed', async () => {
    await fs.mkdir(path.join(rootfs, 'etc'));
    await fs.writeFile(path.join(rootfs, 'etc/passwd'), `${'a:x:1:1:a:/h:/s\n'.repeat(262_000)}app:x:5:6::/home/app:/bin/sh\n`);
    await fs.writeFile(path.join(rootfs, 'etc/group'), `${'g:x:1:b\n'.repeat(524_000)}extra:x:9:app\n`);
    // The parse is synchronous: what it held shows afterwards as heap the engine had to grow.
    const before = process.memoryUsage().heapTotal;
    expect(await resolveUser(rootfs, { imageUser: 'app', supplementalGroups: [] })).toEqual({ uid: 5, gid: 6, additionalGids: [9], home: '/home/app' });
    const peak = process.memoryUsage().heapTotal;
    expect(peak - before).toBeLessThan(64 << 20);
  });

  it('refuses a user the image puts in more groups than a process can have', async () => {
    await fs.mkdir(path.join(rootfs, 'etc'));
    await fs.writeFile(path.join(rootfs, 'etc/passwd'), 'app:x:5:5::/home/app:/bin/sh\n');
    await fs.writeFile(path.join(rootfs, 'etc/group'), Array.from({ length: 70_000 }, (_, i) => `g${i}:x:${i + 100}:app\n`).join(''));
    await expect(resolveUser(rootfs, { imageUser: 'app', supplementalGroups: [] })).rejects.toThrow(/more than Linux allows/);
  });
});

describe('ids from the image', () => {
  it('refuses user and group ids Linux cannot have', async () => {
    const rootfs = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-ids-'));
    try {
      for (const imageUser of ['4294967295', '99999999999999999999', '0:4294967296']) {
        await expect(resolveUser(rootfs, { imageUser, supplementalGroups: [] })).rejects.toThrow(/not a valid Linux/);
      }
      expect(await resolveUser(rootfs, { imageUser: '4294967294:7', supplementalGroups: [] })).toMatchObject({ uid: 4294967294, gid: 7 });
    } finally {
      await fs.rm(rootfs, { recursive: true, force: true });
    }
  });
});

describe("the image's group beside a run_as_user", () => {
  it("keeps the image's group when run_as_user is the image's own user, as a kubelet sends it", async () => {
    const rootfs = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-ids-'));
    try {
      await fs.mkdir(path.join(rootfs, 'etc'));
      await fs.writeFile(path.join(rootfs, 'etc/passwd'), 'root:x:0:0::/root:/bin/sh\napp:x:2000:2001::/home/app:/bin/sh\n');
      await fs.writeFile(path.join(rootfs, 'etc/group'), 'root:x:0:\nstaff:x:50:\n');
      // Not in /etc/passwd: the group came only from the image's User, and used to fall to root's.
      expect(await resolveUser(rootfs, { runAsUser: 1000, imageUser: '1000:1000', supplementalGroups: [] })).toMatchObject({ uid: 1000, gid: 1000 });
      expect(await resolveUser(rootfs, { runAsUser: 2000, imageUser: 'app:staff', supplementalGroups: [] })).toMatchObject({ uid: 2000, gid: 50 });
      expect(await resolveUser(rootfs, { runAsUsername: 'app', imageUser: '2000:7', supplementalGroups: [] })).toMatchObject({ uid: 2000, gid: 7 });
      // Another user than the image's: its own primary group, or 0 without an entry, as before.
      expect(await resolveUser(rootfs, { runAsUser: 3000, imageUser: '1000:1000', supplementalGroups: [] })).toMatchObject({ uid: 3000, gid: 0 });
      expect(await resolveUser(rootfs, { runAsUser: 2000, imageUser: '1000:1000', supplementalGroups: [] })).toMatchObject({ uid: 2000, gid: 2001 });
      // An explicit group always wins.
      expect(await resolveUser(rootfs, { runAsUser: 1000, runAsGroup: 5, imageUser: '1000:1000', supplementalGroups: [] })).toMatchObject({ uid: 1000, gid: 5 });
    } finally {
      await fs.rm(rootfs, { recursive: true, force: true });
    }
  });
});
