/**
 * The node API's credentials, made with openssl at first start: a CA, a
 * serving certificate for every name and address the node answers on, and
 * an admin client certificate (O=system:masters, as kubeadm's admin.conf),
 * written into a kubeconfig. Keys and the kubeconfig are 0600 in a 0700
 * directory. The CA and the admin credential are kept across starts; the
 * serving certificate is made again when the node's names or addresses change.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface Credentials {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
  kubeconfig: string;
}

export interface CredentialOptions {
  /** Where the pki directory and the kubeconfig go (the agent's root dir). */
  dir: string;
  /** The address clients are told to use, e.g. 127.0.0.1:6443. */
  server: string;
  /** Extra names and addresses for the serving certificate. */
  sans?: string[];
}

async function exists(p: string): Promise<boolean> {
  return fs.access(p).then(
    () => true,
    () => false,
  );
}

async function openssl(args: string[]): Promise<void> {
  try {
    await run('openssl', args, { timeout: 30_000 });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`openssl ${args[0]} failed: ${(e.stderr ?? e.message).trim()}`);
  }
}

const KEY = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

/** Names and addresses the serving certificate covers: loopback, the hostname, and every address of the node. */
export function servingNames(extra: string[] = []): string[] {
  const names = new Set(['127.0.0.1', 'localhost', '::1', os.hostname(), ...extra]);
  for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) if (!a.address.startsWith('fe80')) names.add(a.address);
  return [...names].filter((n) => n !== '' && n !== '0.0.0.0' && n !== '::');
}

const isIp = (s: string) => /^[\d.]+$/.test(s) || s.includes(':');

async function sign(pki: string, name: string, subject: string, ext: string, days: number): Promise<void> {
  const extFile = path.join(pki, `${name}.ext`);
  await fs.writeFile(extFile, ext, { mode: 0o600 });
  await openssl(['req', ...KEY, '-keyout', path.join(pki, `${name}.key`), '-out', path.join(pki, `${name}.csr`), '-subj', subject]);
  await openssl(['x509', '-req', '-in', path.join(pki, `${name}.csr`), '-CA', path.join(pki, 'ca.crt'), '-CAkey', path.join(pki, 'ca.key'), '-CAcreateserial', '-days', String(days), '-out', path.join(pki, `${name}.crt`), '-extfile', extFile]);
  await fs.rm(path.join(pki, `${name}.csr`), { force: true });
  await fs.rm(extFile, { force: true });
}

export async function ensureCredentials(opts: CredentialOptions): Promise<Credentials> {
  const pki = path.join(opts.dir, 'pki');
  await fs.mkdir(pki, { recursive: true, mode: 0o700 });
  await fs.chmod(pki, 0o700);
  if (!(await exists(path.join(pki, 'ca.crt'))) || !(await exists(path.join(pki, 'ca.key')))) {
    await openssl(['req', '-x509', ...KEY, '-keyout', path.join(pki, 'ca.key'), '-out', path.join(pki, 'ca.crt'), '-days', '3650', '-subj', '/CN=skiff-ca', '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
    await fs.rm(path.join(pki, 'admin.crt'), { force: true });
    await fs.rm(path.join(pki, 'server.crt'), { force: true });
  }
  const names = servingNames(opts.sans);
  const namesFile = path.join(pki, 'server.names');
  const had = await fs.readFile(namesFile, 'utf8').catch(() => '');
  if (had !== names.join('\n') || !(await exists(path.join(pki, 'server.crt')))) {
    const san = names.map((n) => (isIp(n) ? `IP:${n}` : `DNS:${n}`)).join(',');
    await sign(pki, 'server', '/CN=skiff-apiserver', `subjectAltName=${san}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n`, 825);
    await fs.writeFile(namesFile, names.join('\n'), { mode: 0o600 });
  }
  if (!(await exists(path.join(pki, 'admin.crt')))) {
    await sign(pki, 'admin', '/O=system:masters/CN=skiff-admin', 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n', 825);
  }
  for (const f of await fs.readdir(pki)) await fs.chmod(path.join(pki, f), f.endsWith('.key') ? 0o600 : 0o644);
  const read = (f: string) => fs.readFile(path.join(pki, f));
  const [ca, cert, key, adminCert, adminKey] = await Promise.all([read('ca.crt'), read('server.crt'), read('server.key'), read('admin.crt'), read('admin.key')]);
  const kubeconfig = path.join(opts.dir, 'admin.kubeconfig');
  const b64 = (b: Buffer) => b.toString('base64');
  const text = [
    'apiVersion: v1',
    'kind: Config',
    'clusters:',
    '- name: skiff',
    '  cluster:',
    `    server: https://${opts.server}`,
    `    certificate-authority-data: ${b64(ca)}`,
    'users:',
    '- name: skiff-admin',
    '  user:',
    `    client-certificate-data: ${b64(adminCert)}`,
    `    client-key-data: ${b64(adminKey)}`,
    'contexts:',
    '- name: skiff',
    '  context:',
    '    cluster: skiff',
    '    user: skiff-admin',
    'current-context: skiff',
    '',
  ].join('\n');
  const tmp = `${kubeconfig}.tmp`;
  await fs.writeFile(tmp, text, { mode: 0o600 });
  await fs.chmod(tmp, 0o600);
  await fs.rename(tmp, kubeconfig);
  return { ca, cert, key, kubeconfig };
}
