#!/usr/bin/env bash
# The one command that runs every test: sets up (idempotent; seconds once done), lints, checks the
# committed diagrams against the model, runs the v1-line tests on real SGLang 0.5.12 objects (.venv12),
# then the whole pytest suite (model, checker, Hypothesis, the guard on real SGLang 0.5.23 objects, lint,
# replay).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check .
echo "test: specflip diagram --check"
.venv/bin/specflip diagram --check
echo "test: sglang 0.5.12 (v1 EAGLEWorker) on CPU, in .venv12"
bash scripts/setup-v1.sh
.venv12/bin/python -m pytest -p no:warnings tests/test_v1_switch.py
echo "test: pytest"
export SPECFLIP_SGLANG_0_5_16_SRC="$PWD/.cache/sglang-src/0.5.16"
PYTHONWARNINGS="ignore:builtin type swigvarlink:DeprecationWarning" .venv/bin/python -m pytest "$@"
