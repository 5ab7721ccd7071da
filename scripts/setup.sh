#!/usr/bin/env bash
# Installs what streamnccl needs and builds it in place, into the project's own virtual
# environment .venv/ (or the interpreter PYTHON names; see python-env.sh):
#   - torch 2.11.0 from PyPI, whose Linux wheel is the CUDA 13.0 build and brings NCCL;
#   - the build tools ninja, wheel and setuptools;
#   - streamnccl itself, editable, with its dependencies (numpy: torch's object collectives
#     need it; tqdm: the bench's progress bar), the test extra (pytest, ruff, expecttest) and
#     the plot extra (matplotlib, for `python -m streamnccl.bench --plot`), from pyproject.toml.
# Safe to run again: installed packages are kept and only what changed is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh

pip_install() {
  "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"
}
pip_install "torch==2.11.0" ninja wheel "setuptools>=64"
# No build isolation: an isolated build would fetch a second torch to compile against.
MAX_JOBS="${MAX_JOBS:-2}" pip_install --no-build-isolation -e ".[test,plot]"
"$PYTHON" -m streamnccl
