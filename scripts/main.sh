#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the main job on its small default: the paper's dynamic
# protocol on the Twitter airline data (SENT), quick profile, CPU. Extra arguments go to `dyntc reproduce`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DYNTC_DATA="${DYNTC_DATA:-$(cd .. && pwd)/shared/datasets}"
exec .venv/bin/dyntc reproduce --dataset sent --profile quick --jobs "${DYNTC_JOBS:-2}" --out runs/sent-quick "$@"
