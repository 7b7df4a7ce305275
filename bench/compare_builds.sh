#!/usr/bin/env bash
# Benchmark: the data path of this build against another build of pgtenant (OLD, a
# binary), both serving the same `pgtenant dev` shards with the same configuration,
# interleaved: pgbench -S through each, simple and extended protocol. Prints each
# run's TPS per mode and build. Settings the old build does not know are left out of
# its configuration.
#
#   OLD=/path/to/old/pgtenant [CLIENTS=8] bench/compare_builds.sh [rounds=5] [seconds=5]
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
cp "$STATE/pgtenant.toml" "$STATE/old.toml"
# Drops the settings the old build refuses, one by one, until it accepts the file.
for _ in $(seq 20); do
  unknown=$({ "$OLD" check-config "$STATE/old.toml" 2>&1 || true; } | sed -n 's/.*unknown field .\([a-z_]*\).*/\1/p' | head -1)
  [ -z "$unknown" ] && break
  # A setting, or a whole table of them.
  sed -i "/^$unknown *=/d" "$STATE/old.toml"
  awk -v t="[$unknown]" '$0 == t {skip = 1; next} /^\[/ {skip = 0} !skip' "$STATE/old.toml" >"$STATE/old.toml.new"
  mv "$STATE/old.toml.new" "$STATE/old.toml"
done
sed -i "s/^listen = .*/listen = \"127.0.0.1:$OLD_PORT\"/" "$STATE/old.toml"
"$OLD" serve --config "$STATE/old.toml" >"$STATE/old.log" 2>&1 &
stop_on_exit $! INT
wait_for_port "$OLD_PORT" || { cat "$STATE/old.log" >&2; exit 1; }

for round in $(seq "$ROUNDS"); do
  for mode in simple extended; do
    order="new old"
    [ $((round % 2)) = 0 ] && order="old new"
    for build in $order; do
      port=$([ "$build" = new ] && echo "$PROXY_PORT" || echo "$OLD_PORT")
      tps=$(PGOPTIONS="-c pgtenant.tenant_id=7" pgbench -p "$port" -n -S -M "$mode" -c "${CLIENTS:-8}" -j 2 \
        -T "$SECONDS_PER_RUN" 2>&1 | awk '/^tps/ {print int($3)}')
      echo "$mode $build $tps"
    done
  done
done >"$STATE/runs"
awk '{k = $1 " " $2; runs[k] = runs[k] " " $3} END {for (k in runs) print k ":" runs[k]}' "$STATE/runs" | sort
