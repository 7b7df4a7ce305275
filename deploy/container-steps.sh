#!/usr/bin/env bash
# The container image's build steps, as a script: deploy/Dockerfile runs it, and CI
# runs it too (deploy/check.sh), so that the image's recipe cannot rot unnoticed on
# machines without a container engine.
#
#   deploy/container-steps.sh build OUT   # release binary + default config under OUT
#   deploy/container-steps.sh user        # the unprivileged runtime user (as root, in the image)
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  build)
    out=${2:?usage: container-steps.sh build OUT}
    # The dist profile with the recorded profile (deploy/build-dist.sh): the fast binary.
    deploy/build-dist.sh --locked --bin pgtenant
    target=${CARGO_TARGET_DIR:-target}
    install -D -m 0755 "$target/dist/pgtenant" "$out/usr/local/bin/pgtenant"
    # The shipped configuration, listening on every interface inside the container
    # (and serving /healthz, /readyz and /metrics on 9930).
    install -d "$out/etc/pgtenant"
    sed -e 's/^listen = "127.0.0.1:6432"/listen = "0.0.0.0:6432"/' \
        -e 's/^# listen = "127.0.0.1:9930"/listen = "0.0.0.0:9930"/' \
        config/pgtenant.toml >"$out/etc/pgtenant/pgtenant.toml"
    "$out/usr/local/bin/pgtenant" --version
    "$out/usr/local/bin/pgtenant" check-config "$out/etc/pgtenant/pgtenant.toml"
    ;;
  user)
    groupadd --system --gid 10001 pgtenant
    useradd --system --uid 10001 --gid pgtenant --home-dir /nonexistent --shell /usr/sbin/nologin pgtenant
    ;;
  *)
    echo "usage: container-steps.sh build OUT | user" >&2
    exit 2
    ;;
esac
