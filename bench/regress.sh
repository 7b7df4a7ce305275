#!/usr/bin/env bash
# PostgreSQL's own regression suite (`make installcheck`'s parallel schedule) run
# directly against a shard and then through pgtenant, in each pool mode; prints each
# run's passed and failed tests and the names of the failures, so that the two can be
# compared (each run's summary and differences are kept in RESULTS). One shard, a superuser login, no tenant (statements run on the default
# shard): the suite's own statements, as a client would send them.
#
#   bench/regress.sh PGSRC [POOL_MODES="transaction session"]
#
# PGSRC: a PostgreSQL source tree of the server's major version (its src/test/regress
# and contrib/spi; `apt-get source postgresql-15` gives one). Building the suite's C
# functions needs pg_config with the server headers (Debian: postgresql-server-dev-15).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:?PGSRC: a PostgreSQL source tree}
MODES=${POOL_MODES:-transaction session}
RESULTS=${RESULTS:-/tmp/pgtenant-regress-results}
PROXY_PORT=${PROXY_PORT:-7162}
SHARD_PORT=${SHARD_PORT:-7172}
REG=$SRC/src/test/regress
PGBIN=$(pg_config --bindir)
PG_REGRESS=$(dirname "$(pg_config --pgxs)")/../test/regress/pg_regress
# BIN: another build to run (the shipped `dist` one by default).
if [ -z "${BIN:-}" ]; then
  deploy/build-dist.sh --quiet --bin pgtenant
  BIN=${CARGO_TARGET_DIR:-target}/dist/pgtenant
fi
STATE=$(mktemp -d /tmp/pgtenant-regress.XXXXXX)
chmod 755 "$STATE"
PROXY_PID=""
stop() {
  [ -z "$PROXY_PID" ] || kill -INT "$PROXY_PID" 2>/dev/null || true
  as_server "$PGBIN/pg_ctl" -D "$STATE/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$STATE"
}
trap stop EXIT
# PostgreSQL refuses to run as root: the cluster runs as `postgres` then.
as_server() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# The suite's C functions (regress.so; autoinc and refint from contrib/spi), by PGXS.
mkdir -p "$STATE/lib" "$STATE/build"
cp "$REG/regress.c" "$STATE/build/"
printf 'MODULES = regress\nPG_CONFIG = pg_config\nPGXS := $(shell $(PG_CONFIG) --pgxs)\ninclude $(PGXS)\n' >"$STATE/build/Makefile"
make -s -C "$STATE/build" >/dev/null
cp -r "$SRC/contrib/spi" "$STATE/build/spi"
make -s -C "$STATE/build/spi" USE_PGXS=1 >/dev/null
cp "$STATE"/build/*.so "$STATE"/build/spi/*.so "$STATE/lib/"

chown -R postgres "$STATE" 2>/dev/null || true
as_server "$PGBIN/initdb" -D "$STATE/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
as_server "$PGBIN/pg_ctl" -D "$STATE/data" -l "$STATE/server.log" -w \
  -o "-p $SHARD_PORT -k $STATE -c max_connections=200 -c fsync=off" start >/dev/null

export PGHOST=127.0.0.1 PGUSER=postgres
fresh_database() {
  psql -X -q -p "$SHARD_PORT" -d postgres -c "DROP DATABASE IF EXISTS regression" -c "CREATE DATABASE regression TEMPLATE template0"
  # What pg_regress sets on a database it creates itself.
  psql -X -q -p "$SHARD_PORT" -d postgres -c "ALTER DATABASE regression SET lc_messages TO 'C'" \
    -c "ALTER DATABASE regression SET lc_monetary TO 'C'" -c "ALTER DATABASE regression SET lc_numeric TO 'C'" \
    -c "ALTER DATABASE regression SET lc_time TO 'C'" -c "ALTER DATABASE regression SET bytea_output TO 'hex'" \
    -c "ALTER DATABASE regression SET timezone_abbreviations TO 'Default'"
  # Roles a previous run left.
  for role in $(psql -X -At -p "$SHARD_PORT" -d postgres -c "SELECT rolname FROM pg_roles WHERE rolname LIKE 'regress%'"); do
    psql -X -q -p "$SHARD_PORT" -d postgres -c "DROP OWNED BY \"$role\" CASCADE" -c "DROP ROLE \"$role\"" 2>/dev/null || true
  done
}

# run NAME PORT: the parallel schedule against PORT; prints the counts and failures.
run() {
  local out="$STATE/out-$1"
  mkdir -p "$out"
  chown postgres "$out" 2>/dev/null || true
  fresh_database
  # As the server's user, so that the server may write the files the suite has it write
  # into the output directory (COPY ... TO a file).
  as_server env PGHOST=127.0.0.1 "$PG_REGRESS" --use-existing --host=127.0.0.1 --port="$2" --user=postgres --bindir="$PGBIN" \
    --inputdir="$REG" --outputdir="$out" --dlpath="$STATE/lib" --max-connections=20 \
    --schedule="$REG/parallel_schedule" >"$out/summary.txt" 2>&1 || true
  local failed passed
  failed=$(grep -cE '^(not ok|[[:space:]]*test .* \.\.\. FAILED|.* \.\.\. FAILED)' "$out/summary.txt" || true)
  passed=$(grep -cE '(\.\.\. ok|^ok )' "$out/summary.txt" || true)
  echo "$1: $passed passed, $failed failed"
  grep -E 'FAILED|^not ok' "$out/summary.txt" | sed 's/^/  /' || true
  # Kept for reading: the summary and the differences from the expected output.
  mkdir -p "$RESULTS/$1"
  cp "$out/summary.txt" "$RESULTS/$1/"
  [ ! -f "$out/regression.diffs" ] || cp "$out/regression.diffs" "$RESULTS/$1/"
}

run direct "$SHARD_PORT"
for mode in $MODES; do
  cat >"$STATE/pgtenant.toml" <<TOML
[proxy]
listen = "127.0.0.1:$PROXY_PORT"
pool_mode = "$mode"
no_tenant_policy = "default"
default_shard = 1
max_clients = 200

[[users]]
name = "postgres"
auth = "trust"
server_user = "postgres"
pool_size = 40
# The suite reads pg_locks and pg_stat_activity, as a DBA's login may.
see_other_sessions = true

[[shards]]
id = 1
[[shards.nodes]]
host = "127.0.0.1"
port = $SHARD_PORT
role = "primary"
TOML
  "$BIN" serve --config "$STATE/pgtenant.toml" >"$STATE/proxy-$mode.log" 2>&1 &
  PROXY_PID=$!
  for _ in $(seq 100); do psql -X -p "$PROXY_PORT" -d postgres -Atc "select 1" >/dev/null 2>&1 && break; sleep 0.2; done
  run "pgtenant-$mode" "$PROXY_PORT"
  kill -INT "$PROXY_PID"
  wait "$PROXY_PID" 2>/dev/null || true
  PROXY_PID=""
done
