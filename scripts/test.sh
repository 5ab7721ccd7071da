#!/usr/bin/env bash
# Sets everything up (see setup.sh), then runs the whole test suite. Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
bash scripts/setup.sh
exec "$PYTHON" -m pytest tests "$@"
