#!/usr/bin/env bash
# Benchmark: snowflake IDs minted through the proxy. pgbench runs
# `SELECT * FROM pgtenant.next_ids(1000)` (one tenant, so one shard) and the script
# prints IDs per second against the layout's ceiling (256,000 per second per minter
# and shard with the default 4 + 8 split), the proxy's CPU per 1000 IDs, and whether
# minting slows other clients: pgbench select-only (-S) alone, then beside the minters.
#
#   [WORKERS=0] bench/snowflake.sh [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-5}
PROXY_PORT=${PROXY_PORT:-6572}
SHARD_PORT=${SHARD_PORT:-6582}

source bench/common.sh
start_dev snowflake "${WORKERS:-0}"
pgbench -p "$SHARD_PORT" -i -q -s 10 >/dev/null 2>&1
echo 'SELECT * FROM pgtenant.next_ids(1000);' >"$STATE/mint.sql"
export PGOPTIONS="-c pgtenant.tenant_id=7"

cargo bench --quiet --bench snowflake -- 3 1000 2>/dev/null | grep -v '^$' || true

for mode in extended prepared; do
  for clients in 1 4; do
    before=$(cpu_ticks "$PROXY_PID")
    out=$(pgbench -p "$PROXY_PORT" -n -M "$mode" -c "$clients" -j "$clients" -T "$SECONDS_PER_RUN" -f "$STATE/mint.sql" 2>&1)
    after=$(cpu_ticks "$PROXY_PID")
    tps=$(echo "$out" | awk '/^tps/ {print $3}')
    calls=$(echo "$out" | awk '/actually processed/ {split($6, a, "/"); print a[1]}')
    awk -v m="$mode" -v c="$clients" -v tps="$tps" -v calls="$calls" -v ticks=$((after - before)) 'BEGIN {
      ids = tps * 1000;
      printf "through the proxy, -M %-8s %d client(s): %8.0f IDs/s = %5.1f %% of 256000; proxy CPU %.0f us per 1000 IDs\n",
             m, c, ids, 100 * ids / 256000, ticks * 10000 / calls }'
  done
done

# Minting must not hold up other clients: select-only latency alone and beside 2 minters.
select_only() { pgbench -p "$PROXY_PORT" -n -S -M prepared -c 4 -j 2 -T "$SECONDS_PER_RUN" 2>&1 | awk '/^latency average/ {print $4} /^tps/ {print $3}' | paste -sd' '; }
read -r alone_lat alone_tps <<<"$(select_only)"
pgbench -p "$PROXY_PORT" -n -M prepared -c 2 -j 2 -T "$((SECONDS_PER_RUN + 2))" -f "$STATE/mint.sql" >"$STATE/minters.out" 2>&1 &
MINTERS=$!
sleep 1
read -r busy_lat busy_tps <<<"$(select_only)"
wait "$MINTERS"
minted=$(awk '/^tps/ {printf "%.0f", $3 * 1000}' "$STATE/minters.out")
echo "select-only (4 clients) alone: ${alone_lat} ms average latency, ${alone_tps} tps"
echo "select-only beside 2 minting clients (${minted} IDs/s): ${busy_lat} ms average latency, ${busy_tps} tps"
