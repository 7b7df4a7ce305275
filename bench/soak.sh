#!/usr/bin/env bash
# Soak (issue 28): a proxy with the shipped defaults (`pgtenant dev`'s configuration,
# max_clients raised for the idle crowd) serves, for MINUTES minutes:
#   - IDLE idle clients of tenant 7 (`bench/soak_client.rs`): every 10 s, CHURN of them
#     vanish without a Terminate and come back, PINGS others run a statement;
#   - a steady pgbench load through it, a fresh pgbench each minute (a client that
#     PostgreSQL's faults below abort is back the next minute), cycling through the
#     simple, extended and prepared protocols: RATE transactions per second by 16
#     clients, 90% select-only and 10% simple-update (a transaction of three writes);
# while, 20 s into the minute, shard 1 (tenant 7's) is restarted every 5th minute
# (`pg_ctl restart -m fast`, from minute 3) and half the proxy's server connections to
# it are ended with `pg_terminate_backend` every 2nd minute (from minute 2).
#
# Each minute prints one line: the fault, pgbench's transactions per second, failed
# transactions and the errors that aborted its clients, the proxy's RSS, open fds and
# threads, the server connections on each shard, and the idle clients' line (held,
# reconnected, pinged, errors). The summary compares the samples of RSS, fds and
# server connections after the warm-up minute with the last ones.
#
#   [IDLE=10000] [CHURN=100] [PINGS=200] [RATE=800] bench/soak.sh [MINUTES=60]
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${1:-60}
IDLE=${IDLE:-10000}
CHURN=${CHURN:-100}
PINGS=${PINGS:-200}
RATE=${RATE:-800}
PROXY_PORT=${PROXY_PORT:-7832}
SHARD_PORT=${SHARD_PORT:-7842}
MEASURED_PORT=${MEASURED_PORT:-7833}
ulimit -n "$(ulimit -Hn)"

cargo build --release --quiet --example soak_client
CLIENT=${CARGO_TARGET_DIR:-target}/release/examples/soak_client
source bench/common.sh
PG_BIN=$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
DEV_ARGS="--replicas 0 --http-port 0" start_dev soak 0
pgbench -p "$SHARD_PORT" -i -q -s 10 >/dev/null 2>&1

sed -e "s/^listen = .*/listen = \"127.0.0.1:$MEASURED_PORT\"/" -e "s/^max_clients = .*/max_clients = $((IDLE + 200))/" \
  "$STATE/pgtenant.toml" >"$STATE/measured.toml"
"$BIN" serve --config "$STATE/measured.toml" >"$STATE/measured.log" 2>&1 &
MEASURED=$!
stop_on_exit "$MEASURED"
wait_for_port "$MEASURED_PORT" 100

CONNINFO="host=127.0.0.1 port=$MEASURED_PORT user=app password=app dbname=app sslmode=disable options='-c pgtenant.tenant_id=7'"
"$CLIENT" "$IDLE" "$CONNINFO" $((MINUTES * 60 + 30)) "$CHURN" "$PINGS" >"$STATE/idle.out" 2>&1 &
IDLE_PID=$!
stop_on_exit "$IDLE_PID" TERM
until grep -q connected "$STATE/idle.out" 2>/dev/null; do
  sleep 1
  kill -0 "$IDLE_PID" 2>/dev/null || { echo "idle clients failed:" >&2; cat "$STATE/idle.out" >&2; exit 1; }
done
head -1 "$STATE/idle.out"

server_conns() { psql -h 127.0.0.1 -p "$1" -U postgres -d app -XAtc "select count(*) from pg_stat_activity where usename = 'app'" 2>/dev/null || echo "?"; }
restart_shard1() { as_owner "$PG_BIN/pg_ctl" -D "$STATE/shard1" -m fast -w restart >/dev/null 2>&1 && echo restarted; }
terminate_half() {
  psql -h 127.0.0.1 -p "$SHARD_PORT" -U postgres -d app -XAtc "select count(pg_terminate_backend(pid)) from pg_stat_activity
    where usename = 'app' and pid <> pg_backend_pid() and random() < 0.5"
}

MODES=(simple extended prepared)
SAMPLES="$STATE/samples"
: >"$SAMPLES"
printf '%-4s %-18s %-9s %7s %6s %9s %5s %4s %8s  %s\n' min fault mode tps failed "rss KiB" fds thr "servers" "idle clients / pgbench errors"
for minute in $(seq "$MINUTES"); do
  mode=${MODES[$((minute % 3))]}
  fault=none
  if ((minute >= 3 && minute % 5 == 3)); then fault=restart; elif ((minute >= 2 && minute % 2 == 0)); then fault=terminate; fi
  PGOPTIONS="-c pgtenant.tenant_id=7" pgbench -h 127.0.0.1 -p "$MEASURED_PORT" -n -c 16 -j 2 -R "$RATE" -T 58 -M "$mode" \
    -b select-only@9 -b simple-update@1 >"$STATE/pgbench-$minute.out" 2>&1 &
  bench=$!
  sleep 20
  case $fault in
    restart) fault="restart:$(restart_shard1 || echo failed)" ;;
    terminate) fault="terminated:$(terminate_half)" ;;
  esac
  wait "$bench" || true
  tps=$(awk '/^tps = / {printf "%.0f", $3}' "$STATE/pgbench-$minute.out")
  failed=$(awk '/^number of failed transactions/ {print $5}' "$STATE/pgbench-$minute.out")
  aborts=$(grep -oE "aborted in command [0-9]+ query [0-9]+: .*" "$STATE/pgbench-$minute.out" | sed -E 's/aborted in command [0-9]+ query [0-9]+: //' | sort | uniq -c | sed -E 's/^ +//' | paste -sd ';' - || true)
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$MEASURED/status")
  fds=$(ls "/proc/$MEASURED/fd" | wc -l)
  threads=$(awk '/^Threads/ {print $2}' "/proc/$MEASURED/status")
  servers="$(server_conns "$SHARD_PORT")/$(server_conns $((SHARD_PORT + 1)))"
  idle=$(grep "^minute " "$STATE/idle.out" | tail -1 | sed -E 's/^minute [0-9]+: //' || true)
  echo "$minute $rss $fds ${servers%%/*}" >>"$SAMPLES"
  printf '%-4s %-18s %-9s %7s %6s %9s %5s %4s %8s  %s\n' "$minute" "$fault" "$mode" "${tps:-0}" "${failed:-?}" "$rss" "$fds" "$threads" "$servers" "$idle"
  [ -n "$aborts" ] && echo "     pgbench aborts: $aborts"
  kill -0 "$MEASURED" 2>/dev/null || { echo "the proxy exited:" >&2; tail -20 "$STATE/measured.log" >&2; exit 1; }
done
awk 'NR == 2 {r = $2; f = $3; s = $4} {lr = $2; lf = $3; ls = $4; if ($2 > mr) mr = $2; if ($3 > mf) mf = $3}
  END {printf "after minute 2 -> last: RSS %d -> %d KiB (max %d), fds %d -> %d (max %d), shard-1 server connections %s -> %s\n", r, lr, mr, f, lf, mf, s, ls}' "$SAMPLES"
grep -c "panicked" "$STATE/measured.log" | xargs printf 'proxy log: %s panics\n'
