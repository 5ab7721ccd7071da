#!/usr/bin/env bash
# The NCCL path on a real GPU, in one command, on a machine that has torch and the CUDA
# toolkit but no package registry: builds streamnccl in place against the installed torch
# (installing nothing), reports the versions, then runs tests/gpu at world size 1 (NCCL
# refuses two ranks on one GPU). Without a GPU it says so and exits 0 at once.
# Extra arguments go to pytest. PYTHON=... picks the interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu-check: no CUDA device is visible to $PYTHON's torch: nothing to check here"
  echo "gpu-check: (the main suite still builds and checks the NCCL path without one)"
  exit 0
fi
"$PYTHON" -c 'import torch; print("gpu-check:", torch.__version__, torch.cuda.get_device_name(0))'
# With the test doubles: tests/gpu injects a fault through streamnccl._testing.
STREAMNCCL_BUILD_TESTING=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PYTHON" setup.py -q build_ext --inplace
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -m streamnccl
exec "$PYTHON" -m pytest tests/gpu -v -rs -p no:cacheprovider "$@"
