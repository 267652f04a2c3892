import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openDb, type Db } from '../../src/db.js';
import { SkiffError } from '../../src/errors.js';
import { RecordIndex, type RecordTable } from '../../src/record-index.js';

interface Rec {
  id: string;
  name: string;
  state: string;
  pid?: number;
  config: { labels: Record<string, string>; args: string[] };
}

/** The sandboxes table of a real metadata database, as SandboxService uses it. */
function table(db: Db, counts?: { loads: number }): RecordTable<Rec> {
  return {
    load: () => {
      if (counts) counts.loads++;
      return (db.prepare('SELECT data FROM sandboxes ORDER BY rowid').all() as Array<{ data: string }>).map((r) => JSON.parse(r.data) as Rec);
    },
    put: (r, json) => void db.prepare('INSERT OR REPLACE INTO sandboxes (id, name, data) VALUES (?, ?, ?)').run(r.id, r.name, json),
    remove: (id) => void db.prepare('DELETE FROM sandboxes WHERE id = ?').run(id),
  };
}

const rec = (id: string, name = `n-${id}`): Rec => ({ id, name, state: 'READY', pid: 42, config: { labels: { app: 'a' }, args: ['sleep', '1'] } });

describe('RecordIndex', () => {
  let dir: string;
  let db: Db;
  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-records-'));
    db = openDb(path.join(dir, 'metadata.db'));
  });
  afterEach(async () => {
    db.close();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('reads the table once, and answers every later read from memory', () => {
    table(db).put(rec('aa11'), JSON.stringify(rec('aa11')));
    const counts = { loads: 0 };
    const idx = new RecordIndex(table(db, counts), 'pod sandbox');
    expect(idx.view('aa11')?.name).toBe('n-aa11');
    // A row changed behind the index's back is not seen: nothing reads the table again.
    db.prepare('DELETE FROM sandboxes').run();
    expect(idx.view('aa11')?.name).toBe('n-aa11');
    expect(idx.values().map((r) => r.id)).toEqual(['aa11']);
    expect(counts.loads).toBe(1);
  });

  it('writes through: what was saved and deleted is what a restart loads', () => {
    const idx = new RecordIndex(table(db), 'pod sandbox');
    idx.save(rec('aa11'));
    idx.save(rec('bb22'));
    const changed = idx.get('aa11')!;
    changed.state = 'NOTREADY';
    changed.pid = undefined;
    idx.save(changed);
    idx.delete('bb22');
    const restarted = new RecordIndex(table(db), 'pod sandbox');
    expect(restarted.values()).toEqual([{ ...rec('aa11'), state: 'NOTREADY', pid: undefined }].map((r) => JSON.parse(JSON.stringify(r))));
    expect(restarted.view('bb22')).toBeUndefined();
    // Memory holds what the table holds: a field set to undefined is gone in both.
    expect('pid' in idx.view('aa11')!).toBe(false);
  });

  it('hands out frozen records to read, and copies to change', () => {
    const idx = new RecordIndex(table(db), 'pod sandbox');
    const mine = rec('aa11');
    idx.save(mine);
    // The caller's object is not the stored one.
    mine.state = 'CHANGED';
    mine.config.labels.app = 'changed';
    expect(idx.view('aa11')!.state).toBe('READY');
    expect(idx.view('aa11')!.config.labels.app).toBe('a');
    const view = idx.view('aa11')! as Rec;
    expect(() => {
      view.state = 'X';
    }).toThrow(TypeError);
    expect(() => view.config.args.push('x')).toThrow(TypeError);
    const copy = idx.get('aa11')!;
    copy.state = 'COPY';
    copy.config.args.push('more');
    expect(idx.view('aa11')!.state).toBe('READY');
    expect(idx.view('aa11')!.config.args).toEqual(['sleep', '1']);
  });

  it('finds by unique prefix, and says when a prefix is ambiguous', () => {
    const idx = new RecordIndex(table(db), 'pod sandbox');
    idx.save(rec('abc1'));
    idx.save(rec('abd2'));
    expect(idx.findView('abc')?.id).toBe('abc1');
    expect(idx.findView('abc1')?.id).toBe('abc1');
    expect(idx.findView('x')).toBeUndefined();
    expect(idx.findView('')).toBeUndefined();
    let err: unknown;
    try {
      idx.findView('ab');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(SkiffError);
    expect((err as SkiffError).kind).toBe('InvalidArgument');
    expect((err as SkiffError).message).toContain('matches 2 pod sandboxes');
  });

  it('hands out copies by prefix, and NotFound with the record\'s kind when there is none', () => {
    const idx = new RecordIndex(table(db), 'container');
    idx.save(rec('abc1'));
    const copy = idx.mustGet('abc');
    copy.state = 'CHANGED';
    expect(idx.view('abc1')!.state).toBe('READY');
    expect(idx.mustView('abc1')).toBe(idx.view('abc1'));
    for (const f of [() => idx.mustGet('zz'), () => idx.mustView('zz')]) {
      let err: unknown;
      try {
        f();
      } catch (e) {
        err = e;
      }
      expect((err as SkiffError).kind).toBe('NotFound');
      expect((err as SkiffError).message).toBe('container "zz" not found');
    }
  });

  it('leaves memory unchanged when the table refuses a write', () => {
    const real = table(db);
    const idx = new RecordIndex<Rec>({ ...real, put: (r, json) => (r.id === 'bb22' ? db.prepare('INSERT INTO nosuchtable VALUES (?)').run(json) : real.put(r, json)) }, 'pod sandbox');
    idx.save(rec('aa11'));
    expect(() => idx.save(rec('bb22'))).toThrow(/no such table/);
    const changed = idx.get('aa11')!;
    changed.state = 'NOTREADY';
    expect(() => idx.save({ ...changed, id: 'bb22' })).toThrow(/no such table/);
    expect(idx.view('bb22')).toBeUndefined();
    expect(idx.values().map((r) => [r.id, r.state])).toEqual([['aa11', 'READY']]);
  });
});
