#!/usr/bin/env bash
# Installs dyntc into a fresh venv as a user would (torch==2.13.0 first and alone, then
# pip install '.[pretrained,serve]' from this tree) and runs the README's quick starts with it, as
# written: tests/test_readme.py with DYNTC_README_BIN pointing at that venv (pytest itself comes from
# $TEST_PYTHON, default the repository's .venv made by scripts/setup.sh). pip's own cache is reused
# between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
TEST_PYTHON=${TEST_PYTHON:-.venv/bin/python}
[ -x "$TEST_PYTHON" ] || bash scripts/setup.sh
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m venv "$work/venv"
pip=("$work/venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" '.[pretrained,serve]'
DYNTC_README_BIN="$work/venv/bin" "$TEST_PYTHON" -m pytest -q -p no:cacheprovider \
  "tests/test_readme.py::test_python_blocks_run[README.md]" "tests/test_readme.py::test_bash_blocks_run[README.md]"
