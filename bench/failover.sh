#!/usr/bin/env bash
# Benchmark (issue 23): a shard's primary killed under a write load through pgtenant
# (`pgtenant dev`, one replica per shard, made synchronous here), its replica then
# promoted from outside after PROMOTE_AFTER seconds (`pg_ctl promote`, as an
# orchestrator would), or with AUTO_PROMOTE=1 by pgtenant itself (`pgtenant dev
# --auto-promote`). WRITERS psycopg clients of tenant 7 insert rows one by one,
# noting each acknowledged id and each error. Prints, per round: the time from the
# kill to the first insert acknowledged by the new primary, the same from the
# promotion (outside promotion only), the errors clients saw, and the acknowledged
# inserts missing on the new primary (goal: 0). WRITERS above the pool size (20 per
# login) is the queued case: clients wait for a connection of the full pool when the
# primary dies, and are held through the failover like the ones that hold one.
#
#   [WRITERS=4] [PROMOTE_AFTER=1] [AUTO_PROMOTE=1] bench/failover.sh [rounds=2]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
WRITERS=${WRITERS:-4}
PROMOTE_AFTER=${PROMOTE_AFTER:-1}
PROXY_PORT=${PROXY_PORT:-7432}
SHARD_PORT=${SHARD_PORT:-7442}

source bench/common.sh
PG_BIN=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

if [ "${AUTO_PROMOTE:-0}" = 1 ]; then DEV_ARGS=--auto-promote; fi
for round in $(seq "$ROUNDS"); do
  start_dev failover "${WORKERS:-0}"
  primary_dir="$STATE/shard1" replica_dir="$STATE/shard1_replica1"
  replica_port=$((SHARD_PORT + 3))
  # Synchronous: the primary waits for its replica on every commit.
  psql -h 127.0.0.1 -p "$SHARD_PORT" -U postgres -d app -XAtq \
    -c "ALTER SYSTEM SET synchronous_commit = on" -c "ALTER SYSTEM SET synchronous_standby_names = '*'" \
    -c "SELECT pg_reload_conf()" \
    -c "CREATE TABLE IF NOT EXISTS failover_bench (id bigint PRIMARY KEY, tenant_id bigint)" \
    -c "GRANT ALL ON failover_bench TO app" >/dev/null
  sleep 1
  AUTO_PROMOTE="${AUTO_PROMOTE:-0}" STATE="$STATE" PORT="$PROXY_PORT" WRITERS="$WRITERS" PROMOTE_AFTER="$PROMOTE_AFTER" REPLICA_PORT="$replica_port" \
  KILL="as_owner $PG_BIN/pg_ctl -D $primary_dir -m immediate -w stop" \
  PROMOTE="as_owner $PG_BIN/pg_ctl -D $replica_dir -w promote" python3 - <<'PY'
import os, subprocess, threading, time, psycopg

port, writers = os.environ["PORT"], int(os.environ["WRITERS"])
conninfo = f"host=127.0.0.1 port={port} user=app password=app dbname=app options='-c pgtenant.tenant_id=7'"
stop = threading.Event()
acked, errors = [[] for _ in range(writers)], [[] for _ in range(writers)]

def write(n):
    conn, i = None, n * 10_000_000
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(conninfo, autocommit=True)
            i += 1
            conn.execute("INSERT INTO failover_bench (id, tenant_id) VALUES (%s, 7)", (i,))
            acked[n].append((i, time.monotonic()))
        except psycopg.Error as e:
            errors[n].append((time.monotonic(), e.sqlstate or str(e).splitlines()[0]))

threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
for t in threads: t.start()
time.sleep(2)
sh = lambda cmd: subprocess.run(["bash", "-c", f"as_owner() {{ if [ $(id -u) = 0 ]; then runuser -u postgres -- \"$@\"; else \"$@\"; fi; }}; {cmd}"], check=True, capture_output=True)
auto = os.environ["AUTO_PROMOTE"] == "1"
killed = time.monotonic(); sh(os.environ["KILL"]); dead = time.monotonic()
if auto:
    promoted = None
    time.sleep(8)
else:
    time.sleep(float(os.environ["PROMOTE_AFTER"]))
    promoted = time.monotonic(); sh(os.environ["PROMOTE"])
    time.sleep(3)
stop.set()
for t in threads: t.join()
first_after = min((t for a in acked for (_, t) in a if t > (promoted or dead)), default=None)
new = psycopg.connect(f"host=127.0.0.1 port={os.environ['REPLICA_PORT']} user=postgres dbname=app")
stored = {r[0] for r in new.execute("SELECT id FROM failover_bench")}
all_acked = [i for a in acked for (i, _) in a]
lost = [i for i in all_acked if i not in stored]
print(f"writes: {len(all_acked)} acknowledged, {len(lost)} of them missing on the new primary")
if first_after and promoted:
    print(f"first write on the new primary: {first_after - killed:.2f} s after the kill, {first_after - promoted:.2f} s after the promotion")
elif first_after:
    print(f"first write on the new primary (promoted by pgtenant): {first_after - killed:.2f} s after the kill")
else:
    print("no write after the promotion")
from collections import Counter
codes = Counter(code for e in errors for _, code in e)
print(f"errors: {sum(codes.values())} {dict(codes)}; {sum(1 for e in errors if e)} of {writers} clients saw one")
if writers <= 8:
    print("errors per client:", [[code for _, code in e] for e in errors])
PY
  stop_all
  trap - EXIT
done
