// node-postgres through pgtenant: asserts, exits non-zero on the first mismatch.
// usage: node node_pg_check.js PORT   (with `pg` resolvable, e.g. NODE_PATH)
const assert = require('assert');
const { Client } = require('pg');
const port = Number(process.argv[2]);
const opts = (tenant, extra = {}) => ({ host: '127.0.0.1', port, user: 'app', password: 'app', database: 'app',
  ...(tenant ? { options: `-c pgtenant.tenant_id=${tenant}` } : {}), ...extra });
(async () => {
  const c = new Client(opts(42));
  await c.connect();
  assert.deepStrictEqual((await c.query('select shard_id from pgtenant_shard')).rows[0], { shard_id: 2 });
  assert.deepStrictEqual((await c.query('select $1::int + 1 as a, $2::text as b', [41, 'x'])).rows[0], { a: 42, b: 'x' });
  for (let i = 0; i < 3; i++) {
    const r = await c.query({ name: 'dbl', text: 'select $1::int * 2 as v', values: [i] });
    assert.strictEqual(r.rows[0].v, i * 2);
  }
  await c.query('begin'); await c.query('select 1'); await c.query('commit');
  const l = new Client(opts(42));
  await l.connect(); await l.query('listen nch');
  const got = new Promise(resolve => l.on('notification', m => resolve(m.payload)));
  await c.query("notify nch, 'yo'");
  assert.strictEqual(await got, 'yo');
  const bad = new Client(opts(null, { password: 'x' }));
  await assert.rejects(bad.connect(), e => e.code === '28P01');
  const t = new Client(opts(7, { ssl: { rejectUnauthorized: false } }));
  await t.connect();
  assert.deepStrictEqual((await t.query('select shard_id from pgtenant_shard')).rows[0], { shard_id: 1 });
  // Snowflake IDs answered by pgtenant (int8 arrives as a string).
  const id = BigInt((await c.query('select pgtenant.next_id() as id')).rows[0].id);
  assert.strictEqual((id >> 12n) & 1023n, 2n);
  for (let i = 0; i < 3; i++) {
    const r = await c.query({ name: 'ids', text: 'select * from pgtenant.next_ids($1)', values: [5] });
    assert.strictEqual(r.rows.length, 5);
    assert.ok(BigInt(r.rows[0].next_ids) > id);
  }
  await c.end(); await l.end(); await t.end();
  console.log('node-postgres ok');
})().catch(e => { console.error(e); process.exit(1); });
