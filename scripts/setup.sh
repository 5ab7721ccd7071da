#!/usr/bin/env bash
# Installs what streamnccl needs into the current Python (torch 2.11 from PyPI, the CUDA 13.0
# build, which brings NCCL) and builds the extension in place. Safe to run again: installed
# packages are kept and the build is redone only for what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

"$PYTHON" -m pip install --quiet --disable-pip-version-check \
  "torch==2.11.0" ninja wheel "setuptools>=64" pytest ruff
# No build isolation: an isolated build would fetch a second torch to compile against.
MAX_JOBS="${MAX_JOBS:-2}" "$PYTHON" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation -e .
"$PYTHON" -m streamnccl
