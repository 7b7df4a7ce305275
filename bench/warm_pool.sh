#!/usr/bin/env bash
# Benchmark (issue 54): what `min_pool_size` saves a burst. For each setting in MINS
# (0 = off, the shipped default; then MIN), a fresh `pgtenant dev` (one replica per
# shard) and a proxy on its shards with that min_pool_size; BURST clients of tenant 7
# connect through it, then three bursts, each BURST transactions at once (`SELECT
# pg_sleep(0.05)`, so each needs a server connection of its own):
#   start:    right after the first request made the pool (it holds one connection);
#   quiet:    after QUIET_S seconds without requests (a warm-up round has run);
#   failover: sent just after shard 1's primary is killed, held, run once its replica
#             is promoted (PROMOTE_AFTER s later), timed from the promotion.
# Prints, per burst, the time until every transaction answered and the server logins
# it paid (backends of role app that started after the burst began, on the node that
# served it).
#
#   [MINS="0 20"] [BURST=20] [QUIET_S=3] [PROMOTE_AFTER=1] bench/warm_pool.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PROXY_PORT=${PROXY_PORT:-7732}
SHARD_PORT=${SHARD_PORT:-7742}
VARIANT_PORT=${VARIANT_PORT:-7752}

source bench/common.sh
PG_BIN=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

for min in ${MINS:-0 20}; do
  start_dev warm-pool "${WORKERS:-0}"
  serve_variant "$VARIANT_PORT" min_pool_size "min_pool_size = $min"
  STATE="$STATE" PORT="$VARIANT_PORT" MIN="$min" BURST="${BURST:-20}" QUIET_S="${QUIET_S:-3}" \
  PROMOTE_AFTER="${PROMOTE_AFTER:-1}" PRIMARY_PORT="$SHARD_PORT" REPLICA_PORT=$((SHARD_PORT + 3)) \
  KILL="as_owner $PG_BIN/pg_ctl -D $STATE/shard1 -m immediate -w stop" \
  PROMOTE="as_owner $PG_BIN/pg_ctl -D $STATE/shard1_replica1 -w promote" python3 - <<'PY'
import os, subprocess, threading, time, psycopg

port, burst = os.environ["PORT"], int(os.environ["BURST"])
conninfo = f"host=127.0.0.1 port={port} user=app password=app dbname=app options='-c pgtenant.tenant_id=7'"
clients = [psycopg.connect(conninfo, autocommit=True) for _ in range(burst)]
sh = lambda cmd: subprocess.run(["bash", "-c", f"as_owner() {{ if [ $(id -u) = 0 ]; then runuser -u postgres -- \"$@\"; else \"$@\"; fi; }}; {cmd}"], check=True, capture_output=True)

def server_now(node_port):
    with psycopg.connect(f"host=127.0.0.1 port={node_port} user=postgres dbname=app") as c:
        return c.execute("SELECT clock_timestamp()").fetchone()[0]

def logins_since(node_port, since):
    with psycopg.connect(f"host=127.0.0.1 port={node_port} user=postgres dbname=app") as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = 'app' "
                         "AND application_name NOT LIKE 'pgtenant%%' AND backend_start >= %s", (since,)).fetchone()[0]

def fire():
    done, errors = [], []
    def one(c):
        try:
            c.execute("SELECT pg_sleep(0.05)")
            done.append(time.monotonic())
        except psycopg.Error as e:
            errors.append(e.sqlstate)
    threads = [threading.Thread(target=one, args=(c,)) for c in clients]
    for t in threads: t.start()
    return threads, done, errors

def report(name, node_port, since, t0, threads, done, errors):
    for t in threads: t.join()
    took = (max(done) - t0) * 1000 if done else float("nan")
    print(f"min_pool_size {os.environ['MIN']:>3}, {name:8}: {burst} transactions in {took:6.0f} ms, "
          f"{logins_since(node_port, since)} server logins paid, errors {errors}")

primary, replica = int(os.environ["PRIMARY_PORT"]), int(os.environ["REPLICA_PORT"])
clients[0].execute("SELECT 1")
since, t0 = server_now(primary), time.monotonic()
report("start", primary, since, t0, *fire())
time.sleep(float(os.environ["QUIET_S"]))
since, t0 = server_now(primary), time.monotonic()
report("quiet", primary, since, t0, *fire())
time.sleep(float(os.environ["QUIET_S"]))
sh(os.environ["KILL"])
threads, done, errors = fire()
time.sleep(float(os.environ["PROMOTE_AFTER"]))
since = server_now(replica)
promoted = time.monotonic(); sh(os.environ["PROMOTE"])
report("failover", replica, since, promoted, threads, done, errors)
PY
  stop_all
  trap - EXIT
done
