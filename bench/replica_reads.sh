#!/usr/bin/env bash
# Benchmark (issue 23): pgbench -S through pgtenant (`pgtenant dev`, one replica per
# shard) with the session's reads on the primary (pgtenant.target=primary) and on the
# replica (prefer-replica), interleaved; prints TPS per run. On one machine both
# nodes share its cores: this shows that replica reads work at speed, not that they
# add capacity, which takes a replica on a machine of its own.
#
#   [CLIENTS=8] bench/replica_reads.sh [rounds=3] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
PROXY_PORT=${PROXY_PORT:-7532}
SHARD_PORT=${SHARD_PORT:-7542}

source bench/common.sh
start_dev replica-reads "${WORKERS:-0}"
pgbench -p "$SHARD_PORT" -i -q -s 10 >/dev/null 2>&1
sleep 2
for round in $(seq "$ROUNDS"); do
  for target in primary prefer-replica; do
    tps=$(PGOPTIONS="-c pgtenant.tenant_id=7 -c pgtenant.target=$target" pgbench -p "$PROXY_PORT" -n -S \
      -c "${CLIENTS:-8}" -j 2 -T "$SECONDS_PER_RUN" 2>&1 | awk '/^tps/ {print int($3)}')
    echo "$target $tps"
  done
done >"$STATE/runs"
awk '{runs[$1] = runs[$1] " " $2} END {for (t in runs) print t ":" runs[t]}' "$STATE/runs" | sort
on_replica=$(PGOPTIONS="-c pgtenant.tenant_id=7 -c pgtenant.target=prefer-replica" psql -p "$PROXY_PORT" -XAtc "SELECT pg_is_in_recovery()")
echo "a prefer-replica read ran on a replica: $on_replica"
