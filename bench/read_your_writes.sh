#!/usr/bin/env bash
# Benchmark (issue 52): read-your-writes on `pgtenant dev` (one replica per shard).
# A prefer-replica session of tenant 7 (shard 1) writes a row, then reads it READS
# times, SPACING_MS apart, ITERATIONS times; the replica of shard 1 applies WAL late by
# each of LAGS ms (`recovery_min_apply_delay`). Prints, per lag, the share of reads the
# replica served, whether every read saw the session's own row (it must), and how long
# after a write its reads were back on the replica; then
# the cost per write transaction: autocommit INSERTs per second of a prefer-replica
# session (each marks the write) against a primary one (marks nothing), interleaved.
#
#   [LAGS="0 10 100"] [READS=20] [SPACING_MS=100] [ITERATIONS=10] bench/read_your_writes.sh [rounds=3] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
PROXY_PORT=${PROXY_PORT:-7632}
SHARD_PORT=${SHARD_PORT:-7642}
# Shards from SHARD_PORT, the catalog after them, then each shard's replica.
REPLICA_PORT=$((SHARD_PORT + 3))

source bench/common.sh
start_dev read-your-writes "${WORKERS:-0}"
psql -h 127.0.0.1 -p "$SHARD_PORT" -U postgres -d app -XAtq -c \
  "CREATE TABLE IF NOT EXISTS ryw (id bigint, tenant_id bigint); GRANT ALL ON ryw TO app;"

for lag in ${LAGS:-0 10 100}; do
  psql -h 127.0.0.1 -p "$REPLICA_PORT" -U postgres -d postgres -XAtq \
    -c "ALTER SYSTEM SET recovery_min_apply_delay = '${lag}ms'" -c "SELECT pg_reload_conf()" >/dev/null
  PORT=$PROXY_PORT LAG=$lag READS=${READS:-20} SPACING_MS=${SPACING_MS:-100} ITERATIONS=${ITERATIONS:-10} python3 - <<'PY'
import os, statistics, time, psycopg
port, lag = os.environ["PORT"], os.environ["LAG"]
reads, iterations = int(os.environ["READS"]), int(os.environ["ITERATIONS"])
spacing = int(os.environ["SPACING_MS"]) / 1000
conninfo = (f"host=127.0.0.1 port={port} user=app password=app dbname=app "
            "options='-c pgtenant.tenant_id=7 -c pgtenant.target=prefer-replica'")
with psycopg.connect(conninfo, autocommit=True) as c:
    base = c.execute("SELECT coalesce(max(id), 0) FROM ryw").fetchone()[0]
    on_replica = missed = 0
    back = []  # per write: ms from the write to its session's first read on the replica
    for i in range(1, iterations + 1):
        c.execute("INSERT INTO ryw VALUES (%s, 7)", (base + i,))
        wrote = time.monotonic()
        first = None
        for _ in range(reads):
            seen, replica = c.execute(
                "SELECT count(*), pg_is_in_recovery() FROM ryw WHERE id = %s", (base + i,)).fetchone()
            on_replica += replica
            missed += seen == 0
            if replica and first is None:
                first = (time.monotonic() - wrote) * 1000
            time.sleep(spacing)
        if first is not None:
            back.append(first)
    total = iterations * reads
    median = f"{statistics.median(back):.0f} ms" if back else "never"
    print(f"lag {lag} ms: {on_replica} of {total} reads on the replica ({100 * on_replica / total:.1f} %), "
          f"{missed} missed the session's own row; back on the replica after a write: median {median} "
          f"({len(back)} of {iterations} writes)")
PY
done
psql -h 127.0.0.1 -p "$REPLICA_PORT" -U postgres -d postgres -XAtq \
  -c "ALTER SYSTEM RESET recovery_min_apply_delay" -c "SELECT pg_reload_conf()" >/dev/null

cat >"$STATE/insert.sql" <<'SQL'
\set id random(1, 1000000000)
INSERT INTO ryw VALUES (:id, 7);
SQL
for round in $(seq "$ROUNDS"); do
  for target in primary prefer-replica; do
    tps=$(PGOPTIONS="-c pgtenant.tenant_id=7 -c pgtenant.target=$target" pgbench -p "$PROXY_PORT" -n \
      -f "$STATE/insert.sql" -c "${CLIENTS:-8}" -j 2 -T "$SECONDS_PER_RUN" 2>&1 | awk '/^tps/ {print int($3)}')
    echo "$target $tps"
  done
done >"$STATE/runs"
echo "autocommit INSERTs per second, ${CLIENTS:-8} clients, each round:"
awk '{runs[$1] = runs[$1] " " $2} END {for (t in runs) print "  " t ":" runs[t]}' "$STATE/runs" | sort
