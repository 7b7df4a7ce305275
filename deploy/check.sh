#!/usr/bin/env bash
# CI's check of deploy/ on a machine without a container engine or a cluster:
#   - the image's build steps (deploy/container-steps.sh, which the Dockerfile runs):
#     release build, install, --version, check-config of the image's configuration;
#   - the systemd unit: systemd-analyze verify (binary path pointed at that build);
#   - the Kubernetes manifests: schema check with kubernetes-validate (PyPI);
#   - the compose file: YAML, and every file it mounts or builds from exists.
# What it cannot run: docker build itself, a pod, a systemd boot; see docs/deploying.md.
set -euo pipefail
cd "$(dirname "$0")/.."

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
deploy/container-steps.sh build "$out" >/dev/null
echo "deploy: image steps ok ($("$out/usr/local/bin/pgtenant" --version))"

if command -v systemd-analyze >/dev/null 2>&1; then
  sed "s#/usr/local/bin/pgtenant#$out/usr/local/bin/pgtenant#g" deploy/systemd/pgtenant.service >"$out/pgtenant.service"
  # verify warns about what only a booted system has (the user pgtenant); errors fail.
  systemd-analyze verify "$out/pgtenant.service"
  echo "deploy: systemd unit verified"
else
  echo "deploy: systemd-analyze not installed: unit NOT verified"
fi

if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip install -q kubernetes-validate || python3 -m pip install -q --break-system-packages kubernetes-validate
fi
kubernetes-validate --strict deploy/kubernetes/*.yaml
echo "deploy: kubernetes manifests valid"

python3 - <<'PY'
import os, yaml
base = "deploy"
doc = yaml.safe_load(open(os.path.join(base, "compose.yaml")))
services = doc["services"]
for name in ["catalog", "shard1", "shard1-replica", "shard2", "shard2-replica", "pgtenant"]:
    assert name in services, name
for name, svc in services.items():
    for volume in svc.get("volumes", []):
        source = volume.split(":")[0]
        assert os.path.exists(os.path.join(base, source)), f"{name}: {source} is missing"
    build = svc.get("build")
    if build:
        assert os.path.exists(os.path.join(base, build["context"], build["dockerfile"])), name
print("deploy: compose file parses, its mounts and build context exist")
PY
