#!/usr/bin/env bash
# Installs what streamnccl needs and builds it in place, into the project's own virtual
# environment .venv/ (or the interpreter PYTHON names, a user's own environment; see
# python-env.sh):
#   - torch: the environment's own is kept when streamnccl supports it (2.11 to 2.15, as
#     pyproject.toml declares); where there is none, torch 2.15.0 from PyPI (its Linux wheel is
#     the CUDA 13.2 build and brings NCCL 2.30). A torch outside the range is refused, with
#     the reason, and left as it is;
#   - the build tools ninja, wheel and setuptools;
#   - streamnccl itself, editable, built against that torch, with its dependencies (numpy:
#     torch's object collectives need it; tqdm: the bench's progress bar), the test extra
#     (pytest, ruff, expecttest) and the plot extra (matplotlib, for
#     `python -m streamnccl.bench --plot`), from pyproject.toml.
# With --testing, also the test doubles (streamnccl._testing), which the tests and the launch
# bench need; without it they are not built (and a stale build of them is removed).
# Safe to run again: installed packages are kept and only what changed is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh

DEFAULT_TORCH=2.15.0
testing=0
case "${1:-}" in
  "") ;;
  --testing) testing=1 ;;
  *) echo "usage: scripts/setup.sh [--testing]" >&2; exit 2 ;;
esac

pip_install() {
  "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"
}
if ! "$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
  pip_install "torch==$DEFAULT_TORCH"
fi
pip_install ninja wheel "setuptools>=64"
# setup.py refuses a torch outside the supported range; asked before pip could replace it.
"$PYTHON" setup.py --version >/dev/null
# No build isolation: an isolated build would fetch a second torch to compile against.
MAX_JOBS="${MAX_JOBS:-2}" STREAMNCCL_BUILD_TESTING="$testing" \
  pip_install --no-build-isolation -e ".[test,plot]"
"$PYTHON" -m streamnccl
