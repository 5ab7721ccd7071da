#!/usr/bin/env bash
# What one GPU tells of the NCCL path, in one command, for a lent machine that has torch and
# the CUDA toolkit but no package registry (a session gets a few minutes of one):
#   1. scripts/gpu-check.sh: the build against the installed torch, then tests/gpu;
#   2. the bench against the built-in nccl, sync and async (`python -m streamnccl.bench`);
#   3. the DDP example through torchrun.
# Each step runs under its own time limit, so a hang costs that step alone, and writes its
# whole log to OUTDIR (first argument, default gpu-report/), also packed as OUTDIR.tgz; the
# console gets each step's verdict and summary lines. Without a GPU it says so and exits 0.
# Exits non-zero when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUTDIR="${1:-gpu-report}"
export PYTHONUNBUFFERED=1

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu-report: no CUDA device is visible to $PYTHON's torch: nothing to report"
  exit 0
fi
mkdir -p "$OUTDIR"
failed=0

# step NAME LIMIT_S SUMMARY_REGEX COMMAND...: runs COMMAND, its output to OUTDIR/NAME.log.
step() {
  local name=$1 limit=$2 summary=$3
  shift 3
  local started=$SECONDS rc=0
  timeout -k 5 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1 || rc=$?
  echo "=== $name: exit $rc after $((SECONDS - started)) s (log: $OUTDIR/$name.log)"
  grep -E "$summary" "$OUTDIR/$name.log" | tail -n 40
  [ "$rc" -eq 0 ] || failed=1
}

# A limit per test where pytest-timeout is installed (pytest refuses --timeout without it).
per_test=()
"$PYTHON" -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout 90)
step gpu-check 300 'PASSED|FAILED|ERROR|SKIPPED|passed|failed|Fatal|gpu-check:' \
  env PYTHON="$PYTHON" bash scripts/gpu-check.sh "${per_test[@]}"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
bench=(-m streamnccl.bench --device cuda --baseline nccl -b 8 -e 64M -f 8 -n 500 --rounds 10 -c)
step bench-sync 120 'ratio:|wrong' "$PYTHON" "${bench[@]}"
step bench-async 120 'ratio:|wrong' "$PYTHON" "${bench[@]}" --async
step ddp 120 'loss went down|identical|Error' \
  "$PYTHON" -m torch.distributed.run --nproc-per-node "$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')" \
  examples/ddp_train.py --steps 30
tar czf "$OUTDIR.tgz" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"
exit "$failed"
