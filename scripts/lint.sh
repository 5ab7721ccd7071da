#!/usr/bin/env bash
# Style checks: ruff for Python, clang-format for C++ (configs at the top level). Run after
# setup.sh, which installs ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
"$PYTHON" -m ruff check python tests examples setup.py
"$PYTHON" -m ruff format --check python tests examples setup.py
if ! command -v clang-format >/dev/null; then
  apt-get install -y -qq clang-format >/dev/null
fi
find csrc -name '*.cpp' -o -name '*.hpp' | xargs clang-format --dry-run --Werror
