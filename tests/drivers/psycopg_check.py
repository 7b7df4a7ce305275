"""psycopg 3 through pgtenant: asserts, exits non-zero on the first mismatch.

usage: psycopg_check.py PORT
"""
import sys
import threading
import time

import psycopg

PORT = sys.argv[1]
BASE = f"host=127.0.0.1 port={PORT} user=app password=app dbname=app sslmode=disable"
conn = psycopg.connect(f"{BASE} options='-c pgtenant.tenant_id=42'")
cur = conn.cursor()
cur.execute("select shard_id from pgtenant_shard")
assert cur.fetchone() == (2,), "tenant 42 is on shard 2"
cur.execute("select %s::int + 1, %s::text, %s::numeric", (41, "héllo", 1.5))
assert cur.fetchone()[:2] == (42, "héllo")
for i in range(10):  # psycopg prepares on the server after 5 executions
    cur.execute("select %s::bigint * 2", (i,))
    assert cur.fetchone() == (i * 2,)
cur.execute("create table if not exists py_t (tenant_id bigint, v text)")
cur.execute("delete from py_t")
conn.commit()
with cur.copy("copy py_t from stdin") as cp:
    for i in range(100):
        cp.write_row((42, f"r{i}"))
conn.commit()
cur.execute("select count(*) from py_t")
assert cur.fetchone() == (100,)
with cur.copy("copy (select v from py_t order by v limit 2) to stdout") as cp:
    assert [r for r in cp.rows()] == [("r0",), ("r1",)]
with conn.transaction():
    with conn.cursor(name="server_side") as sc:
        sc.execute("select generate_series(1, 1000)")
        assert len(sc.fetchmany(300)) == 300
with conn.pipeline():
    c1 = conn.execute("select 1")
    c2 = conn.execute("select 2")
assert (c1.fetchone(), c2.fetchone()) == ((1,), (2,))
conn.commit()
# executemany pipelines its statements; then a pipeline whose middle statement fails.
cur.executemany("insert into py_t values (%s, %s)", [(42, f"m{i}") for i in range(6)])
conn.commit()
try:
    with conn.pipeline():
        conn.execute("select 1")
        conn.execute("select 1/0")
        conn.execute("select 2")
    raise AssertionError("the pipeline did not fail")
except psycopg.errors.DivisionByZero:
    conn.rollback()
assert conn.execute("select count(*) from py_t where v like 'm%'").fetchone() == (6,)
conn.commit()


def cancel_sleep(c, cancel):
    """Runs pg_sleep on c, cancelled after 0.5 s by cancel(c) from another thread;
    asserts it was cancelled and that cancel raised nothing."""
    errors = []

    def run():
        time.sleep(0.5)
        try:
            cancel(c)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    canceller = threading.Thread(target=run)
    canceller.start()
    try:
        c.execute("select pg_sleep(10)")
        raise AssertionError("pg_sleep was not cancelled")
    except psycopg.errors.QueryCanceled:
        pass
    canceller.join()
    assert not errors, errors
    c.rollback()


cancel_sleep(conn, lambda c: c.cancel())

listener = psycopg.connect(f"{BASE} options='-c pgtenant.tenant_id=42'", autocommit=True)
listener.execute("listen chan")
conn.execute("notify chan, 'hello'")
conn.commit()
payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
assert payloads == ["hello"], payloads

try:
    psycopg.connect(f"host=127.0.0.1 port={PORT} user=app password=bad dbname=app sslmode=disable")
    raise AssertionError("bad password accepted")
except psycopg.OperationalError as e:
    assert "password authentication failed" in str(e), e

tls = psycopg.connect(f"host=127.0.0.1 port={PORT} user=app password=app dbname=app sslmode=require options='-c pgtenant.tenant_id=7'")
assert tls.info.pgconn.ssl_in_use
assert tls.execute("select shard_id from pgtenant_shard").fetchone() == (1,)
# A cancel over TLS (libpq 17+ encrypts it): it must work and be reported as sent.
cancel_sleep(tls, lambda c: c.cancel_safe())
# Outside autocommit psycopg begins a transaction before the SET: it holds if that commits.
cur.execute("set pgtenant.tenant_id = 7")
assert cur.execute("select shard_id from pgtenant_shard").fetchone() == (1,)
conn.rollback()
assert cur.execute("select shard_id from pgtenant_shard").fetchone() == (2,), "rolled back to 42"
conn.rollback()
cur.execute("set pgtenant.tenant_id = 7")
conn.commit()
assert cur.execute("select shard_id from pgtenant_shard").fetchone() == (1,)
conn.commit()
cur.execute("set pgtenant.tenant_id = 42")
conn.commit()
# Snowflake IDs answered by pgtenant, also once psycopg prepares the statement.
last = 0
for i in range(7):
    cur.execute("select * from pgtenant.next_ids(%s)", (10,))
    ids = [r[0] for r in cur.fetchall()]
    assert len(ids) == 10 and ids == sorted(set(ids)) and ids[0] > last
    assert all((x >> 12) & 1023 == 2 for x in ids), ids
    last = ids[-1]
cur.execute("select pgtenant.next_id(%s)", (5,))
assert (cur.fetchone()[0] >> 12) & 1023 == 5
conn.rollback()

# A statement cache that lets statements go inside a pipeline. With a libpq before 17
# (Debian 12 has 15) psycopg sends DEALLOCATE name there, through the extended protocol;
# with a newer one, a protocol-level Close. The older way is forced here.
import psycopg._connection_base as connection_base  # noqa: E402

connection_base._HAS_SEND_CLOSE = False
cache = psycopg.connect(f"{BASE} options='-c pgtenant.tenant_id=42'", autocommit=True)
cache.prepare_threshold = 0
cache.prepared_max = 2
evicted = []
with cache.pipeline() as p:
    for i in range(6):
        evicted.append(cache.execute(f"select {i}::int + %s", (1,)))
        p.sync()  # results come back, and psycopg evicts at the next execute
assert [c.fetchone()[0] for c in evicted] == [i + 1 for i in range(6)]
connection_base._HAS_SEND_CLOSE = True
print("psycopg ok")
