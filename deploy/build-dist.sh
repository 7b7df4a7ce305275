#!/usr/bin/env bash
# The shipped binary: `cargo build --profile dist` (whole-program LTO, one codegen unit;
# see Cargo.toml) guided by the profile in deploy/pgo/: profile-guided optimization,
# LLVM inlining and laying out the code by how often each path ran while pgbench
# workloads went through `pgtenant dev` (deploy/pgo/record.sh; docs/benchmarks.md
# "Build profiles" says what it gains). Code changed since the profile was recorded is
# optimized as it would be without one, so a stale profile costs speed, never
# correctness. The container image, the systemd recipe and the benchmarks build with it.
#
#   deploy/build-dist.sh [cargo build arguments]      # e.g. --locked --bin pgtenant
#
# PGO=0 builds without the profile. So does a rustc whose LLVM is older than the one
# that wrote it (it could not read it): the build says so on stderr and goes on.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
recorded=deploy/pgo/pgtenant.profdata.gz
if [ "${PGO:-1}" != 0 ] && [ -f "$recorded" ]; then
  wrote=$(cat deploy/pgo/llvm-major)
  have=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
  if [ "${have:-0}" -ge "$wrote" ]; then
    mkdir -p "$target"
    profile="$(cd "$target" && pwd)/pgtenant.profdata"
    # Replaced only when it changed: cargo rebuilds whatever a changed profile guides.
    gzip -dc "$recorded" >"$profile.new"
    if cmp -s "$profile.new" "$profile"; then rm "$profile.new"; else mv "$profile.new" "$profile"; fi
    # With the profile, LLVM also moves the blocks of a function that never ran into
    # a section of their own (machine function splitting), and the linker keeps the
    # hot, split and unlikely sections apart: the request path's code packs into
    # fewer cache lines (docs/benchmarks.md "Build profiles").
    split="-Cllvm-args=-enable-split-machine-functions -Clink-arg=-Wl,-z,keep-text-section-prefix"
    export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-Cprofile-use=$profile $split"
  else
    echo "build-dist: rustc's LLVM $have cannot read the profile of LLVM $wrote; building without it" >&2
  fi
fi
exec cargo build --profile dist "$@"
