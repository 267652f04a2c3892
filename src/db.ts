/** The embedded metadata store: SQLite in WAL mode, schema versioned by user_version. */
import Database from 'better-sqlite3';
import fs from 'node:fs';
import path from 'node:path';

export type Db = Database.Database;

const migrations: string[] = [
  `CREATE TABLE images (
     id TEXT PRIMARY KEY,
     manifest_digest TEXT NOT NULL,
     config TEXT NOT NULL,
     size INTEGER NOT NULL,
     chain_ids TEXT NOT NULL,
     blobs TEXT NOT NULL,
     created_at INTEGER NOT NULL
   );
   CREATE TABLE image_names (
     name TEXT PRIMARY KEY,
     image_id TEXT NOT NULL REFERENCES images(id) ON DELETE CASCADE,
     kind TEXT NOT NULL CHECK (kind IN ('tag', 'digest'))
   );
   CREATE INDEX image_names_by_image ON image_names(image_id);
   CREATE TABLE snapshots (
     id INTEGER PRIMARY KEY AUTOINCREMENT,
     chain_id TEXT NOT NULL UNIQUE,
     parent TEXT,
     size INTEGER NOT NULL,
     inodes INTEGER NOT NULL
   );`,
  `CREATE TABLE sandboxes (
     id TEXT PRIMARY KEY,
     name TEXT NOT NULL UNIQUE,
     data TEXT NOT NULL
   );
   CREATE TABLE containers (
     id TEXT PRIMARY KEY,
     name TEXT NOT NULL UNIQUE,
     sandbox_id TEXT NOT NULL,
     data TEXT NOT NULL
   );
   CREATE INDEX containers_by_sandbox ON containers(sandbox_id);`,
  // The image's User on its own, so that listing images reads no config.
  `ALTER TABLE images ADD COLUMN image_user TEXT NOT NULL DEFAULT '';
   UPDATE images SET image_user = json_extract(config, '$.config.User') WHERE json_type(config, '$.config.User') = 'text';`,
];

/**
 * A SQLite database of the daemon's own: WAL, its files the owner's alone
 * (0600, whatever the umask or an older version left; SQLite gives the WAL
 * and shm files the database's own mode when it makes them, and those
 * already there are tightened too), migrated forward by user_version.
 */
export function openSqlite(file: string, schema: readonly string[], opts: { foreignKeys?: boolean } = {}): Db {
  fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  fs.closeSync(fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW, 0o600));
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  for (const f of [file, `${file}-wal`, `${file}-shm`]) {
    try {
      if ((fs.statSync(f).mode & 0o777) !== 0o600) fs.chmodSync(f, 0o600);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
  }
  db.pragma('synchronous = NORMAL');
  if (opts.foreignKeys) db.pragma('foreign_keys = ON');
  db.pragma('busy_timeout = 5000');
  const version = db.pragma('user_version', { simple: true }) as number;
  for (let v = version; v < schema.length; v++) {
    db.transaction(() => {
      db.exec(schema[v]!);
      db.pragma(`user_version = ${v + 1}`);
    })();
  }
  return db;
}

/** The runtime's metadata; its records hold container environments, secretKeyRef values among them. */
export function openDb(file: string): Db {
  return openSqlite(file, migrations, { foreignKeys: true });
}
