// What node-postgres' own tests found through pgtenant (issue 57, item 4): a client
// whose backend ends learns it (an 'error' event with PostgreSQL's SQLSTATE, then
// 'end'), as directly; pg-pool's tests wait for exactly that. Asserts, exits non-zero
// on the first mismatch.
// usage: node node_pg_found.js PORT   (SHARD_PORT: shard 1, where a superuser may log in)
const assert = require('assert');
const { Client } = require('pg');
const port = Number(process.argv[2]);
const shardPort = Number(process.env.SHARD_PORT);
const opts = (tenant) => ({ host: '127.0.0.1', port, user: 'app', password: 'app', database: 'app',
  options: `-c pgtenant.tenant_id=${tenant}` });

// Resolves with the client's first 'error' once 'end' came too, or rejects after 10 s.
// (node-postgres emits a second error, "Connection terminated", as the socket closes.)
function goodbye(client) {
  const errors = [];
  const error = new Promise((resolve) => client.on('error', (e) => { errors.push(e); resolve(errors[0]); }));
  const end = new Promise((resolve) => client.once('end', resolve));
  const both = Promise.all([error, end]).then(([e]) => e);
  const late = new Promise((_, reject) => setTimeout(() => reject(new Error('no error/end within 10 s')), 10000));
  return Promise.race([both, late]);
}

(async () => {
  // A sibling (same login, same tenant) terminates an idle client by its processID.
  const idle = new Client(opts(7));
  await idle.connect();
  assert.ok(idle.processID > 2 ** 22, `${idle.processID} could be a server's pid`);
  const told = goodbye(idle);
  const sibling = new Client(opts(7));
  await sibling.connect();
  const r = await sibling.query('SELECT pg_terminate_backend($1) AS t', [idle.processID]);
  assert.strictEqual(r.rows[0].t, true);
  assert.strictEqual((await told).code, '57P01');

  // Another tenant's client cannot: false, and it lives on.
  const other = new Client(opts(8));
  await other.connect();
  const refused = await sibling.query('SELECT pg_terminate_backend($1) AS t', [other.processID]);
  assert.strictEqual(refused.rows[0].t, false);
  assert.strictEqual((await other.query('SELECT 8 AS v')).rows[0].v, 8);

  // A client in a transaction whose server backend an administrator ends.
  const busy = new Client(opts(7));
  await busy.connect();
  await busy.query('BEGIN');
  const serverPid = (await busy.query('SELECT pg_backend_pid() AS server_pid WHERE true')).rows[0].server_pid;
  const gone = goodbye(busy);
  const admin = new Client({ host: '127.0.0.1', port: shardPort, user: 'postgres', database: 'app' });
  await admin.connect();
  const killed = await admin.query('SELECT pg_terminate_backend($1) AS t', [serverPid]);
  assert.strictEqual(killed.rows[0].t, true);
  assert.strictEqual((await gone).code, '57P01');

  await sibling.end(); await other.end(); await admin.end();
  console.log('node-postgres found ok');
})().catch((e) => { console.error(e); process.exit(1); });
