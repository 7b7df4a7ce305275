#!/usr/bin/env bash
# Benchmark (issue 53): REBALANCE onto a newly added empty shard under writes.
# `pgtenant dev --shards 3 --replicas 0`; TENANTS tenants (half in shard 1's range, half
# in shard 2's; shard 3, the new one, holds none) with Zipf-skewed sizes (rows) and load:
# WARMUP_S seconds of reads through the proxy, tenant of rank r getting about 1/r of
# them, so that the per-tenant statistics weigh them. Then WRITERS psycopg clients write
# to every tenant in turn (each writer its share of the tenants) while `REBALANCE
# PARALLEL k` runs. Prints: the plan (moves, planned load per shard before and after),
# the time to balance, each moved tenant's longest gap between two acknowledged writes
# (goal <= 1 s), acknowledged writes missing from the tenant's shard afterwards (goal
# 0), the p99 of the other tenants' writes during the batch against before it; then the
# data-path cost of the per-tenant statistics: pgbench -S through dev's proxy against a
# second proxy with tenant_stats_top_k = 0, interleaved.
#
#   [TENANTS=300] [WRITERS=6] [WARMUP_S=10] [PARALLEL=2] bench/rebalance.sh [rounds=3] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECONDS_PER_RUN=${2:-5}
PROXY_PORT=${PROXY_PORT:-7832}
SHARD_PORT=${SHARD_PORT:-7842}
VARIANT_PORT=${VARIANT_PORT:-7852}
DEV_ARGS="--shards 3 --replicas 0"

source bench/common.sh
start_dev rebalance "${WORKERS:-0}"
for port in "$SHARD_PORT" $((SHARD_PORT + 1)) $((SHARD_PORT + 2)); do
  psql -h 127.0.0.1 -p "$port" -U postgres -d app -XAtq -c \
    "CREATE TABLE IF NOT EXISTS rb_orders (tenant_id bigint NOT NULL, id bigint NOT NULL, payload text,
       PRIMARY KEY (tenant_id, id)); GRANT ALL ON rb_orders TO app;"
done

PORT=$PROXY_PORT SHARD_PORT=$SHARD_PORT TENANTS=${TENANTS:-300} WRITERS=${WRITERS:-6} \
WARMUP_S=${WARMUP_S:-10} PARALLEL=${PARALLEL:-2} python3 - <<'PY'
import os, random, statistics, threading, time, psycopg

port, shard_port = os.environ["PORT"], int(os.environ["SHARD_PORT"])
n, writers, parallel = int(os.environ["TENANTS"]), int(os.environ["WRITERS"]), int(os.environ["PARALLEL"])
# Half in shard 1's range (1..1000), half in shard 2's (1001..2000); rank r = index + 1.
tenants = [100 + i for i in range(n // 2)] + [1100 + i for i in range(n - n // 2)]
random.seed(7)
rank = {t: r + 1 for r, t in enumerate(random.sample(tenants, len(tenants)))}
app = lambda tenant=None: psycopg.connect(
    f"host=127.0.0.1 port={port} user=app password=app dbname=app"
    + (f" options='-c pgtenant.tenant_id={tenant}'" if tenant else ""), autocommit=True)
console = psycopg.connect(f"host=127.0.0.1 port={port} user=admin password=admin dbname=pgtenant", autocommit=True)

# Sizes: rank r holds about 3000 / r rows (at least 5).
for t in tenants:
    shard = 1 if t < 1000 else 2
    with psycopg.connect(f"host=127.0.0.1 port={shard_port + shard - 1} user=postgres dbname=app", autocommit=True) as c:
        c.execute("INSERT INTO rb_orders SELECT %s, g, 'seed' FROM generate_series(1, %s) g ON CONFLICT DO NOTHING",
                  (t, max(5, 3000 // rank[t])))

# Load: reads, tenant of rank r picked with weight 1/r.
weights = [1 / rank[t] for t in tenants]
stop = threading.Event()
counted = {t: 0 for t in tenants}  # the reads each tenant got (the load it has)
def warm():
    c = app()
    while not stop.is_set():
        t = random.choices(tenants, weights)[0]
        c.execute(f"SET pgtenant.tenant_id = {t}")
        c.execute("SELECT count(*) FROM rb_orders WHERE tenant_id = %s", (t,))
        counted[t] += 1
threads = [threading.Thread(target=warm) for _ in range(4)]
for th in threads: th.start()
time.sleep(float(os.environ["WARMUP_S"]))
stop.set()
for th in threads: th.join()

plan = console.execute("REBALANCE PARALLEL %d DRY RUN" % parallel).fetchall()

# Writers: each its share of the tenants, in turn.
acked = {t: [] for t in tenants}
latency = []  # (time, seconds, tenant)
stop = threading.Event()
def write(k):
    c, i = app(), 0
    mine = tenants[k::writers]
    while not stop.is_set():
        for t in mine:
            if stop.is_set(): break
            i += 1
            wid = 10_000_000 + k * 1_000_000 + i
            began = time.monotonic()
            try:
                c.execute(f"SET pgtenant.tenant_id = {t}")
                c.execute("INSERT INTO rb_orders VALUES (%s, %s, 'live')", (t, wid))
                done = time.monotonic()
                acked[t].append((wid, done))
                latency.append((done, done - began, t))
            except psycopg.Error as e:
                time.sleep(0.01)
                if c.closed: c = app()
threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
for th in threads: th.start()
time.sleep(3)
started = time.monotonic()
rows = console.execute("REBALANCE PARALLEL %d" % parallel).fetchall()
batch = rows[0][0] if rows else None
state = "done"
while batch is not None:
    b = [r for r in console.execute("SHOW BATCHES").fetchall() if r[0] == batch][0]
    state = b[3]
    if state in ("done", "failed"):
        break
    time.sleep(0.5)
ended = time.monotonic()
time.sleep(2)
stop.set()
for th in threads: th.join()

moved = {r[2]: (r[3], r[4], r[5]) for r in rows}  # tenant -> (source, target, load)
# Each shard's load: the reads its tenants got in the warm-up (what the proxy counted
# for the heaviest tenant_stats_top_k of each shard; the plan weighed the rest as 1).
before = {1: 0, 2: 0, 3: 0}
for t in tenants:
    before[1 if t < 1000 else 2] += 1 + counted[t]
after = dict(before)
for t, (s, d, _) in moved.items():
    after[s] -= 1 + counted[t]; after[d] += 1 + counted[t]
print(f"plan: {len(rows)} moves of {n} tenants (PARALLEL {parallel}); batch {batch} {state} "
      f"in {ended - started:.1f} s")
print(f"  reads per shard in the warm-up: before {before} (max/min {max(before.values())}/{min(before.values())}), "
      f"after {after} (max/min {max(after.values())}/{min(after.values())})")
for t, (s, d, l) in sorted(moved.items(), key=lambda m: -m[1][2]):
    print(f"  tenant {t} (rank {rank[t]}, {max(5, 3000 // rank[t])} rows): shard {s} -> {d}, planned load {l}, counted {counted[t]}")
gaps = []
for t in moved:
    times = [d for _, d in acked[t] if started - 1 <= d <= ended + 1]
    gaps.append(max((b - a for a, b in zip(times, times[1:])), default=float("nan")))
if gaps:
    print(f"  moved tenants' longest write gap: median {statistics.median(gaps):.3f} s, max {max(gaps):.3f} s")
lost = 0
with app() as c:
    for t in tenants:
        c.execute(f"SET pgtenant.tenant_id = {t}")
        have = {r[0] for r in c.execute("SELECT id FROM rb_orders WHERE tenant_id = %s AND id >= 10000000", (t,))}
        lost += sum(1 for wid, _ in acked[t] if wid not in have)
print(f"  acknowledged writes: {sum(len(v) for v in acked.values())}, missing afterwards: {lost}")
def p99(xs): return sorted(xs)[int(len(xs) * 0.99)] * 1000 if xs else float("nan")
others_during = [s for (d, s, t) in latency if started <= d <= ended and t not in moved]
others_before = [s for (d, s, t) in latency if d < started]
print(f"  other tenants' write p99: {p99(others_during):.1f} ms during the batch, {p99(others_before):.1f} ms before")
PY

pgbench -p "$SHARD_PORT" -i -q -s 10 >/dev/null 2>&1
# A second proxy on the same shards with the per-tenant statistics off ([observe]).
dev_config_on "$VARIANT_PORT" | sed -e "s/^tenant_stats_top_k = .*/tenant_stats_top_k = 0/" >"$STATE/no-stats.toml"
apart "$BIN" serve --config "$STATE/no-stats.toml" >"$STATE/no-stats.log" 2>&1 &
stop_on_exit $! INT
wait_for_port "$VARIANT_PORT" || { echo "the proxy without statistics did not start" >&2; cat "$STATE/no-stats.log" >&2; exit 1; }
echo "select-only TPS, 8 clients, tenant 7: per-tenant statistics on (dev's proxy) / off (tenant_stats_top_k = 0)"
for round in $(seq "$ROUNDS"); do
  for target in "on:$PROXY_PORT" "off:$VARIANT_PORT"; do
    tps=$(PGOPTIONS="-c pgtenant.tenant_id=7" pgbench -p "${target#*:}" -n -S -c 8 -j 2 -T "$SECONDS_PER_RUN" 2>&1 \
      | awk '/^tps/ {print int($3)}')
    echo "  ${target%%:*} $tps"
  done
done
