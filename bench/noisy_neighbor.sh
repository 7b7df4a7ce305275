#!/usr/bin/env bash
# Benchmark (issue 30): a quiet tenant beside a noisy one on the same shard. Tenant 8
# runs QUIET clients looping `SELECT 1`, alone and then beside NOISY clients of tenant
# 7 looping `SELECT pg_sleep(0.2)` (which alone would hold every connection of the
# shard's pool of 20). Targets, interleaved over rounds:
#   pgtenant          the shipped defaults (fair shares, pipelining)
#   pgtenant-nopipe   pipeline_depth = 0
#   pgtenant-unfair   fair_share = false (one line for all tenants, as before issue 30)
#   pgbouncer         PgBouncer 1.x in front of the same shard (pool 20), if installed
# Prints tenant 8's queries, p50 / p99 / max latency (ms) alone and beside, and the
# share of its alone throughput it kept. Goal: >= 50 % kept, p99 <= 10 ms.
#
#   [QUIET=2] [NOISY=30] [WORKERS=0] bench/noisy_neighbor.sh [rounds=2] [seconds=8]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
SECONDS_PER_RUN=${2:-8}
QUIET=${QUIET:-2}
NOISY=${NOISY:-30}
PROXY_PORT=${PROXY_PORT:-6732}
SHARD_PORT=${SHARD_PORT:-6742}
NOPIPE_PORT=${NOPIPE_PORT:-6752}
UNFAIR_PORT=${UNFAIR_PORT:-6753}
BOUNCER_PORT=${BOUNCER_PORT:-6762}

source bench/common.sh
start_dev noisy "${WORKERS:-0}"

serve_variant "$NOPIPE_PORT" pipeline_depth "pipeline_depth = 0"
serve_variant "$UNFAIR_PORT" fair_share "fair_share = false"
TARGETS="pgtenant pgtenant-nopipe pgtenant-unfair"
if [ "${PGBOUNCER:-1}" != 0 ] && command -v pgbouncer >/dev/null 2>&1; then
  start_bouncer bouncer "$BOUNCER_PORT" "$STATE/shard1"
  TARGETS="$TARGETS pgbouncer"
fi

echo "SELECT 1;" >"$STATE/quiet.sql"
echo "SELECT pg_sleep(0.2);" >"$STATE/noisy.sql"
LOGS="$STATE/logs"
mkdir -p "$LOGS"

port_of() {
  case $1 in
    pgtenant) echo "$PROXY_PORT" ;;
    pgtenant-nopipe) echo "$NOPIPE_PORT" ;;
    pgtenant-unfair) echo "$UNFAIR_PORT" ;;
    pgbouncer) echo "$BOUNCER_PORT" ;;
  esac
}

# tenant_of TARGET TENANT: the PGOPTIONS that give a session its tenant (PgBouncer
# refuses the options parameter, and has no tenants).
tenant_of() { [ "$1" = pgbouncer ] || echo "-c pgtenant.tenant_id=$2"; }

# quiet TARGET PHASE ROUND: tenant 8's clients for SECONDS_PER_RUN, logged.
quiet() {
  (cd "$LOGS" && PGOPTIONS="$(tenant_of "$1" 8)" pgbench -p "$(port_of "$1")" -n -c "$QUIET" -j 1 \
    -T "$SECONDS_PER_RUN" -f "$STATE/quiet.sql" --log --log-prefix="$1.$2.$3" >/dev/null 2>&1) || true
}

for round in $(seq "$ROUNDS"); do
  order=$(echo $TARGETS | tr ' ' '\n' | awk -v r="$round" '{a[NR]=$0} END {for (i = 0; i < NR; i++) print a[(i + r) % NR + 1]}')
  for target in $order; do
    quiet "$target" alone "$round"
    PGOPTIONS="$(tenant_of "$target" 7)" pgbench -p "$(port_of "$target")" -n -c "$NOISY" -j 1 \
      -T "$((SECONDS_PER_RUN + 3))" -f "$STATE/noisy.sql" >"$LOGS/noisy.$target.$round.out" 2>&1 &
    noisy=$!
    sleep 1.5
    quiet "$target" beside "$round"
    wait "$noisy" || true
  done
  echo "round $round done" >&2
done

# Log lines: client transaction latency_us script epoch epoch_us.
printf "%-16s %-7s %9s %9s %9s %9s %7s\n" target phase queries "p50 ms" "p99 ms" "max ms" kept
for target in $TARGETS; do
  alone=0
  for phase in alone beside; do
    cat "$LOGS/$target.$phase".* 2>/dev/null | awk '{print $3}' | sort -n | awk -v t="$target" -v p="$phase" -v alone="$alone" '
      {a[NR] = $1}
      END {
        if (NR == 0) { printf "%-16s %-7s %9d\n", t, p, 0; exit }
        kept = (alone > 0) ? sprintf("%6.1f%%", 100 * NR / alone) : ""
        printf "%-16s %-7s %9d %9.2f %9.2f %9.2f %7s\n", t, p, NR, a[int(NR * 0.5) + 1] / 1000, a[int(NR * 0.99) + 1] / 1000, a[NR] / 1000, kept
      }'
    [ "$phase" = alone ] && alone=$(cat "$LOGS/$target.alone".* 2>/dev/null | wc -l)
  done
done
