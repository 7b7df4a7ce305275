#!/usr/bin/env bash
# Records the profile that deploy/build-dist.sh builds the shipped binary with: builds
# an instrumented binary (its own target directory), runs pgbench's workloads through
# `pgtenant dev` with it (shipped defaults: transaction pooling, one worker per two
# cores), and merges what it counted into deploy/pgo/pgtenant.profdata.gz. Record again
# after large changes of the request paths: code changed since is built unguided.
#
# The workloads are what the proxy spends its time on: select-only, pgbench's TPC-B and
# bench/pgbench.sh's single-row INSERT (bench/insert.sql), in the simple, extended and
# prepared protocols, 8 clients; 100 clients; TLS to the clients; a new connection per
# transaction (SCRAM); the admin console and /metrics once. Paths none of them take
# (failover, tenant moves, scatter queries) are laid out as rarely run, as LLVM does for
# any cold code.
#
# Needs PostgreSQL and pgbench (as `pgtenant dev` and the benchmarks do) and
# llvm-profdata (`rustup component add llvm-tools`).
#
#   deploy/pgo/record.sh [seconds per workload = 4]
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_PER_RUN=${1:-4}
PROXY_PORT=${PROXY_PORT:-7432}
SHARD_PORT=${SHARD_PORT:-7442}
HTTP_PORT=${HTTP_PORT:-7439}
sysroot=$(rustc --print sysroot)
# Without llvm-tools the glob matches nothing: said below, not a silent exit of `set -e`.
profdata=$(ls "$sysroot"/lib/rustlib/*/bin/llvm-profdata 2>/dev/null | head -1 || true)
[ -x "$profdata" ] || { echo "llvm-profdata not found: rustup component add llvm-tools" >&2; exit 1; }

target="${CARGO_TARGET_DIR:-target}/pgo-record"
raw="$(mkdir -p "$target" && cd "$target" && pwd)/profraw"
rm -rf "$raw"
RUSTFLAGS="-Cprofile-generate=$raw" CARGO_TARGET_DIR="$target" cargo build --profile dist --bin pgtenant
# Only the proxy's own counts: the build scripts wrote theirs to the same directory.
rm -rf "$raw"

state=$(mktemp -d /tmp/pgtenant-pgo.XXXXXX)
chmod 755 "$state"
"$target/dist/pgtenant" dev --dir "$state" --port "$PROXY_PORT" --shard-port "$SHARD_PORT" \
  --http-port "$HTTP_PORT" >"$state/proxy.log" 2>&1 &
proxy=$!
trap 'kill -INT $proxy 2>/dev/null || true; wait $proxy 2>/dev/null || true; rm -rf "$state"' EXIT
export PGPASSWORD=app PGUSER=app PGDATABASE=app PGHOST=127.0.0.1 PGSSLMODE=disable
for _ in $(seq 300); do psql -p "$PROXY_PORT" -XAtc "select 1" >/dev/null 2>&1 && break; sleep 0.2; done
pgbench -p "$SHARD_PORT" -i -q -s 10 >/dev/null 2>&1
through() { # pgbench arguments...: a run through the proxy as tenant 7
  PGOPTIONS="-c pgtenant.tenant_id=7" pgbench -p "$PROXY_PORT" -j 2 -T "$SECONDS_PER_RUN" -n "$@" 2>&1 | grep -E '^tps' || true
}
for workload in "-S" "-b tpcb-like" "-f bench/insert.sql"; do
  for mode in simple extended prepared; do
    # shellcheck disable=SC2086 # the workload's arguments, split on purpose
    through $workload -M "$mode" -c 8
  done
done
through -S -c 100
PGSSLMODE=require through -S -c 8
PGSSLMODE=require through -f bench/insert.sql -M extended -c 8
through -S -C -c 4
psql "host=127.0.0.1 port=$PROXY_PORT user=admin password=admin dbname=pgtenant" -XAtc "SHOW POOLS" >/dev/null
curl -fsS "http://127.0.0.1:$HTTP_PORT/metrics" >/dev/null 2>&1 || true
# The counts are written when the proxy exits.
kill -INT $proxy
wait $proxy || true
"$profdata" merge --sparse -o "$state/pgtenant.profdata" "$raw"
gzip -9nc "$state/pgtenant.profdata" >deploy/pgo/pgtenant.profdata.gz
rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p' >deploy/pgo/llvm-major
echo "recorded deploy/pgo/pgtenant.profdata.gz ($(wc -c <deploy/pgo/pgtenant.profdata.gz) bytes, LLVM $(cat deploy/pgo/llvm-major))"
