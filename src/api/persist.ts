/**
 * Where the objects written through the API live between runs: SQLite in WAL
 * mode (kine's idea: a revision per write), one row per object and the last
 * resourceVersion beside them, written in one transaction per change so a
 * kill -9 loses nothing acknowledged and the counter never goes back.
 */
import { openSqlite } from '../db.js';

const migrations = [
  `CREATE TABLE objects (
     resource TEXT NOT NULL,
     namespace TEXT NOT NULL,
     name TEXT NOT NULL,
     data TEXT NOT NULL,
     PRIMARY KEY (resource, namespace, name)
   );
   CREATE TABLE counter (id INTEGER PRIMARY KEY CHECK (id = 1), rv INTEGER NOT NULL);
   INSERT INTO counter (id, rv) VALUES (1, 0);`,
];

export interface StoredRow {
  resource: string;
  namespace: string;
  name: string;
  data: string;
}

export interface Persistence {
  load(): { rv: number; rows: StoredRow[] };
  put(row: StoredRow, rv: number): void;
  remove(resource: string, namespace: string, name: string, rv: number): void;
  /** Only the counter: a change to an object the database does not keep (one a manifest file owns). */
  count(rv: number): void;
  close(): void;
}

export function openApiDb(file: string): Persistence {
  // Secrets are in here: openSqlite makes the files the owner's alone.
  const db = openSqlite(file, migrations);
  const upsert = db.prepare('INSERT INTO objects (resource, namespace, name, data) VALUES (@resource, @namespace, @name, @data) ON CONFLICT (resource, namespace, name) DO UPDATE SET data = excluded.data');
  const del = db.prepare('DELETE FROM objects WHERE resource = ? AND namespace = ? AND name = ?');
  const setRv = db.prepare('UPDATE counter SET rv = ? WHERE id = 1');
  const put = db.transaction((row: StoredRow, rv: number) => {
    upsert.run(row);
    setRv.run(rv);
  });
  const remove = db.transaction((resource: string, namespace: string, name: string, rv: number) => {
    del.run(resource, namespace, name);
    setRv.run(rv);
  });
  return {
    load: () => ({
      rv: (db.prepare('SELECT rv FROM counter WHERE id = 1').get() as { rv: number }).rv,
      rows: db.prepare('SELECT resource, namespace, name, data FROM objects').all() as StoredRow[],
    }),
    put: (row, rv) => put(row, rv),
    remove: (resource, namespace, name, rv) => remove(resource, namespace, name, rv),
    count: (rv) => void setRv.run(rv),
    close: () => db.close(),
  };
}
