#!/usr/bin/env bash
# Checks streamnccl as a wheel: built with `python -m build --wheel --no-isolation` in a fresh
# virtual environment with torch==VERSION, installed into a second fresh one with the same
# torch, where the smoke test (scripts/smoke.py, 2 ranks on CPU) must pass. Prints the wheel and
# the size of its extension. Builds a copy of this checkout as it is, committed or not.
# usage: bash scripts/check-wheel.sh [VERSION]        (default: 2.15.0, setup.sh's)
set -euo pipefail
version="${1:-2.15.0}"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
step() { echo "check-wheel $version: $*"; }
fresh_venv() {
  python3 -m venv "$work/$1"
  "$work/$1/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$version" "${@:2}"
}

step "building the wheel"
fresh_venv build ninja wheel "setuptools>=64" build
mkdir "$work/src"
git -C "$root" ls-files -z --cached --others --exclude-standard |
  tar -C "$root" --null --files-from=- --ignore-failed-read -cf - 2>/dev/null |
  tar -C "$work/src" -xf -
(cd "$work/src" && MAX_JOBS="${MAX_JOBS:-2}" "$work/build/bin/python" -m build --wheel \
  --no-isolation --outdir "$work/dist" >"$work/build.log" 2>&1) || {
  tail -50 "$work/build.log"
  exit 1
}
wheel="$(ls "$work"/dist/*.whl)"
step "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
python3 -m zipfile -l "$wheel" | awk '/_C\./ {print "check-wheel: " $1 ": " $NF " bytes"}'

step "installing it into a fresh environment with the same torch"
fresh_venv run
"$work/run/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"
cd "$work"
"$work/run/bin/python" -m streamnccl
timeout 300 "$work/run/bin/python" -m torch.distributed.run --nproc-per-node 2 \
  "$root/scripts/smoke.py"
step "passed"
