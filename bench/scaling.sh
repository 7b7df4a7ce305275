#!/usr/bin/env bash
# Benchmark: how pgtenant scales with cores (issue 49), beside PgBouncer and direct.
# For each worker count in WORKER_SETS, bench/pgbench.sh runs pgtenant with that many
# tokio workers (`--workers`) and, interleaved with it on the same clusters, a second
# pgtenant with as many single-threaded runtimes (`thread_per_core = true`), PgBouncer
# (one thread, as always) and PostgreSQL directly, at each client count of CLIENTS
# (direct runs past shard 1's max_connections of 300 fail and print 0). Workloads:
# select-only and pgbench's TPC-B, simple protocol. pgbench gets a thread per two cores.
#
# Then one table: TPS per target by workers and clients, and pgtenant's (and its
# thread-per-core variant's) ratio to PgBouncer. The default `workers = 0` (one per
# two cores) is the row where workers = nproc / 2.
#
# Needs what bench/pgbench.sh needs (PostgreSQL's binaries, pgbench, pgbouncer, the
# `dist` build, which it makes). Each worker count starts its own clusters: a few minutes each.
#
#   [WORKER_SETS="1 2 4 8 16"] [CLIENTS="8 32 400 2000"] [WORKLOADS="select tpcb"] bench/scaling.sh [rounds=2] [seconds=10] [scale=10]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
SECONDS_PER_RUN=${2:-10}
SCALE=${3:-10}
CORES=$(nproc)
WORKER_SETS=${WORKER_SETS:-1 2 4 8 16}
CLIENTS=${CLIENTS:-8 32 400 2000}
WORKLOADS=${WORKLOADS:-select tpcb}
max_clients=$(echo $CLIENTS | tr ' ' '\n' | sort -n | tail -1)
# Each client takes a socket on the proxy and one in pgbench.
ulimit -n $((max_clients * 4 + 1024)) 2>/dev/null || echo "ulimit -n: $(ulimit -n); runs of $max_clients clients may fail" >&2

out=$(mktemp -d /tmp/pgtenant-scaling.XXXXXX)
for workers in $WORKER_SETS; do
  echo "workers = $workers: bench/pgbench.sh ..." >&2
  WORKERS=$workers VARIANT="thread_per_core = true" MODES=simple CLIENTS="$CLIENTS" WORKLOADS="$WORKLOADS" \
    BENCH_JOBS=$(( CORES / 2 > 1 ? CORES / 2 : 2 )) DEV_ARGS="--max-clients $((max_clients + 100))" \
    bench/pgbench.sh "$ROUNDS" "$SECONDS_PER_RUN" "$SCALE" >"$out/workers-$workers.txt"
done

echo "$CORES cores; $ROUNDS rounds of $SECONDS_PER_RUN s, median TPS; simple protocol; tpc = thread_per_core"
printf "%-8s %7s %7s | %9s %9s %9s %9s | %7s %7s\n" workload workers clients direct pgtenant tpc pgbouncer "pgt/pgb" "tpc/pgb"
for workers in $WORKER_SETS; do
  # The per-target tables of bench/pgbench.sh: "workload NAME" heads each, then rows
  # "simple CLIENTS | direct lat | TARGET tps ...".
  awk -v w="$workers" '
    /^workload / { workload = $2 }
    /^mode / { target = $9 }
    $1 == "simple" && $3 == "|" { direct[workload, $2] = $4; tps[workload, $2, target] = $7; seen[workload, $2] = 1 }
    END {
      for (key in seen) {
        split(key, k, SUBSEP)
        p = tps[k[1], k[2], "pgtenant"]; t = tps[k[1], k[2], "pgtenant-variant"]; b = tps[k[1], k[2], "pgbouncer"]
        printf "%-8s %7s %7s | %9.0f %9.0f %9.0f %9.0f | %7.2f %7.2f\n", k[1], w, k[2], direct[key], p, t, b,
          (b > 0 ? p / b : 0), (b > 0 ? t / b : 0)
      }
    }' "$out/workers-$workers.txt" | sort -k1,1 -k3,3n
done
echo "(each run's whole output, CPU per transaction included: $out)"
