#!/usr/bin/env bash
# Sets everything up, the test doubles included (see setup.sh), then runs the whole test suite.
# Extra arguments go to pytest: `bash scripts/test.sh -m "not slow"` is the quick tier.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh
bash scripts/setup.sh --testing
exec "$PYTHON" -m pytest tests "$@"
