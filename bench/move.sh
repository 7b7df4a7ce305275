#!/usr/bin/env bash
# Benchmark (issue 27): an online tenant move under a write load, through
# `pgtenant dev` (the `dist` build, the shipped defaults; no replicas).
#   - tenant 7 (shard 1) holds ROWS rows over three tables (move_a, move_b, move_c);
#     4 clients of tenant 7 insert into move_a in a loop, and 2 clients each of
#     tenants 500 (shard 1, the source) and 1500 (shard 2, the target);
#   - after 5 s, MOVE TENANT 7 TO SHARD 2; 3 s after the switch the clients stop;
#   - printed: copy time, the replication's lag before the cutover, the cutover's
#     pause (as the driver measured it, and as the tenant's clients saw it: the longest
#     gap between two acknowledged writes of one client), the other tenants' insert
#     latency (p50/p99) before and during the move, acknowledged writes missing on the
#     target (must be 0), client errors, and the CLEANUP time.
#
#   bench/move.sh [rows=1000000]
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${1:-1000000}
PROXY_PORT=${PROXY_PORT:-7652}
SHARD_PORT=${SHARD_PORT:-7662}

cargo build --release --quiet --example move_client
CLIENT=${CARGO_TARGET_DIR:-target}/release/examples/move_client
source bench/common.sh
DEV_ARGS="--replicas 0 --http-port 0" start_dev move 0

per_table=$((ROWS / 3))
for port in "$SHARD_PORT" $((SHARD_PORT + 1)); do
  psql -h 127.0.0.1 -p "$port" -U postgres -d app -Xq >/dev/null <<SQL
DROP TABLE IF EXISTS move_a, move_b, move_c;
CREATE TABLE move_a (tenant_id bigint NOT NULL, id bigint NOT NULL, payload text, PRIMARY KEY (tenant_id, id));
CREATE TABLE move_b (tenant_id bigint NOT NULL, id bigint NOT NULL, amount numeric(12, 2), at timestamptz DEFAULT now(), PRIMARY KEY (tenant_id, id));
CREATE TABLE move_c (tenant_id bigint NOT NULL, id bigint NOT NULL, tags text[], PRIMARY KEY (tenant_id, id));
ALTER TABLE move_a OWNER TO app; ALTER TABLE move_b OWNER TO app; ALTER TABLE move_c OWNER TO app;
SQL
done
psql -h 127.0.0.1 -p "$SHARD_PORT" -U postgres -d app -Xq >/dev/null <<SQL
INSERT INTO move_a SELECT 7, g, repeat('x', 100) FROM generate_series(1, $per_table) g;
INSERT INTO move_b SELECT 7, g, g / 100.0 FROM generate_series(1, $per_table) g;
INSERT INTO move_c SELECT 7, g, ARRAY['a', 'b', g::text] FROM generate_series(1, $per_table) g;
INSERT INTO move_a SELECT 500, g, 'other' FROM generate_series(1, 10000) g;
VACUUM ANALYZE move_a, move_b, move_c;
SQL
psql -h 127.0.0.1 -p $((SHARD_PORT + 1)) -U postgres -d app -Xq >/dev/null <<SQL
INSERT INTO move_a SELECT 1500, g, 'other' FROM generate_series(1, 10000) g;
VACUUM ANALYZE move_a, move_b, move_c;
SQL
echo "== tenant 7: $((per_table * 3)) rows in 3 tables, moved from shard 1 to shard 2 under writes"
"$CLIENT" "$PROXY_PORT" "host=127.0.0.1 port=$((SHARD_PORT + 1)) user=postgres dbname=app" 7 2 500 1500
