#!/usr/bin/env bash
# Benchmark (issue 30): unrelated clients' latency while long statements of new shapes
# arrive. FAST clients of tenant 8 loop `SELECT 1` for the run; meanwhile one client of
# tenant 7 sends BIG statements of about SIZE bytes, each of a shape never seen before
# (`... WHERE id IN (1, 2, ...)` with a different count each time), one after another.
# Targets, interleaved: direct (the shard itself: what the machine alone does to the
# fast clients while PostgreSQL parses), pgtenant (shipped defaults) and
# pgtenant-parse-all (max_parsed_statement_bytes raised so that every statement goes to
# the parser, on its low-priority thread), and PgBouncer (transaction pooling, pool 20)
# when it is installed: a pooler also gives several clients' statements to one server
# process, which the kernel then schedules against the one parsing. Prints the fast
# clients' queries and p50 / p99 / max latency (ms) with and without the long
# statements, and how long each long one took.
# Goal: max <= 50 ms beside them.
#
#   [FAST=4] [BIG=3] [SIZE=2200000] [WORKERS=0] [PGBOUNCER=0] [SERVERS_APART=1] bench/big_statements.sh [rounds=2] [seconds=6]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
SECONDS_PER_RUN=${2:-6}
FAST=${FAST:-4}
BIG=${BIG:-3}
SIZE=${SIZE:-2200000}
PROXY_PORT=${PROXY_PORT:-6932}
SHARD_PORT=${SHARD_PORT:-6942}
PARSE_ALL_PORT=${PARSE_ALL_PORT:-6952}
BOUNCER_PORT=${BOUNCER_PORT:-6962}

source bench/common.sh
start_dev big "${WORKERS:-0}"
serve_variant "$PARSE_ALL_PORT" max_parsed_statement_bytes "max_parsed_statement_bytes = 1000000000"
# direct: the same clients on the shard itself, for what the machine alone does to the
# fast clients' latency while PostgreSQL parses the long statements.
TARGETS="direct pgtenant pgtenant-parse-all"
if [ "${PGBOUNCER:-1}" != 0 ] && command -v pgbouncer >/dev/null 2>&1; then
  start_bouncer bouncer "$BOUNCER_PORT" "$STATE/shard1"
  TARGETS="$TARGETS pgbouncer"
fi
port_of() {
  case $1 in
    direct) echo "$SHARD_PORT" ;;
    pgtenant) echo "$PROXY_PORT" ;;
    pgbouncer) echo "$BOUNCER_PORT" ;;
    *) echo "$PARSE_ALL_PORT" ;;
  esac
}
# tenant_options TENANT TARGET: PGOPTIONS naming the tenant, for the targets that read it
# (PgBouncer refuses the startup option).
tenant_options() { [ "$2" = pgbouncer ] || echo "-c pgtenant.tenant_id=$1"; }

echo "SELECT 1;" >"$STATE/fast.sql"
LOGS="$STATE/logs"
mkdir -p "$LOGS"
# big_statement N: a statement of about SIZE bytes whose shape has N + its own count.
big_statement() {
  awk -v size="$SIZE" -v salt="$1" 'BEGIN {
    printf "SELECT count(*) FROM accounts WHERE tenant_id = 7 AND id IN (0"
    n = int(size / 8) + salt
    for (i = 1; i <= n; i++) printf ",%d", 1000000 + i
    printf ");\n"
  }'
}
for i in $(seq $((ROUNDS * BIG * $(echo $TARGETS | wc -w)))); do big_statement "$i" >"$STATE/big.$i.sql"; done
next_big=1

for round in $(seq "$ROUNDS"); do
  for target in $TARGETS; do
    for phase in quiet big; do
      (cd "$LOGS" && PGOPTIONS="$(tenant_options 8 "$target")" pgbench -p "$(port_of "$target")" -n -c "$FAST" -j 1 \
        -T "$SECONDS_PER_RUN" -f "$STATE/fast.sql" --log --log-prefix="$target.$phase.$round" >/dev/null 2>&1) &
      fast=$!
      if [ "$phase" = big ]; then
        sleep 1
        for _ in $(seq "$BIG"); do
          start=$(date +%s%N)
          PGOPTIONS="$(tenant_options 7 "$target")" psql -p "$(port_of "$target")" -XAtq -f "$STATE/big.$next_big.sql" >/dev/null
          echo "$target $(( ($(date +%s%N) - start) / 1000000 ))" >>"$LOGS/big-times"
          next_big=$((next_big + 1))
        done
      fi
      wait "$fast" || true
    done
  done
  echo "round $round done" >&2
done

scheduling_note
printf "%-20s %-6s %9s %9s %9s %9s\n" target phase queries "p50 ms" "p99 ms" "max ms"
for target in $TARGETS; do
  for phase in quiet big; do
    cat "$LOGS/$target.$phase".* | awk '{print $3}' | sort -n | awk -v t="$target" -v p="$phase" '
      {a[NR] = $1}
      END { printf "%-20s %-6s %9d %9.2f %9.2f %9.2f\n", t, p, NR, a[int(NR * 0.5) + 1] / 1000, a[int(NR * 0.99) + 1] / 1000, a[NR] / 1000 }'
  done
  echo "$target: each long statement took (ms): $(awk -v t="$target" '$1 == t {printf "%s ", $2}' "$LOGS/big-times")"
done
