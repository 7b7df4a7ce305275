#!/usr/bin/env bash
# Benchmark: where a proxy's CPU per transaction goes, pgtenant beside PgBouncer. For
# each target, one pgbench run (the arguments given, against the proxy over TCP, shard
# 1's Unix socket behind it, as bench/pgbench.sh runs them) and `perf stat` on the proxy
# over the middle of the run: system calls, context switches and CPU milliseconds,
# each per transaction; the targets alternate for ROUNDS rounds.
#
# Most of a relayed transaction's cost is the kernel's (the proxy's own calls, and the
# wake-ups of the processes its writes reach), so a proxy's system calls per transaction
# tell more than its instruction count. Needs `perf` with the raw_syscalls tracepoint
# readable (root, or kernel.perf_event_paranoid <= 1) and PgBouncer.
#
#   [ROUNDS=2] bench/syscalls.sh [seconds=10] -- pgbench arguments
#   e.g. bench/syscalls.sh 10 -- -S -M extended -c 400 -j 2
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-10}
shift
[ "${1:-}" = -- ] && shift
PROXY_PORT=${PROXY_PORT:-6533}
SHARD_PORT=${SHARD_PORT:-6543}
BOUNCER_PORT=${BOUNCER_PORT:-6553}
command -v perf >/dev/null && command -v pgbouncer >/dev/null || { echo "needs perf and pgbouncer" >&2; exit 1; }
[ "$SECONDS_PER_RUN" -ge 6 ] || { echo "runs of at least 6 seconds: the window skips the first 3 and the last" >&2; exit 1; }

source bench/common.sh
start_dev syscalls 0
pgbench -p "$SHARD_PORT" -i -q -s 10 >/dev/null 2>&1
start_bouncer bouncer "$BOUNCER_PORT" "$STATE/shard1"

FROM=3
TO=$((SECONDS_PER_RUN - 1))
printf "%-10s %5s | %10s %12s %14s %12s\n" target round tx "syscalls/tx" "switches/tx" "cpu us/tx"
for round in $(seq "${ROUNDS:-2}"); do
  for target in pgtenant pgbouncer; do
    if [ $target = pgtenant ]; then port=$PROXY_PORT pid=$PROXY_PID opts="-c pgtenant.tenant_id=7"; else port=$BOUNCER_PORT pid=$BOUNCER_PID opts=""; fi
    PGOPTIONS="$opts" pgbench -p "$port" -n "$@" -T "$SECONDS_PER_RUN" -P 1 >"$STATE/out" 2>&1 &
    PGBENCH_PID=$!
    from=$(progress_time_from "$STATE/out" "$FROM")
    perf stat -x, -o "$STATE/perf" -e raw_syscalls:sys_enter,context-switches,task-clock -p "$pid" \
      -- sleep "$(awk -v a="$from" -v b="$TO" 'BEGIN { print (b - a > 1 ? b - a : 1) }')" 2>/dev/null
    to=$(progress_time_from "$STATE/out" "$TO")
    wait "$PGBENCH_PID" || true
    tx=$(awk -v a="$from" -v b="$to" '/^progress: / { t = $2 + 0; if (t > a && t <= b) n += $4 * (t - prev); prev = t } END { printf "%.0f", n }' "$STATE/out")
    # perf's CSV: value,unit,event,...; task-clock in milliseconds.
    awk -F, -v tx="$tx" -v t=$target -v r="$round" '
      $3 ~ /raw_syscalls/ { s = $1 } $3 == "context-switches" { c = $1 } $3 == "task-clock" { m = $1 }
      END { printf "%-10s %5s | %10s %12.2f %14.2f %12.1f\n", t, r, tx, s / tx, c / tx, m * 1000 / tx }' "$STATE/perf"
  done
done
echo "pgbench $* for ${SECONDS_PER_RUN} s; counted over seconds $FROM to $TO; pgtenant workers = 0 (shipped default)"
scheduling_note
