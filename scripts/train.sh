#!/usr/bin/env bash
# The main job: sets everything up (see setup.sh), then trains a small model with DDP on 2
# ranks over the streamnccl backend (on GPUs when there are at least 2, else on CPU).
# Extra arguments go to the example, e.g. `bash scripts/train.sh --steps 50`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
bash scripts/setup.sh
exec "$PYTHON" -m torch.distributed.run --nproc-per-node "${NPROC:-2}" \
  examples/ddp_train.py "$@"
