#!/usr/bin/env bash
# Benchmark of SQL-aware routing (issue 3): pgbench with a custom script whose
# statement carries `tenant_id = :tid`, 8 clients, in simple, extended and prepared
# mode, against
#   direct    shard 1, random tenants (no proxy at all),
#   direct-guc  prepared mode only: the same, each transaction also setting the tenant
#             GUC as pgtenant does when a server connection passes to another tenant (a
#             prepared set_config, in the same request before the statement): what that
#             switch costs PostgreSQL itself, compared with `direct`;
#   session   pgtenant with session tenant 7 (the script names that same tenant),
#   sql       pgtenant without a session tenant: every transaction routed by its SQL,
#             random tenants of shard 1 (1..=1000), so that only the routing differs
#             from `session`,
#   sql-both  the same with random tenants of both shards (1..=2000),
#   sql-1m    random tenants out of the million loaded into tenant_shard_map: mostly
#             cache misses, each a catalog query;
#   sql-noguc `sql` through a second pgtenant with set_tenant_guc = false: the cost of
#             routing alone, without the SET of the tenant GUC that a server connection
#             needs whenever it passes to another tenant;
#   mix-session, mix-sql  eight pgbench processes of one client each, client i on
#             tenant i (1..=8) throughout, by its session tenant or by SQL: many tenants
#             at once, where tenant-aware checkouts spare most GUC switches; mix-sql is
#             compared with mix-session;
# interleaved over several rounds. Prints median TPS, the ratios above, pgtenant's CPU per
# transaction and its memory, then the directory benchmark (resolution latency for
# cache misses and hits, memory per cached tenant).
#
#   [TARGETS="session sql ..."] bench/sql_routing.sh [rounds=3] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
PROXY_PORT=${PROXY_PORT:-6732}
SHARD_PORT=${SHARD_PORT:-6742}
CATALOG_PORT=$((SHARD_PORT + 2))
TENANTS_FROM=1000001
TENANTS_TO=2000000

cargo build --release --quiet --benches
source bench/common.sh
start_dev bench-sql 1
NOGUC_PORT=$((PROXY_PORT + 1))
sed -e "s/^listen = .*/listen = \"127.0.0.1:$NOGUC_PORT\"/" -e "s/^set_tenant_guc = .*/set_tenant_guc = false/" \
  -e "s/^workers = .*/workers = 1/" "$STATE/pgtenant.toml" >"$STATE/noguc.toml"
apart "$BIN" serve --config "$STATE/noguc.toml" >"$STATE/noguc.log" 2>&1 &
NOGUC_PID=$!
stop_on_exit "$NOGUC_PID"
wait_for_port "$NOGUC_PORT" || true

echo "loading $((TENANTS_TO - TENANTS_FROM + 1)) tenants into tenant_shard_map ..." >&2
psql -h 127.0.0.1 -p "$CATALOG_PORT" -U postgres -d pgtenant_catalog -Xq -c \
  "INSERT INTO pgtenant.tenant_shard_map (tenant_id, shard_id)
   SELECT g, 1 + g % 2 FROM generate_series($TENANTS_FROM, $TENANTS_TO) g ON CONFLICT DO NOTHING"

script() { printf '\\set tid %s\nSELECT count(*) FROM accounts WHERE tenant_id = :tid;\n' "$1" >"$STATE/$2.sql"; }
script 7 session
script "random(1, 1000)" sql
script "random(1, 2000)" sql-both
script "random($TENANTS_FROM, $TENANTS_TO)" sql-1m
cp "$STATE/sql.sql" "$STATE/sql-noguc.sql"
# direct-guc: a pipeline of the two statements with one Sync (prepared mode only: in
# the others pgbench would parse the set_config each time, which pgtenant does not).
printf '\\set tid random(1, 1000)\n\\startpipeline\n%s;\n%s\n\\endpipeline\n' \
  "SELECT WHERE pg_catalog.set_config('pgtenant.tenant_id', :tid::text, false) IS NULL" \
  "SELECT count(*) FROM accounts WHERE tenant_id = :tid;" >"$STATE/direct-guc.sql"

rss_mib() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
TICKS=$(getconf CLK_TCK)
RESULTS="$STATE/results"
: >"$RESULTS"
echo "pgtenant RSS before: $(rss_mib "$PROXY_PID") MiB" >"$STATE/memory"

cpu_per_tx() { # ticks transactions: microseconds of CPU per transaction
  awk -v d="$1" -v t="$TICKS" -v n="${2:-0}" 'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }'
}

run() { # target mode
  case $1 in mix-*) run_mix "$@"; return ;; esac
  local port=$PROXY_PORT opts="" script="$STATE/$1.sql" pid=$PROXY_PID
  case $1 in
    direct) port=$SHARD_PORT; script="$STATE/sql.sql" ;;
    direct-guc)
      [ "$2" = prepared ] || return 0
      port=$SHARD_PORT
      ;;
    session) opts="-c pgtenant.tenant_id=7" ;;
    sql-noguc) port=$NOGUC_PORT; pid=$NOGUC_PID ;;
  esac
  local before after out tps tx cpu
  before=$(cpu_ticks "$pid")
  out=$(PGOPTIONS="$opts" pgbench -p "$port" -M "$2" -c 8 -j 2 -T "$SECONDS_PER_RUN" -n -f "$script" 2>&1) || true
  after=$(cpu_ticks "$pid")
  tps=$(echo "$out" | awk '/^tps/ {print $3}')
  tx=$(echo "$out" | awk '/actually processed/ {split($6, a, "/"); print a[1]}')
  if echo "$out" | grep -q "Run was aborted"; then tps=0; echo "$out" | tail -3 >&2; fi
  cpu=$(cpu_per_tx $((after - before)) "$tx")
  case $1 in direct*) cpu=0 ;; esac
  echo "$1 $2 ${tps:-0} $cpu" >>"$RESULTS"
}

run_mix() { # target mode: eight one-client pgbench processes, client i on tenant i
  local before after i tps=0 tx=0 out pids=()
  before=$(cpu_ticks "$PROXY_PID")
  for i in $(seq 8); do
    local opts=""
    [ "$1" = mix-session ] && opts="-c pgtenant.tenant_id=$i"
    PGOPTIONS="$opts" pgbench -p "$PROXY_PORT" -M "$2" -c 1 -j 1 -T "$SECONDS_PER_RUN" -n \
      -f "$STATE/mix-$i.sql" >"$STATE/mix-out-$i" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  after=$(cpu_ticks "$PROXY_PID")
  for i in $(seq 8); do
    out=$(cat "$STATE/mix-out-$i")
    if echo "$out" | grep -q "Run was aborted"; then echo "$out" | tail -3 >&2; fi
    tps=$(echo "$out" | awk -v s="$tps" '/^tps/ {s += $3} END {print s + 0}')
    tx=$(echo "$out" | awk -v s="$tx" '/actually processed/ {split($6, a, "/"); s += a[1]} END {print s + 0}')
  done
  echo "$1 $2 $tps $(cpu_per_tx $((after - before)) "$tx")" >>"$RESULTS"
}

TARGETS=${TARGETS:-"direct direct-guc session sql sql-noguc sql-both sql-1m mix-session mix-sql"}
for round in $(seq "$ROUNDS"); do
  for mode in simple extended prepared; do
    for target in $TARGETS; do run "$target" "$mode"; done
  done
  echo "round $round done" >&2
done
echo "pgtenant RSS after: $(rss_mib "$PROXY_PID") MiB" >>"$STATE/memory"

echo
echo "ratio: to session; mix-sql to mix-session, direct-guc to direct"
printf "%-9s %-11s | %10s %8s | %10s\n" mode target tps "cpu us" "ratio"
for mode in simple extended prepared; do
  pick() { awk -v t="$1" -v m=$mode -v f="$2" '$1==t && $2==m {print $f}' "$RESULTS" | median; }
  for target in $TARGETS; do
    [ "$target" = direct-guc ] && [ $mode != prepared ] && continue
    s=$(pick session 3)
    [ "$target" = mix-sql ] && s=$(pick mix-session 3)
    [ "$target" = direct-guc ] && s=$(pick direct 3)
    t=$(pick $target 3)
    printf "%-9s %-11s | %10.0f %8s | %10s\n" $mode $target "$t" "$(pick $target 4)" \
      "$(awk -v a="$t" -v b="$s" 'BEGIN { printf "%.3f", a / b }')"
  done
done
cat "$STATE/memory"
echo
echo "directory (CatalogDirectory against the same catalog):"
cargo bench --quiet --bench directory -- "$CATALOG_PORT" pgtenant_catalog "$TENANTS_FROM" "$TENANTS_TO" 200000
