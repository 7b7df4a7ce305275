#!/usr/bin/env bash
# Benchmark: pgbench select-only (-S) in simple, extended and prepared mode at 1, 8
# and 32 clients, directly against PostgreSQL and through pgtenant (transaction
# pooling, pool size 20, session tenant set), the targets interleaved over several
# rounds. Prints median TPS, latency, the ratio to direct and pgtenant's CPU time
# per transaction.
#
#   [WORKERS=1] bench/pgbench.sh [rounds=3] [seconds=5] [scale=10]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
SCALE=${3:-10}
PROXY_PORT=${PROXY_PORT:-6532}
SHARD_PORT=${SHARD_PORT:-6542}

cargo build --release --quiet
BIN=target/release/pgtenant
STATE=$(mktemp -d /tmp/pgtenant-bench.XXXXXX)
chmod 755 "$STATE"
"$BIN" dev --dir "$STATE" --port "$PROXY_PORT" --shard-port "$SHARD_PORT" --workers "${WORKERS:-1}" >"$STATE/proxy.log" 2>&1 &
PROXY_PID=$!
cleanup() { kill -INT "$PROXY_PID" 2>/dev/null; wait "$PROXY_PID" 2>/dev/null || true; rm -rf "$STATE"; }
trap cleanup EXIT

export PGPASSWORD=app PGUSER=app PGDATABASE=app PGHOST=127.0.0.1 PGSSLMODE=disable
for _ in $(seq 100); do psql -p "$PROXY_PORT" -XAtc "select 1" >/dev/null 2>&1 && break; sleep 0.2; done
# Tenant 7 lives on shard 1, whose cluster listens on SHARD_PORT.
pgbench -p "$SHARD_PORT" -i -q -s "$SCALE" >/dev/null 2>&1

cpu_ticks() { awk '{print $14 + $15}' "/proc/$PROXY_PID/stat"; }
TICKS=$(getconf CLK_TCK)
RESULTS="$STATE/results"
: >"$RESULTS"

run() { # target mode clients
  local port=$SHARD_PORT opts=""
  [ "$1" = pgtenant ] && port=$PROXY_PORT && opts="-c pgtenant.tenant_id=7"
  local jobs=$(( $3 < 2 ? 1 : 2 ))
  local before after out
  before=$(cpu_ticks)
  out=$(PGOPTIONS="$opts" pgbench -p "$port" -S -M "$2" -c "$3" -j "$jobs" -T "$SECONDS_PER_RUN" -n 2>&1)
  after=$(cpu_ticks)
  local tps lat tx
  tps=$(echo "$out" | awk '/^tps/ {print $3}')
  lat=$(echo "$out" | awk '/latency average/ {print $4}')
  tx=$(echo "$out" | awk '/actually processed/ {split($6, a, "/"); print a[1]}')
  local cpu_us
  cpu_us=$(awk -v d=$((after - before)) -v t="$TICKS" -v n="$tx" 'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
  [ "$1" = direct ] && cpu_us=0
  echo "$1 $2 $3 $tps $lat $cpu_us" >>"$RESULTS"
}

for round in $(seq "$ROUNDS"); do
  for mode in simple extended prepared; do
    for clients in 1 8 32; do
      if (( round % 2 )); then run direct $mode $clients; run pgtenant $mode $clients
      else run pgtenant $mode $clients; run direct $mode $clients; fi
    done
  done
  echo "round $round done" >&2
done

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }
printf "%-9s %7s | %12s %9s | %12s %9s %7s %12s\n" mode clients "direct tps" "lat ms" "pgtenant tps" "lat ms" ratio "cpu us/tx"
for mode in simple extended prepared; do
  for clients in 1 8 32; do
    pick() { awk -v t="$1" -v m=$mode -v c=$clients -v f="$2" '$1==t && $2==m && $3==c {print $f}' "$RESULTS" | median; }
    d=$(pick direct 4); dl=$(pick direct 5); p=$(pick pgtenant 4); pl=$(pick pgtenant 5); cpu=$(pick pgtenant 6)
    ratio=$(awk -v p="$p" -v d="$d" 'BEGIN { printf "%.2f", p / d }')
    printf "%-9s %7s | %12.0f %9.3f | %12.0f %9.3f %7s %12s\n" $mode $clients "$d" "$dl" "$p" "$pl" "$ratio" "$cpu"
  done
done
