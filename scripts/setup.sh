#!/usr/bin/env bash
# Creates .venv (if missing) and installs dyntc with its pinned requirements, all extras included
# except `setfit` (a benchmark peer only: pip install -e '.[setfit]'); psycopg (the `postgres` extra, for
# postgresql:// model stores) comes pinned in requirements.lock.
# torch is installed first and alone so that no other package can pull a different build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.dyntc-installed
if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.lock
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  touch "$stamp"
fi
