#!/usr/bin/env bash
# Benchmark (issue 26): the proxy's resident memory per idle client and per active
# client, for sizing a sidecar or a central pool. `pgtenant dev` provides the shards;
# a second proxy (`pgtenant serve`, the dev configuration with max_clients raised) is
# measured: its RSS before any client, with N idle clients (each ran one statement,
# tenant 7), and with M clients each running statements back to back.
#
#   bench/idle_clients.sh [N=10000] [M=200] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
M=${2:-200}
HOLD=${3:-5}
PROXY_PORT=${PROXY_PORT:-7732}
SHARD_PORT=${SHARD_PORT:-7742}
MEASURED_PORT=${MEASURED_PORT:-7733}
# Every client takes a file descriptor in this script's client and in the proxy.
ulimit -n "$(ulimit -Hn)"

cargo build --release --quiet --example hold_clients
CLIENT=${CARGO_TARGET_DIR:-target}/release/examples/hold_clients
source bench/common.sh
DEV_ARGS="--replicas 0 --http-port 0" start_dev idle-clients 0

sed -e "s/^listen = .*/listen = \"127.0.0.1:$MEASURED_PORT\"/" -e "s/^max_clients = .*/max_clients = $((N + 100))/" \
  "$STATE/pgtenant.toml" >"$STATE/measured.toml"
grep -q "^max_clients" "$STATE/measured.toml" || sed -i "s/^\[proxy\]/[proxy]\nmax_clients = $((N + 100))/" "$STATE/measured.toml"
# A fresh proxy process per phase: RSS does not fall back after clients leave.
start_measured() {
  "$BIN" serve --config "$STATE/measured.toml" >"$STATE/measured.log" 2>&1 &
  MEASURED=$!
  stop_on_exit "$MEASURED"
  wait_for_port "$MEASURED_PORT" 100
}
stop_measured() { kill -INT "$MEASURED"; wait "$MEASURED" 2>/dev/null || true; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$MEASURED/status"; }
CONNINFO="host=127.0.0.1 port=$MEASURED_PORT user=app password=app dbname=app sslmode=disable options='-c pgtenant.tenant_id=7'"

start_measured
before=$(rss)
"$CLIENT" idle "$N" "$CONNINFO" $((HOLD + 30)) >"$STATE/idle.out" &
idle=$!
until grep -q connected "$STATE/idle.out" 2>/dev/null; do sleep 0.5; kill -0 "$idle"; done
sleep "$HOLD"
with_idle=$(rss)
kill "$idle"; wait "$idle" 2>/dev/null || true
stop_measured
start_measured
before_active=$(rss)
"$CLIENT" active "$M" "$CONNINFO" "$HOLD" >"$STATE/active.out" &
active=$!
until grep -q connected "$STATE/active.out" 2>/dev/null; do sleep 0.2; kill -0 "$active"; done
sleep $((HOLD / 2))
with_active=$(rss)
wait "$active"
printf 'proxy RSS: %d KiB before any client\n' "$before"
printf '%d idle clients:   %d KiB (%.1f KiB per client; %s)\n' "$N" "$with_idle" "$(echo "($with_idle - $before) / $N" | bc -l)" "$(head -1 "$STATE/idle.out")"
printf '%d active clients: %d KiB (%.1f KiB per client; %s)\n' "$M" "$with_active" "$(echo "($with_active - $before_active) / $M" | bc -l)" "$(tail -1 "$STATE/active.out")"
