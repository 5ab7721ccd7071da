#!/usr/bin/env bash
# Checks streamnccl against one torch release, as a user of that release meets it: a fresh
# virtual environment with torch==VERSION from PyPI; streamnccl installed into it with
# `pip install --no-build-isolation .`; the smoke test (scripts/smoke.py, 2 ranks on CPU) and
# `python -m streamnccl`; then, with the test doubles built too, the tests that read torch
# internals (`pytest -m torch_internals`). Builds a copy of this checkout as it is, committed or
# not, so the checkout's own build is left alone.
# usage: bash scripts/check-torch.sh VERSION        (e.g. 2.11.0)
set -euo pipefail
version="${1:?usage: scripts/check-torch.sh VERSION (e.g. 2.11.0)}"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
step() { echo "check-torch $version: $*"; }

step "a fresh virtual environment with torch==$version"
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check "torch==$version" ninja wheel \
  "setuptools>=64" numpy tqdm pytest expecttest

mkdir "$work/src"
git -C "$root" ls-files -z --cached --others --exclude-standard |
  tar -C "$root" --null --files-from=- --ignore-failed-read -cf - 2>/dev/null |
  tar -C "$work/src" -xf -
cd "$work/src"

step "pip install --no-build-isolation ."
start=$(date +%s)
MAX_JOBS="${MAX_JOBS:-2}" "$py" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation .
step "built and installed in $(($(date +%s) - start)) s"
"$py" -c "import torch; assert torch.__version__.startswith('$version'), torch.__version__"

step "smoke test"
cd "$work"  # `import streamnccl` finds the installed package, not the checkout's
timeout 300 "$py" -m torch.distributed.run --nproc-per-node 2 "$work/src/scripts/smoke.py"
"$py" -m streamnccl

step "the tests that read torch internals, with the test doubles built"
cd "$work/src"
MAX_JOBS="${MAX_JOBS:-2}" STREAMNCCL_BUILD_TESTING=1 "$py" -m pip install --quiet \
  --disable-pip-version-check --no-build-isolation --no-deps .
"$py" -m pytest tests -m torch_internals -q -p no:cacheprovider
step "passed"
