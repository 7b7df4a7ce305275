#!/usr/bin/env bash
# Benchmark: a mixed workload, 95 % fast reads (pgbench -S's statement) and 5 % slow
# statements (`SLOW`, by default `SELECT pg_sleep(0.2)`), directly against PostgreSQL,
# through pgtenant (shipped defaults, session tenant 7) and through PgBouncer
# (transaction pooling, pool size 20) when it is installed; targets interleaved over
# several rounds. Prints each script's transactions and latency p50 / p99 / max (ms)
# per target, from pgbench's per-transaction log: the fast script's p99 shows whether
# fast requests wait behind slow ones.
#
#   [WORKERS=0] [CLIENTS=16] [SLOW="SELECT pg_sleep(0.2)"] bench/mixed.sh [rounds=3] [seconds=10] [scale=10]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-10}
SCALE=${3:-10}
CLIENTS=${CLIENTS:-16}
SLOW=${SLOW:-SELECT pg_sleep(0.2);}
PROXY_PORT=${PROXY_PORT:-6632}
SHARD_PORT=${SHARD_PORT:-6642}
BOUNCER_PORT=${BOUNCER_PORT:-6652}

source bench/common.sh
start_dev mixed "${WORKERS:-0}"
pgbench -p "$SHARD_PORT" -i -q -s "$SCALE" >/dev/null 2>&1
TARGETS="direct pgtenant"
if [ "${PGBOUNCER:-1}" != 0 ] && command -v pgbouncer >/dev/null 2>&1; then
  start_bouncer bouncer "$BOUNCER_PORT" "$STATE/shard1"
  TARGETS="$TARGETS pgbouncer"
fi

cat >"$STATE/fast.sql" <<SQL
\set aid random(1, 100000 * $SCALE)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
SQL
echo "$SLOW" >"$STATE/slow.sql"
LOGS="$STATE/logs"
mkdir -p "$LOGS"

for round in $(seq "$ROUNDS"); do
  order=$(echo $TARGETS | tr ' ' '\n' | awk -v r="$round" '{a[NR]=$0} END {for (i = 0; i < NR; i++) print a[(i + r) % NR + 1]}')
  for target in $order; do
    port=$SHARD_PORT opts=""
    case $target in
      pgtenant) port=$PROXY_PORT; opts="-c pgtenant.tenant_id=7" ;;
      pgbouncer) port=$BOUNCER_PORT ;;
    esac
    (cd "$LOGS" && PGOPTIONS="$opts" pgbench -p "$port" -n -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" \
      -f "$STATE/fast.sql@95" -f "$STATE/slow.sql@5" --log --log-prefix="$target.$round" >/dev/null 2>&1) || true
  done
  echo "round $round done" >&2
done

# Log lines: client transaction latency_us script epoch epoch_us.
scheduling_note
printf "%-10s %-5s %9s %9s %9s %9s\n" target script count "p50 ms" "p99 ms" "max ms"
for target in $TARGETS; do
  for script in 0 1; do
    name=$([ $script = 0 ] && echo fast || echo slow)
    cat "$LOGS/$target".* | awk -v s=$script '$4 == s {print $3}' | sort -n | awk -v t="$target" -v n="$name" '
      {a[NR] = $1}
      END {
        if (NR == 0) { printf "%-10s %-5s %9d\n", t, n, 0; exit }
        printf "%-10s %-5s %9d %9.2f %9.2f %9.2f\n", t, n, NR, a[int(NR * 0.5) + 1] / 1000, a[int(NR * 0.99) + 1] / 1000, a[NR] / 1000
      }'
  done
done
