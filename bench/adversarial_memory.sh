#!/usr/bin/env bash
# Benchmark (issue 30): the proxy's memory under one adversarial client. With
# `pgtenant dev` defaults, one psycopg client of tenant 7 sends
#   1. DISTINCT40 distinct ~40 KB statements, then DISTINCT400 distinct ~400 KB ones
#      (each of a new shape, all answered by PostgreSQL), and then
#   2. NAMED ~40 KB statements prepared under their own names and never closed
#      (psycopg with prepare=True and no limit on what it keeps prepared).
# The proxy's RSS is sampled every second; prints its peak in each phase and the
# start, the budgets it should stay under (parse_cache_bytes for the parse cache and
# for the shared statement registry, max_client_statement_bytes for the client's
# statements), and how the client's statements were answered (ok / SQLSTATE counts).
#
#   [DISTINCT40=2000] [DISTINCT400=100] [NAMED=1000] [WORKERS=0] bench/adversarial_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PROXY_PORT=${PROXY_PORT:-7032}
SHARD_PORT=${SHARD_PORT:-7042}

source bench/common.sh
start_dev memory "${WORKERS:-0}"

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$PROXY_PID/status"; }
echo "start $(rss_kb)" >"$STATE/rss"
(
  while [ -d "/proc/$PROXY_PID" ]; do
    echo "$(cat "$STATE/phase" 2>/dev/null || echo start) $(rss_kb)" >>"$STATE/rss"
    sleep 1
  done
) &
stop_on_exit $! TERM

PHASE_FILE="$STATE/phase" PORT="$PROXY_PORT" DISTINCT40=${DISTINCT40:-2000} DISTINCT400=${DISTINCT400:-100} \
  NAMED=${NAMED:-1000} python3 - <<'PY'
import collections, os, psycopg

def phase(name):
    with open(os.environ["PHASE_FILE"], "w") as f:
        f.write(name)

conn = psycopg.connect(host="127.0.0.1", port=os.environ["PORT"], user="app", password="app",
                       dbname="app", options="-c pgtenant.tenant_id=7", autocommit=True)
conn.prepared_max = None  # psycopg never closes what it prepared
outcomes = collections.Counter()

def run(sql, prepare):
    try:
        conn.execute(sql, prepare=prepare).fetchall()
        outcomes["ok"] += 1
    except psycopg.Error as e:
        outcomes[e.sqlstate or "no sqlstate"] += 1

def statement(n, size):
    # A new shape each time, about `size` bytes of it (identifiers, not literals,
    # which a shape replaces by placeholders); it compares the tenant column, so that
    # pgtenant parses it.
    alias = f"t_{n}"
    test = f" AND {alias}.id IS NOT NULL"
    head = f"SELECT count(*) FROM accounts AS {alias} WHERE {alias}.tenant_id = 7"
    return head + test * (size // len(test))

phase("distinct-40k")
for n in range(int(os.environ["DISTINCT40"])):
    run(statement(n, 40_000), False)
phase("distinct-400k")
for n in range(int(os.environ["DISTINCT400"])):
    run(statement(100_000 + n, 400_000), False)
phase("named-40k")
for n in range(int(os.environ["NAMED"])):
    run(statement(200_000 + n, 40_000), True)
phase("end")
print("client outcomes:", dict(outcomes))
PY
sleep 2
kill "$(jobs -p | tail -1)" 2>/dev/null || true
echo "budgets: parse cache 64 MiB (parse_cache_bytes), statement registry 64 MiB, this client's statements 16 MiB (max_client_statement_bytes)"
awk '{if ($2 > peak[$1]) peak[$1] = $2; if (!($1 in seen)) {order[++n] = $1; seen[$1] = 1}}
     END {for (i = 1; i <= n; i++) printf "%-14s peak RSS %7.1f MiB\n", order[i], peak[order[i]] / 1024}' "$STATE/rss"
