#!/usr/bin/env bash
# Benchmark (issue 56): a sidecar fleet on one catalog. `pgtenant dev --shards 2
# --replicas 0`, then for each N in FLEET (default "10 50 100"), N more proxies started
# with `pgtenant serve` on dev's catalog and shards, each small as a sidecar is (one
# worker thread, pool_size 2, /metrics on a port of its own); a little traffic through
# each (20 reads of its own tenant). Then, with the fleet idle, over MEASURE_S seconds:
#   - catalog connections (pg_stat_activity, application_name pgtenant-catalog),
#   - catalog CPU: what the catalog's backends used (% of one core),
#   - proxy_instance heartbeat writes a second (pg_stat_user_tables),
#   - server connections per shard opened by the fleet (user app),
# a routing change (tenant 42's map row flipped between the shards): how long each
# proxy took to apply it (each one's pgtenant_catalog_change_lag_seconds; p50, p99,
# max), and a tenant move's cutover pause (MOVE TENANT 77, 2000 rows, every proxy
# acknowledging the pause). The fleet is stopped before the next N. The dev proxy
# is one more proxy on the catalog throughout.
#
#   [FLEET="10 50 100"] [MEASURE_S=10] [MAX_CONNECTIONS=1000] bench/sidecars.sh
#
# The dev clusters allow 300 connections, enough for about 140 proxies (each holds 2
# catalog connections and 2 on its tenant's shard); MAX_CONNECTIONS raises it on the
# catalog and the shards (ALTER SYSTEM and a restart, before the fleet starts).
set -euo pipefail
cd "$(dirname "$0")/.."
PROXY_PORT=${PROXY_PORT:-7932}
SHARD_PORT=${SHARD_PORT:-7942}
FLEET_PORT=${FLEET_PORT:-20000}
DEV_ARGS="--shards 2 --replicas 0"

source bench/common.sh
start_dev sidecars 1
for port in "$SHARD_PORT" $((SHARD_PORT + 1)); do
  psql -h 127.0.0.1 -p "$port" -U postgres -d app -XAtq -c \
    "CREATE TABLE IF NOT EXISTS sc_orders (tenant_id bigint NOT NULL, id bigint NOT NULL, payload text,
       PRIMARY KEY (tenant_id, id)); GRANT ALL ON sc_orders TO app;"
done
psql -h 127.0.0.1 -p "$SHARD_PORT" -U postgres -d app -XAtq -c \
  "INSERT INTO sc_orders SELECT 77, g, 'seed' FROM generate_series(1, 2000) g ON CONFLICT DO NOTHING"
if [ -n "${MAX_CONNECTIONS:-}" ]; then
  PG_CTL="$(dirname "$(readlink -f "$(command -v initdb || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")/pg_ctl"
  for dir in shard1 shard2 catalog; do
    port=$(awk '/^port *=/ {print $3}' "$STATE/$dir/postgresql.conf" | tail -1)
    psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -XAtq -c "ALTER SYSTEM SET max_connections = $MAX_CONNECTIONS"
    owner=$(stat -c %U "$STATE/$dir")
    if [ "$owner" = "$(id -un)" ]; then "$PG_CTL" -D "$STATE/$dir" -w -m fast restart >/dev/null
    else runuser -u "$owner" -- "$PG_CTL" -D "$STATE/$dir" -w -m fast restart >/dev/null; fi
  done
  wait_for_port "$PROXY_PORT" 150
fi

# sidecar_config PORT: dev's configuration as a sidecar's.
sidecar_config() {
  python3 - "$STATE/pgtenant.toml" "$1" $(($1 + 10000)) <<'PY'
import sys
path, port, metrics = sys.argv[1], sys.argv[2], sys.argv[3]
section, out, observe_done = None, [], False
for line in open(path):
    s = line.strip()
    if s.startswith("["):
        if section == "observe" and not observe_done:
            out.append(f'listen = "127.0.0.1:{metrics}"\n'); observe_done = True
        section = s.strip("[]")
    elif section == "proxy" and s.startswith("listen ="):
        line = f'listen = "127.0.0.1:{port}"\n'
    elif section == "proxy" and s.startswith("workers ="):
        line = "workers = 1\n"
    elif section == "users" and s.startswith("pool_size ="):
        line = "pool_size = 2\n"
    elif section == "observe" and s.startswith("listen ="):
        line = f'listen = "127.0.0.1:{metrics}"\n'; observe_done = True
    out.append(line)
if section == "observe" and not observe_done:
    out.append(f'listen = "127.0.0.1:{metrics}"\n'); observe_done = True
if not observe_done:
    out.append(f'\n[observe]\nlisten = "127.0.0.1:{metrics}"\n')
sys.stdout.write("".join(out))
PY
}

echo "sidecars on one catalog: $(nproc) cores; the dev proxy is one more on the catalog"
printf '%-6s %-9s %-10s %-11s %-14s %-26s %-10s\n' proxies catalog_c catalog_cpu heartbeats/s server_c/shard "follow p50/p99/max (ms)" pause_ms
for N in ${FLEET:-10 50 100}; do
  PIDS=()
  for i in $(seq 1 "$N"); do
    port=$((FLEET_PORT + i))
    sidecar_config "$port" >"$STATE/sidecar-$port.toml"
    "$BIN" serve --config "$STATE/sidecar-$port.toml" >"$STATE/sidecar-$port.log" 2>&1 &
    PIDS+=($!)
  done
  for i in $(seq 1 "$N"); do
    wait_for_port $((FLEET_PORT + i)) 150 || { echo "sidecar $i did not start:" >&2; cat "$STATE/sidecar-$((FLEET_PORT + i)).log" >&2; exit 1; }
  done
  N=$N FLEET_PORT=$FLEET_PORT PROXY_PORT=$PROXY_PORT SHARD_PORT=$SHARD_PORT CONFIG="$STATE/pgtenant.toml" \
  MEASURE_S=${MEASURE_S:-10} python3 - <<'PY'
import os, statistics, time, tomllib, urllib.request, psycopg

n, base, dev_port = int(os.environ["N"]), int(os.environ["FLEET_PORT"]), int(os.environ["PROXY_PORT"])
shard_ports = [int(os.environ["SHARD_PORT"]) + i for i in range(2)]
measure = float(os.environ["MEASURE_S"])
cat = tomllib.load(open(os.environ["CONFIG"], "rb"))["catalog"]
catalog = psycopg.connect(host=cat["host"], port=cat["port"], user="postgres", dbname=cat["dbname"], autocommit=True)
ports = [base + i for i in range(1, n + 1)]

# A little traffic through each: 20 reads of its own tenant (1..1000 live on shard 1,
# 1001..2000 on shard 2).
for i, port in enumerate(ports):
    tenant = 100 + i if i % 2 == 0 else 1100 + i
    with psycopg.connect(f"host=127.0.0.1 port={port} user=app password=app dbname=app "
                         f"options='-c pgtenant.tenant_id={tenant}'", autocommit=True) as c:
        for _ in range(20):
            c.execute("SELECT count(*) FROM sc_orders WHERE tenant_id = %s", (tenant,))

def one(sql, conn=catalog):
    return conn.execute(sql).fetchone()[0]

def catalog_backends():
    return [r[0] for r in catalog.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]

def ticks(pids):
    total = 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            pass
    return total

def heartbeat_writes():
    catalog.execute("SELECT pg_stat_clear_snapshot()")
    return one("SELECT n_tup_upd + n_tup_ins FROM pg_stat_user_tables WHERE relname = 'proxy_instance'")

time.sleep(2)
pids = catalog_backends()
t0, w0, c0 = time.monotonic(), heartbeat_writes(), ticks(pids)
time.sleep(measure)
t1, w1, c1 = time.monotonic(), heartbeat_writes(), ticks(pids)
hz = os.sysconf("SC_CLK_TCK")
cpu = 100.0 * (c1 - c0) / hz / (t1 - t0)
beats = (w1 - w0) / (t1 - t0)
connections = one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                  "AND application_name = 'pgtenant-catalog'")
per_shard = []
for p in shard_ports:
    with psycopg.connect(f"host=127.0.0.1 port={p} user=postgres dbname=app", autocommit=True) as s:
        per_shard.append(one("SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'", s))

# A routing change: tenant 42's map row to the other shard.
def metric(port, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port + 10000}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None
catalog.execute("UPDATE pgtenant.tenant_shard_map SET shard_id = 3 - shard_id WHERE tenant_id = 42")
version = one("SELECT version FROM pgtenant.routing_state")
deadline = time.monotonic() + 30
waiting = set(ports)
while waiting and time.monotonic() < deadline:
    waiting = {p for p in waiting if (metric(p, "pgtenant_routing_version") or 0) < version}
    time.sleep(0.05)
lags = sorted(1000 * (metric(p, "pgtenant_catalog_change_lag_seconds") or float("nan")) for p in ports)
q = lambda f: lags[min(len(lags) - 1, int(f * len(lags)))]
follow = f"{q(0.5):.1f}/{q(0.99):.1f}/{lags[-1]:.1f}" + (f" ({len(waiting)} late)" if waiting else "")

# A move's cutover pause, with every proxy acknowledging it; then cleaned up.
console = psycopg.connect(f"host=127.0.0.1 port={dev_port} user=admin password=admin dbname=pgtenant", autocommit=True)
source = one("SELECT pgtenant.shard_of(77)")
target = 3 - source
move_id = console.execute(f"MOVE TENANT 77 TO SHARD {target} DATABASE app").fetchone()[0]
pause = None
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    rows = [r for r in console.execute("SHOW MOVES").fetchall() if r[0] == move_id]
    cols = [d.name for d in console.execute("SHOW MOVES").description]
    row = dict(zip(cols, rows[0])) if rows else {}
    if row.get("phase") == "switched":
        pause = row.get("pause_ms")
        break
    if row.get("phase") == "rolled_back":
        pause = f"rolled back: {row.get('error')}"
        break
    time.sleep(0.2)
if pause is not None and not str(pause).startswith("rolled"):
    console.execute(f"CLEANUP MOVE {move_id}")
    while time.monotonic() < deadline:
        rows = [r for r in console.execute("SHOW MOVES").fetchall() if r[0] == move_id]
        if rows and "cleaned" in rows[0]:
            break
        time.sleep(0.2)
print(f"{n:<6} {connections:<9} {cpu:<11.1f} {beats:<12.1f} {'/'.join(map(str, per_shard)):<14} {follow:<26} {pause}")
PY
  kill -INT "${PIDS[@]}" 2>/dev/null || true
  wait "${PIDS[@]}" 2>/dev/null || true
done
