"""asyncpg through pgtenant: asserts, exits non-zero on the first mismatch.

usage: asyncpg_check.py PORT
"""
import asyncio
import sys

import asyncpg

PORT = int(sys.argv[1])


def connect(tenant=None, **kw):
    settings = {"pgtenant.tenant_id": str(tenant)} if tenant else {}
    kw.setdefault("ssl", False)
    kw.setdefault("password", "app")
    return asyncpg.connect(host="127.0.0.1", port=PORT, user="app", database="app", server_settings=settings, **kw)


async def main():
    c = await connect(1500)
    assert await c.fetchval("select shard_id from pgtenant_shard") == 2
    row = await c.fetchrow("select $1::int + 1 as a, $2::text as b", 41, "x")
    assert (row["a"], row["b"]) == (42, "x")
    stmt = await c.prepare("select $1::bigint * 3")
    assert [await stmt.fetchval(i) for i in range(3)] == [0, 3, 6]
    await c.execute("create table if not exists apg_t (tenant_id bigint, v text); delete from apg_t")
    await c.copy_records_to_table("apg_t", records=[(1500, f"v{i}") for i in range(50)])
    assert await c.fetchval("select count(*) from apg_t") == 50
    async with c.transaction():
        cur = await c.cursor("select generate_series(1, 100)")
        assert len(await cur.fetch(40)) == 40
    await c.execute("set application_name = 'asyncpg-check'")
    assert await c.fetchval("select current_setting('application_name')") == "asyncpg-check"
    # A type asyncpg does not know: it looks it up with set_config('jit', ..., false)
    # around the query, which pgtenant follows rather than pin the session to shard 2.
    await c.execute("drop type if exists apg_mood; create type apg_mood as enum ('sad', 'happy')")
    assert await c.fetchval("select 'happy'::apg_mood") == "happy"
    # A schema change under a cached statement: asyncpg prepares it again and retries.
    await c.execute("drop table if exists apg_alter; create table apg_alter (tenant_id bigint, a int)")
    assert await c.fetch("select * from apg_alter") == []
    await c.execute("alter table apg_alter add column b int; insert into apg_alter values (1500, 1, 2)")
    assert [tuple(r) for r in await c.fetch("select * from apg_alter")] == [(1500, 1, 2)]
    await c.execute("set pgtenant.tenant_id = 7")
    assert await c.fetchval("select shard_id from pgtenant_shard") == 1
    assert await c.fetchval("select current_setting('application_name')") == "asyncpg-check"
    await c.execute("set pgtenant.tenant_id = 1500")

    got = asyncio.get_running_loop().create_future()
    listener = await connect(1500)
    await listener.add_listener("ch", lambda *args: got.set_result(args[3]))
    await c.execute("notify ch, 'hi'")
    assert await asyncio.wait_for(got, 5) == "hi"

    task = asyncio.create_task(c.fetchval("select pg_sleep(10)"))
    await asyncio.sleep(0.5)
    task.cancel()
    try:
        await task
        raise AssertionError("not cancelled")
    except asyncio.CancelledError:
        pass
    assert await c.fetchval("select 7") == 7

    try:
        await connect(password="nope")
        raise AssertionError("bad password accepted")
    except asyncpg.InvalidPasswordError as e:
        assert e.sqlstate == "28P01"
    tls = await connect(7, ssl="require")
    assert await tls.fetchval("select shard_id from pgtenant_shard") == 1
    # Snowflake IDs answered by pgtenant: the tenant's shard (2), prepared and binary.
    sid = await c.fetchval("select pgtenant.next_id()")
    assert (sid >> 12) & 1023 == 2, sid
    ids = [r[0] for r in await c.fetch("select * from pgtenant.next_ids($1)", 100)]
    assert len(ids) == 100 and ids == sorted(set(ids)) and ids[0] > sid
    row = await c.fetchrow("select * from pgtenant.decode_id($1)", sid)
    assert (row["shard_id"], row["instance"]) == (2, 1) and row["timestamp"].year >= 2024, row
    # executemany pipelines every row and syncs once (issue 57, item 2): 100,000 rows,
    # outside a transaction and inside one.
    await c.execute("drop table if exists apg_bulk; create table apg_bulk (tenant_id bigint, v int)")
    await c.executemany("insert into apg_bulk values ($1, $2)", [(1500, i) for i in range(100_000)])
    async with c.transaction():
        await c.executemany("insert into apg_bulk values ($1, $2)", [(1500, i) for i in range(100_000)])
    assert await c.fetchval("select count(*) from apg_bulk") == 200_000
    await c.execute("drop table apg_bulk")
    print("asyncpg ok")


asyncio.run(main())
