#!/usr/bin/env bash
# Seeds fuzz/corpus/ from real driver traffic: `pgtenant dev` with a recording relay
# (record_traffic.py) in front of it, through which psql, pgbench (simple, extended and
# prepared protocols), psycopg, asyncpg, node-postgres and pgJDBC run their checks
# (tests/drivers/); split_traffic.py then cuts the streams into the targets' inputs.
# The SQL corpus also gets every statement the integration tests send; the config
# corpus the shipped configuration files. Re-running only adds new inputs.
#
#   fuzz/seed_corpora.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PROXY_PORT=${PROXY_PORT:-7682}
RELAY_PORT=${RELAY_PORT:-7683}
SHARD_PORT=${SHARD_PORT:-7692}
source bench/common.sh
BIN=target/release/pgtenant
DEV_ARGS="--replicas 0 --http-port 0" start_dev seed 0
python3 fuzz/record_traffic.py "$RELAY_PORT" "$PROXY_PORT" "$STATE/recorded" &
stop_on_exit $! TERM
sleep 0.5
base="host=127.0.0.1 port=$RELAY_PORT user=app password=app dbname=app sslmode=disable"
psql -X -d "$base options='-c pgtenant.tenant_id=7'" -q >/dev/null <<'SQL' || true
SELECT shard_id FROM pgtenant_shard;
BEGIN; SELECT * FROM accounts WHERE tenant_id = 7 FOR UPDATE; UPDATE accounts SET balance = balance + 1 WHERE tenant_id = 7; COMMIT;
CREATE TEMP TABLE t (a int, b text); COPY t FROM STDIN;
1	one
2	two
\.
SELECT pgtenant.next_id(), pgtenant.decode_id(pgtenant.next_id());
SET pgtenant.tenant_id = 500; SHOW pgtenant.routing_version; RESET ALL;
PREPARE p(int) AS SELECT $1 + 1; EXECUTE p(41); DEALLOCATE p;
SELECT 1/0;
SQL
psql -X -d "$base" -q -c "SELECT name FROM accounts WHERE tenant_id = 1500 ORDER BY id LIMIT 1" >/dev/null || true
printf '\\set tid random(1, 2000)\nSELECT count(*) FROM accounts WHERE tenant_id = :tid;\nBEGIN;\nUPDATE accounts SET balance = balance WHERE tenant_id = :tid;\nEND;\n' >"$STATE/bench.sql"
for mode in simple extended prepared; do
  pgbench -n -M "$mode" -c 2 -t 20 -f "$STATE/bench.sql" "$base" >/dev/null 2>&1 || true
done
for check in psycopg_check.py asyncpg_check.py; do python3 "tests/drivers/$check" "$RELAY_PORT" >/dev/null 2>&1 || true; done
NODE_PATH="${PGTENANT_NODE_PATH:-$HOME/.cache/pgtenant-node/node_modules}" node tests/drivers/node_pg_check.js "$RELAY_PORT" >/dev/null 2>&1 || true
java -cp /usr/share/java/postgresql.jar tests/drivers/JdbcCheck.java "$RELAY_PORT" >/dev/null 2>&1 || true
psql -X -d "host=127.0.0.1 port=$RELAY_PORT user=admin password=admin dbname=pgtenant sslmode=disable" -q \
  -c "SHOW POOLS" -c "SELECT kind, count(*) FROM all_shards.accounts GROUP BY 1" >/dev/null 2>&1 || true
sleep 0.5
python3 fuzz/split_traffic.py "$STATE/recorded" fuzz/corpus
# Every SQL string literal the integration tests send.
python3 - <<'PY'
import hashlib, os, re
out = "fuzz/corpus/sql"
os.makedirs(out, exist_ok=True)
for name in os.listdir("tests/it"):
    if name.endswith(".rs"):
        text = open(os.path.join("tests/it", name), encoding="utf-8").read()
        for m in re.finditer(r'"((?:SELECT|INSERT|UPDATE|DELETE|WITH|BEGIN|SET|RESET|COPY|CREATE|DO|SHOW|PREPARE|EXECUTE|DISCARD|DECLARE|FETCH|LISTEN|select|insert|update|delete|with|set)\b(?:[^"\\]|\\.)*)"', text):
            data = m.group(1).encode().replace(b"\\n", b"\n")
            open(os.path.join(out, hashlib.sha1(data).hexdigest()[:16]), "wb").write(data)
            if "all_shards" in m.group(1):
                d = "fuzz/corpus/scatter_plan"
                os.makedirs(d, exist_ok=True)
                open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), "wb").write(data)
PY
mkdir -p fuzz/corpus/config
for f in config/*.toml deploy/compose/*.toml deploy/kubernetes/*.toml "$STATE/pgtenant.toml"; do
  [ -f "$f" ] && cp "$f" "fuzz/corpus/config/$(sha1sum "$f" | cut -c1-16)"
done
for t in fuzz/corpus/*; do echo "$(basename "$t"): $(ls "$t" | wc -l) inputs"; done
