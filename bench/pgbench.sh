#!/usr/bin/env bash
# Benchmark: pgbench workloads in simple, extended and prepared mode at 1, 8 and 32
# clients, directly against PostgreSQL and through pgtenant (transaction
# pooling, pool size 20, session tenant set), and through PgBouncer (transaction
# pooling, pool size 20) when `pgbouncer` is installed; the targets interleaved over
# several rounds. Prints median TPS, latency, the ratio to direct, and the CPU time per
# transaction of the proxy, of PostgreSQL (the whole cluster) and of pgbench; beside
# PgBouncer, also the median and range of each round's pgtenant / PgBouncer ratio.
#
# "free" is the ratio to direct that a proxy costing no CPU at all would reach, from
# what PostgreSQL and pgbench spent per transaction in that run: all cores divided by
# their time per transaction. It bounds a proxy only where the machine is saturated
# (8 and 32 clients here); at 1 client the run waits on round trips, not on CPU.
#
# Clients reach every target over TCP. The proxies reach PostgreSQL through its Unix
# socket, as a proxy on the database host does (pgtenant dev's default for the clusters
# it runs; PgBouncer is given the socket directory): either way the proxy's hop is the
# one direct clients do not make, and a local one. With TCP_SERVERS=1, a second pgtenant
# ("pgtenant-tcp") reaches the same cluster over loopback TCP instead, and so does a
# second PgBouncer ("pgbouncer-tcp") when PgBouncer is installed.
#
# Clients connect without TLS unless TLS=1: then every target is reached over TLS
# (sslmode=require): pgtenant and PgBouncer with dev's certificate, and PostgreSQL itself,
# which the script turns TLS on for. Both proxies stay plain to the server (pgtenant's
# default `[server_tls] mode = "disable"`; PgBouncer's server_tls_sslmode = disable).
#
# WORKLOADS (default "select") picks pgbench's scripts: select (-S, select-only), tpcb
# (pgbench's default TPC-B-like transaction), insert (one autocommit INSERT ...
# RETURNING per transaction, into pgbench_history), connect (-S with a new connection per
# transaction, -C; SCRAM for every target). CLIENTS=400 runs past shard 1's
# max_connections (300): its direct run fails, and the proxies are compared with each
# other (PgBouncer's max_client_conn is 5000 here, pgtenant's max_clients 1000 unless DEV_ARGS says).
#
# MODES and CLIENTS pick some of the runs (e.g. MODES=simple CLIENTS="8 32").
# BENCH_JOBS sets pgbench's threads (-j; default 2, 1 for a single client). DEV_ARGS
# passes flags to `pgtenant dev` (e.g. DEV_ARGS="--max-clients 2500" for 2,000 clients).
#
# VARIANT="name = value" adds a second pgtenant ("pgtenant-variant") on the same
# cluster with that one [proxy] setting changed (e.g. VARIANT="workers = 2"),
# interleaved with the others, so that a setting is compared under the same conditions.
#
#   [WORKERS=0] [VARIANT="name = value"] [TLS=1] [PGBOUNCER=0] [TCP_SERVERS=1] [SERVERS_APART=1] [WORKLOADS=...] [MODES=...] [CLIENTS=...] bench/pgbench.sh [rounds=3] [seconds=5] [scale=10]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
SCALE=${3:-10}
PROXY_PORT=${PROXY_PORT:-6532}
SHARD_PORT=${SHARD_PORT:-6542}
BOUNCER_PORT=${BOUNCER_PORT:-6552}
TCP_PROXY_PORT=${TCP_PROXY_PORT:-6562}
TCP_BOUNCER_PORT=${TCP_BOUNCER_PORT:-6572}
MODES=${MODES:-simple extended prepared}
CLIENTS=${CLIENTS:-1 8 32}
WORKLOADS=${WORKLOADS:-select}

source bench/common.sh
# The shipped default (`workers = 0`: one thread per two cores, at least one) unless WORKERS says.
start_dev bench "${WORKERS:-0}"
BOUNCER_PID=""
TCP_PID=""
# Tenant 7 lives on shard 1, whose cluster listens on SHARD_PORT.
pgbench -p "$SHARD_PORT" -i -q -s "$SCALE" >/dev/null 2>&1
if [ "${TLS:-0}" = 1 ]; then
  enable_shard_tls "$STATE/shard1" "$SHARD_PORT"
  # Set up before the runs: libpq then fails any connection the target cannot encrypt.
  export PGSSLMODE=require
fi

TARGETS="direct pgtenant"
HAVE_BOUNCER=0
if [ "${PGBOUNCER:-1}" != 0 ] && command -v pgbouncer >/dev/null 2>&1; then
  HAVE_BOUNCER=1
  start_bouncer bouncer "$BOUNCER_PORT" "$STATE/shard1"
  MAIN_BOUNCER_PID=$BOUNCER_PID
  TARGETS="$TARGETS pgbouncer"
fi

if [ "${TCP_SERVERS:-0}" = 1 ]; then
  # The configuration dev wrote, with the demo layout in the file (instead of the
  # catalog) and the shards reached over loopback TCP.
  dev_config_on "$TCP_PROXY_PORT" >"$STATE/tcp.toml"
  python3 - "$STATE" "${WORKERS:-0}" "$SHARD_PORT" <<'PY'
import re, sys
state, workers, shard_port = sys.argv[1:]
text = open(f"{state}/tcp.toml").read()
text = re.sub(r"workers = \d+", f"workers = {workers}", text, count=1)
text = re.sub(r"^(shards|ranges|tenant_map) = \[\]\n", "", text, flags=re.M)
text = re.sub(r"\n\[catalog\]\n(?:[^\[\n].*\n)*", "\n", text)
for shard in (1, 2):
    text += (f'\n[[shards]]\nid = {shard}\n[[shards.nodes]]\nhost = "127.0.0.1"\n'
             f'port = {int(shard_port) + shard - 1}\nrole = "primary"\n')
text += '\n[[ranges]]\nmin = 1\nmax = 1000\nshard = 1\n\n[[ranges]]\nmin = 1001\nmax = 2000\nshard = 2\n'
text += '\n[[tenant_map]]\ntenant = 42\nshard = 2\n'
open(f"{state}/tcp.toml", "w").write(text)
PY
  apart "$BIN" serve --config "$STATE/tcp.toml" >"$STATE/tcp.log" 2>&1 &
  TCP_PID=$!
  stop_on_exit "$TCP_PID"
  wait_for_port "$TCP_PROXY_PORT" || { echo "pgtenant-tcp did not start:" >&2; cat "$STATE/tcp.log" >&2; exit 1; }
  TARGETS="$TARGETS pgtenant-tcp"
  if [ "$HAVE_BOUNCER" = 1 ]; then
    # The same comparison for PgBouncer: shard 1 over loopback TCP.
    start_bouncer bouncer-tcp "$TCP_BOUNCER_PORT" 127.0.0.1
    TCP_BOUNCER_PID=$BOUNCER_PID
    TARGETS="$TARGETS pgbouncer-tcp"
  fi
fi

if [ -n "${VARIANT:-}" ]; then
  VARIANT_PORT=${VARIANT_PORT:-6582}
  serve_variant "$VARIANT_PORT" "${VARIANT%% *}" "$VARIANT"
  VARIANT_PID=$!
  TARGETS="$TARGETS pgtenant-variant"
fi

TICKS=$(getconf CLK_TCK)
CORES=$(nproc)
SHARD_POSTMASTER=$(head -1 "$STATE/shard1/postmaster.pid")
# cluster_ticks: CPU ticks of shard 1's cluster so far: the postmaster, the children it
# has reaped (backends of connections that closed), and those still running.
cluster_ticks() {
  local total
  total=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$SHARD_POSTMASTER/stat")
  for child in $(pgrep -P "$SHARD_POSTMASTER"); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$child/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
# per_tx_us TICKS TRANSACTIONS: CPU ticks as microseconds per transaction.
per_tx_us() { awk -v d="$1" -v t="$TICKS" -v n="$2" 'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }'; }
RESULTS="$STATE/results"
: >"$RESULTS"

# workload_args WORKLOAD: pgbench's arguments for it.
workload_args() {
  case $1 in
    select) echo "-S" ;;
    tpcb) echo "-b tpcb-like" ;;
    insert) echo "-f bench/insert.sql" ;; # one autocommit INSERT ... RETURNING
    connect) echo "-S -C" ;;
    *) echo "unknown workload $1" >&2; exit 1 ;;
  esac
}

run() { # target mode clients workload
  local port=$SHARD_PORT opts="" pid=$PROXY_PID
  case $1 in
    pgtenant) port=$PROXY_PORT; opts="-c pgtenant.tenant_id=7" ;;
    pgbouncer) port=$BOUNCER_PORT; pid=$MAIN_BOUNCER_PID ;;
    pgbouncer-tcp) port=$TCP_BOUNCER_PORT; pid=$TCP_BOUNCER_PID ;;
    pgtenant-tcp) port=$TCP_PROXY_PORT; pid=$TCP_PID; opts="-c pgtenant.tenant_id=7" ;;
    pgtenant-variant) port=$VARIANT_PORT; pid=$VARIANT_PID; opts="-c pgtenant.tenant_id=7" ;;
  esac
  local jobs=$(( $3 < 2 ? 1 : ${BENCH_JOBS:-2} ))
  # The CPU of the proxy, of shard 1's cluster and of pgbench, over the steady part of
  # the run (see pgbench_steady): logins are not part of the transactions' cost.
  window_sample() { echo "$(cpu_ticks "$pid") $(cluster_ticks) $(cpu_ticks "$PGBENCH_PID")"; }
  # shellcheck disable=SC2046 # the workload's arguments, split on purpose
  PGOPTIONS="$opts" pgbench_steady "$STATE/pgbench-out" "$SECONDS_PER_RUN" -p "$port" $(workload_args "$4") \
    -M "$2" -c "$3" -j "$jobs" -n
  local out
  out=$(cat "$STATE/pgbench-out")
  local tps lat
  tps=$(echo "$out" | awk '/^tps/ {print $3}')
  tps=${tps:-0}
  # An aborted run (e.g. PgBouncer 1.18 with -M prepared) counts as failed: 0 TPS.
  if echo "$out" | grep -q "Run was aborted"; then tps=0; fi
  lat=$(echo "$out" | awk '/latency average/ {print $4}')
  lat=${lat:-0}
  local -a before after
  read -r -a before <<<"$WINDOW_BEFORE"
  read -r -a after <<<"$WINDOW_AFTER"
  local cpu_us pg_us bench_us
  cpu_us=$(per_tx_us $((after[0] - before[0])) "$WINDOW_TX")
  [ "$1" = direct ] && cpu_us=0
  pg_us=$(per_tx_us $((after[1] - before[1])) "$WINDOW_TX")
  bench_us=$(per_tx_us $((after[2] - before[2])) "$WINDOW_TX")
  echo "$1 $2 $3 $tps $lat $cpu_us $pg_us $bench_us $4 $round" >>"$RESULTS"
}

for round in $(seq "$ROUNDS"); do
  # Rotate the order of the targets from round to round.
  order=$(echo $TARGETS | tr ' ' '\n' | awk -v r="$round" '{a[NR]=$0} END {for (i = 0; i < NR; i++) print a[(i + r) % NR + 1]}')
  for workload in $WORKLOADS; do
    for mode in $MODES; do
      for clients in $CLIENTS; do
        for target in $order; do run "$target" $mode $clients $workload; done
      done
    done
  done
  echo "round $round done" >&2
done

echo "clients connect $([ "${TLS:-0}" = 1 ] && echo "over TLS" || echo "without TLS"); pgtenant and pgbouncer reach PostgreSQL through its Unix socket$([ "${TCP_SERVERS:-0}" = 1 ] && echo ", the -tcp ones over loopback TCP"); pgtenant workers = ${WORKERS:-0}${VARIANT:+; pgtenant-variant: $VARIANT}"
scheduling_note
for workload in $WORKLOADS; do
for target in $(echo $TARGETS | cut -d' ' -f2-); do
  echo
  echo "workload $workload ($(workload_args $workload | sed "s|$STATE/||"))"
  printf "%-9s %7s | %12s %9s | %14s %9s %7s | %9s %9s %9s %9s %5s\n" mode clients "direct tps" "lat ms" "$target tps" "lat ms" ratio \
    "proxy us" "pg us" "pg dir us" "bench us" free
  for mode in $MODES; do
    for clients in $CLIENTS; do
      pick() { awk -v t="$1" -v m=$mode -v c=$clients -v f="$2" -v w=$workload '$1==t && $2==m && $3==c && $9==w {print $f}' "$RESULTS" | median; }
      d=$(pick direct 4); dl=$(pick direct 5); p=$(pick "$target" 4); pl=$(pick "$target" 5); cpu=$(pick "$target" 6)
      pg=$(pick "$target" 7); pg_direct=$(pick direct 7); bench=$(pick "$target" 8)
      ratio=$(awk -v p="$p" -v d="$d" 'BEGIN { printf "%.2f", p / d }')
      free=$(awk -v c="$CORES" -v pg="$pg" -v b="$bench" -v d="$d" 'BEGIN { printf "%.2f", (pg + b > 0 ? c * 1e6 / (pg + b) / d : 0) }')
      printf "%-9s %7s | %12.0f %9.3f | %14.0f %9.3f %7s | %9s %9s %9s %9s %5s\n" $mode $clients "$d" "$dl" "$p" "$pl" "$ratio" \
        "$cpu" "$pg" "$pg_direct" "$bench" "$free"
    done
  done
done
done
if [ "$HAVE_BOUNCER" = 1 ]; then
  # Like with like: pgtenant against PgBouncer, each through shard 1's socket. "per
  # round": the ratio of the two runs of each round (adjacent in time, so a slower spell
  # of the machine weighs on both), its median and its range over the rounds; "cpu":
  # the same for the proxies' CPU per transaction (below 1: pgtenant spends less).
  echo
  printf "%-9s %-9s %7s | %12s %12s %7s | %9s %9s | %-22s %5s\n" workload mode clients "pgtenant tps" "pgbouncer tps" ratio \
    "pgt us" "pgb us" "per round [range]" cpu
  for workload in $WORKLOADS; do
    for mode in $MODES; do
      for clients in $CLIENTS; do
        pick() { awk -v t="$1" -v m=$mode -v c=$clients -v f="$2" -v w=$workload '$1==t && $2==m && $3==c && $9==w {print $f}' "$RESULTS" | median; }
        # paired FIELD: pgtenant's FIELD over PgBouncer's, one ratio per round.
        paired() {
          awk -v m=$mode -v c=$clients -v f="$1" -v w=$workload '$2==m && $3==c && $9==w {
              if ($1 == "pgtenant") p[$10] = $f; else if ($1 == "pgbouncer") b[$10] = $f }
            END { for (r in p) if ((r in b) && b[r] > 0) printf "%.3f\n", p[r] / b[r] }' "$RESULTS"
        }
        p=$(pick pgtenant 4); b=$(pick pgbouncer 4)
        tps_rounds=$(paired 4 | sort -g)
        range=$(echo "$tps_rounds" | awk 'NF { a[++n] = $1 } END { if (n) printf "[%.2f-%.2f]", a[1], a[n] }')
        printf "%-9s %-9s %7s | %12.0f %12.0f %7s | %9s %9s | %-22s %5s\n" $workload $mode $clients "$p" "$b" \
          "$(awk -v p="$p" -v b="$b" 'BEGIN { printf "%.2f", (b > 0 ? p / b : 0) }')" "$(pick pgtenant 6)" "$(pick pgbouncer 6)" \
          "$(echo "$tps_rounds" | median | xargs printf "%.2f") $range" "$(paired 6 | median | xargs printf "%.2f")"
      done
    done
  done
fi
