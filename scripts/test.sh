#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DYNTC_DATA="${DYNTC_DATA:-$(cd .. && pwd)/shared/datasets}"
exec .venv/bin/python -m pytest -q "$@"
