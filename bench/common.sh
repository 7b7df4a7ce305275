# Shared by the benchmark scripts (sourced, from the repository root): starts
# `pgtenant dev` in a throwaway state directory and stops it, and whatever else a
# script registered, when the script exits.
#
# Expects PROXY_PORT and SHARD_PORT; sets BIN, STATE and PROXY_PID.
#
# Scheduling groups: with the kernel's autogroup scheduling (sched_autogroup_enabled = 1,
# the default of most distributions) a session is a scheduling group, and the cores are
# shared between groups before threads. PostgreSQL runs in a session of its own (pg_ctl
# makes one); the proxies run in the script's, beside pgbench, unless SERVERS_APART=1
# gives each its own. That choice moves the 8-client ratios by 10-40 % (pgbench -S,
# extended, 8 clients, pgtenant / PgBouncer: 1.17 and 1.35 in the script's session, 0.93
# and 0.85 apart, 1.01 with autogroup off), so pgbench.sh,
# mixed.sh and big_statements.sh print which they ran under.

# The shipped build: the dist profile with the recorded profile (deploy/build-dist.sh).
BIN=${CARGO_TARGET_DIR:-target}/dist/pgtenant
export PGPASSWORD=app PGUSER=app PGDATABASE=app PGHOST=127.0.0.1 PGSSLMODE=disable
STOP_ON_EXIT=()

# apart COMMAND...: runs a server, in a session of its own with SERVERS_APART=1. Started
# in the background, the function's subshell becomes COMMAND (exec), so that $! is the
# server's process id; it leads no process group, so setsid(1) does not fork either.
apart() { if [ "${SERVERS_APART:-0}" = 1 ]; then exec setsid "$@"; else exec "$@"; fi; }

# scheduling_note: one line on the scheduling the run had.
scheduling_note() {
  local where="in the clients' session"
  [ "${SERVERS_APART:-0}" = 1 ] && where="in sessions of their own (SERVERS_APART=1)"
  echo "proxies $where; sched_autogroup_enabled = $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo "?")"
}

# wait_for_port PORT [TRIES]: until a query through PORT answers (0.2 s per try).
wait_for_port() {
  for _ in $(seq "${2:-50}"); do psql -p "$1" -XAtc "select 1" >/dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}

# stop_on_exit PID [SIGNAL]: signal PID (INT by default) when the script exits.
stop_on_exit() { STOP_ON_EXIT+=("${2:-INT}:$1"); }

stop_all() {
  for entry in "${STOP_ON_EXIT[@]}"; do kill -"${entry%%:*}" "${entry#*:}" 2>/dev/null || true; done
  kill -INT "$PROXY_PID" 2>/dev/null || true
  wait "$PROXY_PID" 2>/dev/null || true
  rm -rf "$STATE"
}

# start_dev NAME WORKERS: builds and starts `pgtenant dev` (proxy on PROXY_PORT,
# shards from SHARD_PORT, the catalog after them) and waits until it serves.
start_dev() {
  deploy/build-dist.sh --quiet --bin pgtenant
  STATE=$(mktemp -d "/tmp/pgtenant-$1.XXXXXX")
  chmod 755 "$STATE"
  apart "$BIN" dev --dir "$STATE" --port "$PROXY_PORT" --shard-port "$SHARD_PORT" --workers "$2" ${DEV_ARGS:-} >"$STATE/proxy.log" 2>&1 &
  PROXY_PID=$!
  trap stop_all EXIT
  wait_for_port "$PROXY_PORT" 150 || true
  [ -d "/proc/$PROXY_PID" ] || { echo "pgtenant dev did not start:" >&2; cat "$STATE/proxy.log" >&2; exit 1; }
}

# enable_shard_tls DIR PORT: TLS on the shard cluster in DIR (dev's certificate), so
# that a direct client can use it as it does through the proxies.
enable_shard_tls() {
  cp "$STATE/tls/server.crt" "$STATE/tls/server.key" "$1/"
  chmod 600 "$1/server.key"
  chown "$(stat -c %U "$1")" "$1/server.crt" "$1/server.key"
  psql -U postgres -d postgres -p "$2" -XAtq -c "ALTER SYSTEM SET ssl = on" -c "SELECT pg_reload_conf()" >/dev/null
  for _ in $(seq 50); do
    PGSSLMODE=require psql -p "$2" -XAtc "select 1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "TLS on the shard at $2 did not come up" >&2
  return 1
}

# cpu_ticks PID: the process' CPU ticks so far (user and system, all its threads); 0
# once it is gone.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# pgbench_steady OUT SECONDS [pgbench arguments]: runs pgbench for SECONDS (-T) with
# a progress line every second into OUT and measures the steady part of the run only:
# `window_sample` (the caller's function: CPU ticks of what it measures, one line) is
# called when the first line of second 2 or later appears and again at second
# SECONDS-1, its two outputs left in WINDOW_BEFORE and WINDOW_AFTER, and WINDOW_TX is
# the number of transactions the progress lines report between the two. What happens
# before the benchmark's clock starts (logins: 400 SCRAM exchanges cost the proxies and
# pgbench far more than a second of their transactions) and the run's last second stay
# out of the figures. Sets PGBENCH_STATUS to pgbench's exit status.
pgbench_steady() {
  local out=$1 seconds=$2
  shift 2
  local first=2 last=$((seconds - 1))
  if [ "$seconds" -lt 4 ]; then first=0 last=$seconds; fi
  pgbench "$@" -T "$seconds" -P 1 >"$out" 2>&1 &
  PGBENCH_PID=$!
  local from to
  from=$(progress_time_from "$out" "$first")
  WINDOW_BEFORE=$(window_sample)
  to=$(progress_time_from "$out" "$last")
  WINDOW_AFTER=$(window_sample)
  PGBENCH_STATUS=0
  wait "$PGBENCH_PID" || PGBENCH_STATUS=$?
  # Each line's rate over the time since the line before it.
  WINDOW_TX=$(awk -v a="$from" -v b="$to" '/^progress: / { t = $2 + 0; if (t > a && t <= b) n += $4 * (t - prev); prev = t } END { printf "%.0f", n }' "$out")
}

# progress_time_from OUT SECOND: waits until pgbench has written a progress line of
# SECOND or later and prints that line's time (0 for SECOND 0). pgbench reports from
# when its clients are connected, at whatever fraction of a second that was (PgBouncer's
# 400 SCRAM logins took 2.3 s on a 2-core machine: no line of second 2). If pgbench
# ends first, the time of its last line.
progress_time_from() {
  [ "$2" = 0 ] && { echo 0; return 0; }
  local at
  until at=$(awk -v s="$2" '/^progress: / { t = $2 + 0; if (t >= s) { print t; found = 1; exit } } END { exit !found }' "$1"); do
    if ! kill -0 "$PGBENCH_PID" 2>/dev/null; then
      awk '/^progress: / { t = $2 + 0 } END { print t + 0 }' "$1"
      return 0
    fi
    sleep 0.02
  done
  echo "$at"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }

# start_bouncer NAME PORT HOST: a PgBouncer (transaction pooling, pool size 20) in front
# of shard 1 at HOST (an address, or a socket directory); sets BOUNCER_PID. The scripts
# give it shard 1's socket directory, "$STATE/shard1", through which pgtenant dev
# reaches its shards too.
start_bouncer() {
  local dir="$STATE/$1"
  mkdir -p "$dir"
  cat >"$dir/pgbouncer.ini" <<INI
[databases]
app = host=$3 port=$SHARD_PORT dbname=app
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $2
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 5000
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
; plain to the server, as pgtenant's default [server_tls] mode = "disable"
server_tls_sslmode = disable
INI
  if [ "${TLS:-0}" = 1 ]; then
    # TLS to clients with dev's certificate, as pgtenant serves it.
    cp "$STATE/tls/server.crt" "$STATE/tls/server.key" "$dir/"
    chmod 600 "$dir/server.key"
    printf 'client_tls_sslmode = require\nclient_tls_cert_file = %s\nclient_tls_key_file = %s\n' \
      "$dir/server.crt" "$dir/server.key" >>"$dir/pgbouncer.ini"
  fi
  echo '"app" "app"' >"$dir/userlist.txt"
  chmod 644 "$dir"/pgbouncer.ini "$dir"/userlist.txt
  local run_as=""
  [ "$(id -u)" = 0 ] && run_as="runuser -u postgres --" && chown -R postgres "$dir"
  apart $run_as pgbouncer "$dir/pgbouncer.ini" >/dev/null 2>&1 &
  wait_for_port "$2" || true
  BOUNCER_PID=$(cat "$dir/pgbouncer.pid" 2>/dev/null || echo 0)
  stop_on_exit "$BOUNCER_PID" TERM
  [ -d "/proc/$BOUNCER_PID" ] || { echo "pgbouncer $1 did not start:" >&2; cat "$dir/pgbouncer.log" >&2; exit 1; }
}

# dev_config_on PORT: the configuration `pgtenant dev` wrote, for a second proxy
# listening on PORT. The first `listen` is [proxy]'s; the others (dev's HTTP endpoint)
# are left out, so that the second proxy takes no port of dev's.
dev_config_on() {
  awk -v port="$1" '/^listen = / { if (++seen == 1) print "listen = \"127.0.0.1:" port "\""; next } { print }' \
    "$STATE/pgtenant.toml"
}

# serve_variant PORT NAME "NAME = VALUE": a second proxy on the same shards as
# `pgtenant dev`, listening on PORT, with one [proxy] setting changed.
serve_variant() {
  dev_config_on "$1" | sed -e "/^$2 *=/d" -e "s/^\[proxy\]$/[proxy]\n$3/" >"$STATE/variant-$1.toml"
  apart "$BIN" serve --config "$STATE/variant-$1.toml" >"$STATE/variant-$1.log" 2>&1 &
  stop_on_exit $! INT
  wait_for_port "$1" || { echo "variant on $1 did not start:" >&2; cat "$STATE/variant-$1.log" >&2; exit 1; }
}
