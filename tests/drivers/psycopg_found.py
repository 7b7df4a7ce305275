"""What psycopg's own test suite found through pgtenant (issue 57), each as psycopg's
users meet it: asserts, exits non-zero on the first mismatch.

usage: psycopg_found.py SECTION PORT   (SECTION: one of the functions below)
"""
import sys
import time

import psycopg

SECTION, PORT = sys.argv[1], sys.argv[2]
BASE = f"host=127.0.0.1 port={PORT} user=app password=app dbname=app sslmode=disable"


def connect(tenant, **kwargs):
    return psycopg.connect(f"{BASE} options='-c pgtenant.tenant_id={tenant}'", **kwargs)


def own_backend():
    """Item 1: the pid pgtenant gives a client is its backend's, as on PostgreSQL; no
    server-wide view of other sessions is readable; terminating itself ends it."""
    conn = connect(7, autocommit=True)
    pid = conn.info.backend_pid
    assert pid > 1 << 22, f"{pid} could be a server's pid"
    assert conn.execute("select pg_backend_pid()").fetchone() == (pid,)
    for sql in [
        "select pid, query from pg_stat_activity",
        "select * from pg_locks",
        "select name, statement from pg_stat_statements",
    ]:
        try:
            conn.execute(sql)
            raise AssertionError(f"{sql} was not refused")
        except psycopg.errors.InsufficientPrivilege:
            pass
    # Another tenant's session: as a pid that is no backend at all.
    other = connect(8, autocommit=True)
    assert conn.execute("select pg_terminate_backend(%s)", [other.info.backend_pid]).fetchone() == (False,)
    assert other.execute("select 8").fetchone() == (8,)
    # psycopg's own test of a killed connection: the client learns its connection is gone.
    try:
        conn.execute("select pg_terminate_backend(%s)", [pid])
        raise AssertionError("terminating itself returned")
    except psycopg.errors.AdminShutdown:
        pass
    except psycopg.OperationalError:
        pass
    assert conn.closed or conn.broken, "the terminated connection is gone"
    other.close()


def poisoned_statement():
    """Item 3: a statement prepared in a transaction that never committed is not handed
    to the next client, whose own type of the same name it would not know; and one
    whose plan outlived its type is prepared afresh instead of failing for good."""
    a = connect(7)
    a.execute("create type psy_poison as (x int)")
    assert a.execute("select %s::psy_poison[]", ['{"(1)"}'], prepare=True).fetchone() is not None
    a.close()  # no COMMIT: the type never existed

    b = connect(8)
    b.execute("create type psy_poison as (x int)")
    for _ in range(3):
        row = b.execute("select %s::psy_poison[]", ['{"(2)"}'], prepare=True).fetchone()
        assert row is not None
    b.commit()
    assert b.execute("select %s::psy_poison[]", ['{"(3)"}'], prepare=True).fetchone() is not None
    b.commit()

    # The type is dropped and created again, committed: a plan that points at the old
    # one fails once at most, and the statement works again (PostgreSQL keeps failing a
    # session's own statement until the client prepares it again).
    b.execute("drop type psy_poison")
    b.execute("create type psy_poison as (x int)")
    b.commit()
    failures = 0
    for _ in range(3):
        try:
            b.execute("select %s::psy_poison[]", ['{"(4)"}'], prepare=True).fetchone()
            b.commit()
        except psycopg.errors.InternalError:
            failures += 1
            b.rollback()
    assert failures <= 1, f"failed {failures} times"
    b.execute("drop type psy_poison")
    b.commit()
    b.close()


def bulk_executemany():
    """Item 2: executemany sends its whole batch as one pipeline with one Sync, in a
    transaction or (autocommit) as the request that starts one."""
    for autocommit in [True, False]:
        conn = connect(7, autocommit=autocommit)
        conn.execute("create table if not exists psy_bulk (tenant_id bigint, v int)")
        conn.execute("delete from psy_bulk")
        conn.commit()
        rows = 100_000
        started = time.monotonic()
        with conn.cursor() as cur:
            cur.executemany("insert into psy_bulk values (%s, %s)", [(7, i) for i in range(rows)])
        conn.commit()
        took = time.monotonic() - started
        count = conn.execute("select count(*), sum(v) from psy_bulk").fetchone()
        assert count == (rows, rows * (rows - 1) // 2), count
        conn.execute("drop table psy_bulk")
        conn.commit()
        conn.close()
        print(f"executemany of {rows} rows (autocommit {autocommit}): {took:.1f} s")


def set_config_parameter():
    """Item 5: set_config with its name as a parameter is followed like any setting; only
    pgtenant's own setting is refused."""
    conn = connect(7, autocommit=True)
    conn.execute("select set_config(%s, %s, false)", ["application_name", "psy_found"])
    assert conn.execute("show application_name").fetchone() == ("psy_found",)
    for _ in range(3):  # on whichever server connection comes next
        assert conn.execute("select current_setting('application_name')").fetchone() == ("psy_found",)
    try:
        conn.execute("select set_config(%s, %s, false)", ["pgtenant.tenant_id", "8"])
        raise AssertionError("the tenant was set through set_config")
    except psycopg.errors.InsufficientPrivilege:
        pass
    assert conn.execute("select current_setting('pgtenant.tenant_id')").fetchone() == ("7",)


def prepared_statements_view():
    """Items 1 and 5: pg_prepared_statements shows this client's statements, by its own
    names, and none of another client's."""
    other = connect(8, autocommit=True)
    other.execute("select %s::int + 8000", [1], prepare=True)
    conn = connect(7, autocommit=True)
    conn.execute("select %s::int + 7000", [1], prepare=True)
    conn.execute("prepare psy_sql as select 7")
    rows = conn.execute("select name, statement from pg_prepared_statements order by name").fetchall()
    names = [r[0] for r in rows]
    assert "psy_sql" in names, rows
    assert any(n.startswith("_pg3_") for n in names), rows
    assert not any("8000" in r[1] for r in rows), f"another client's statement shows: {rows}"
    assert not any(n.startswith("__pgtenant_") for n in names), f"pgtenant's names show: {rows}"
    conn.execute("deallocate psy_sql")
    names = [r[0] for r in conn.execute("select name from pg_prepared_statements").fetchall()]
    assert "psy_sql" not in names, names
    other.close()
    conn.close()


globals()[SECTION]()
print(f"psycopg {SECTION} ok")
