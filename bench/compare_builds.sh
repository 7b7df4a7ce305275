#!/usr/bin/env bash
# Benchmark: the data path of this build against another build of pgtenant (OLD, a
# binary), both serving the same `pgtenant dev` shards with the same configuration,
# interleaved: pgbench through each, simple and extended protocol, for each of
# WORKLOADS (select: -S, the default; insert: one autocommit INSERT ... RETURNING;
# tpcb: pgbench's TPC-B-like transaction). Prints each run's TPS and the proxy's CPU
# per transaction, per workload, mode and build. Settings the old build does not know
# are left out of its configuration.
#
#   OLD=/path/to/old/pgtenant [CLIENTS=8] [WORKLOADS="select insert tpcb"] bench/compare_builds.sh [rounds=5] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECONDS_PER_RUN=${2:-5}
: "${OLD:?OLD must name the binary of the other build}"
PROXY_PORT=${PROXY_PORT:-7132}
SHARD_PORT=${SHARD_PORT:-7142}
OLD_PORT=${OLD_PORT:-7152}

source bench/common.sh
start_dev compare "${WORKERS:-0}"
pgbench -p "$SHARD_PORT" -i -q -s 10 >/dev/null 2>&1
# dev's configuration on OLD_PORT, without dev's HTTP listener (see dev_config_on).
dev_config_on "$OLD_PORT" >"$STATE/old.toml"
# Drops the settings the old build refuses, one by one, until it accepts the file.
for _ in $(seq 20); do
  unknown=$({ "$OLD" check-config "$STATE/old.toml" 2>&1 || true; } | sed -n 's/.*unknown field .\([a-z_]*\).*/\1/p' | head -1)
  [ -z "$unknown" ] && break
  # A setting, or a whole table of them.
  sed -i "/^$unknown *=/d" "$STATE/old.toml"
  awk -v t="[$unknown]" '$0 == t {skip = 1; next} /^\[/ {skip = 0} !skip' "$STATE/old.toml" >"$STATE/old.toml.new"
  mv "$STATE/old.toml.new" "$STATE/old.toml"
done
"$OLD" serve --config "$STATE/old.toml" >"$STATE/old.log" 2>&1 &
stop_on_exit $! INT
wait_for_port "$OLD_PORT" || { cat "$STATE/old.log" >&2; exit 1; }

OLD_PID=$!
cat >"$STATE/insert.sql" <<'SQL'
\set aid random(1, 1000000)
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, :aid, 1, CURRENT_TIMESTAMP) RETURNING aid;
SQL
TICKS=$(getconf CLK_TCK)
for round in $(seq "$ROUNDS"); do
  for workload in ${WORKLOADS:-select}; do
    case $workload in
      select) args="-S" ;;
      insert) args="-f $STATE/insert.sql" ;;
      tpcb) args="-b tpcb-like" ;;
      *) echo "unknown workload $workload" >&2; exit 1 ;;
    esac
    for mode in simple extended; do
      order="new old"
      [ $((round % 2)) = 0 ] && order="old new"
      for build in $order; do
        port=$PROXY_PORT pid=$PROXY_PID
        [ "$build" = old ] && port=$OLD_PORT pid=$OLD_PID
        # The proxy's CPU over the steady part of the run (see pgbench_steady).
        window_sample() { cpu_ticks "$pid"; }
        # shellcheck disable=SC2086 # the workload's arguments, split on purpose
        PGOPTIONS="-c pgtenant.tenant_id=7" pgbench_steady "$STATE/pgbench-out" "$SECONDS_PER_RUN" -p "$port" -n \
          $args -M "$mode" -c "${CLIENTS:-8}" -j 2
        tps=$(awk '/^tps/ {print int($3)}' "$STATE/pgbench-out")
        us=$(awk -v d=$((WINDOW_AFTER - WINDOW_BEFORE)) -v t="$TICKS" -v n="$WINDOW_TX" 'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
        echo "$workload $mode $build ${tps:-0} $us"
      done
    done
  done
done >"$STATE/runs"
echo "TPS of each round, then the proxy's CPU µs per transaction of each round"
awk '{k = $1 " " $2 " " $3; runs[k] = runs[k] " " $4; cpu[k] = cpu[k] " " $5} END {for (k in runs) print k ":" runs[k] " |" cpu[k]}' "$STATE/runs" | sort
