#!/usr/bin/env bash
# Benchmark (issue 25): scatter-gather through pgtenant (`pgtenant dev --shards N`, no
# replicas, the shipped defaults) over 1M rows per shard, for N = 2 and 4:
#   - count(*) GROUP BY and ORDER BY ... LIMIT 100: latency through the proxy (a
#     prepared statement, median of ROUNDS) against the slowest shard's own latency
#     for its part, and against every shard's part run at once directly (this
#     machine's floor for a fan-out: on 2 cores, 4 shards cannot all run at once).
#     Twice: with the shards' defaults (parallel query: one shard alone already uses
#     every core), and with max_parallel_workers_per_gather = 0 on every connection
#     (one core per shard's part, as when each shard has a machine of its own);
#   - rows per second streamed for a plain SELECT of every row;
#   - the proxy's resident memory while it streams a 10M-row result (sampled every
#     0.1 s): it should stay flat.
#
#   bench/scatter.sh [rounds=7] [shard counts="2 4"]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
COUNTS=${2:-2 4}
PROXY_PORT=${PROXY_PORT:-7632}
SHARD_PORT=${SHARD_PORT:-7642}

cargo build --release --quiet --example scatter_client
CLIENT=${CARGO_TARGET_DIR:-target}/release/examples/scatter_client
ADMIN="host=127.0.0.1 port=$PROXY_PORT user=admin password=admin dbname=app sslmode=disable"
source bench/common.sh

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

for n in $COUNTS; do
  DEV_ARGS="--shards $n --replicas 0 --http-port 0" start_dev "scatter-$n" 0
  shard_conninfos=()
  for i in $(seq 0 $((n - 1))); do
    port=$((SHARD_PORT + i))
    psql -h 127.0.0.1 -p "$port" -U postgres -d app -Xq >/dev/null <<SQL
DROP TABLE IF EXISTS events;
CREATE TABLE events (id bigint, kind text, score int, amount numeric(12, 2));
INSERT INTO events SELECT g, (ARRAY['signup','login','logout','buy','refund','view','click','share','like','other'])[1 + g % 10],
  (g::bigint * 7919) % 100003, round((g % 10000) / 7.0, 2) FROM generate_series($((i * 1000000 + 1)), $(((i + 1) * 1000000))) g;
DROP TABLE IF EXISTS big_events;
CREATE TABLE big_events (id bigint, score int);
INSERT INTO big_events SELECT g, g % 1000 FROM generate_series(1, $((10000000 / n))) g;
VACUUM ANALYZE events; VACUUM ANALYZE big_events;
SQL
    shard_conninfos+=("host=127.0.0.1 port=$port user=postgres dbname=app")
  done
  echo "== $n shards, 1M rows each"
  for workers in default 0; do
    admin=$ADMIN
    shards=("${shard_conninfos[@]}")
    if [ "$workers" = 0 ]; then
      admin="$ADMIN options='-c max_parallel_workers_per_gather=0'"
      shards=()
      for c in "${shard_conninfos[@]}"; do shards+=("$c options='-c max_parallel_workers_per_gather=0'"); done
    fi
    echo "-- max_parallel_workers_per_gather: $workers"
    printf 'count(*) GROUP BY kind:        '
    "$CLIENT" latency "$ROUNDS" "$admin" \
      "SELECT kind, count(*) FROM all_shards.events GROUP BY kind" \
      "SELECT kind, count(*) FROM events GROUP BY kind" "${shards[@]}"
    printf 'ORDER BY score LIMIT 100:      '
    "$CLIENT" latency "$ROUNDS" "$admin" \
      "SELECT id, score FROM all_shards.events ORDER BY score DESC, id LIMIT 100" \
      "SELECT id, score FROM events ORDER BY score DESC, id LIMIT 100" "${shards[@]}"
  done
  printf 'plain SELECT of every row:     '
  "$CLIENT" stream "$ADMIN" "SELECT id, kind, score, amount FROM all_shards.events"
  before=$(rss_kb "$PROXY_PID")
  "$CLIENT" stream "$ADMIN" "SELECT id, score FROM all_shards.big_events" >"$STATE/stream.out" &
  client=$!
  peak=$before
  while kill -0 "$client" 2>/dev/null; do
    now=$(rss_kb "$PROXY_PID")
    [ "$now" -gt "$peak" ] && peak=$now
    sleep 0.1
  done
  wait "$client"
  printf '10M-row result:                %s; proxy RSS %d MiB before, %d MiB at most while streaming\n' \
    "$(cat "$STATE/stream.out")" $((before / 1024)) $((peak / 1024))
  stop_all
  trap - EXIT
done
