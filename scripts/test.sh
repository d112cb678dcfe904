#!/usr/bin/env bash
# The one command that runs every test: sets up (idempotent; seconds once done), lints, checks the
# committed diagrams against the model, checks the overlap designs and their committed proof reports, runs
# the v1-line tests on real SGLang 0.5.12 objects (.venv12), then the whole pytest suite (model, checker,
# Hypothesis, the guard on real SGLang 0.5.23 objects, lint, replay).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check .
echo "test: specflip diagram --check"
.venv/bin/specflip diagram --check
echo "test: the Mermaid diagrams parse with Mermaid's own parser (what GitHub renders)"
# node resolves the imports next to the script, so it runs from the folder npm installed into; the README's
# block is the same text as docs/diagrams/mode-level.mmd (specflip diagram --check holds them equal)
MERMAID=.cache/mermaid
if [ ! -d "$MERMAID/node_modules/mermaid" ]; then
  mkdir -p "$MERMAID"
  (cd "$MERMAID" && npm install --silent --no-audit --no-fund mermaid@11.17.2 jsdom@24.1.3 >/dev/null)
fi
cp scripts/check_mermaid.mjs "$MERMAID/"
node "$MERMAID/check_mermaid.mjs" docs/diagrams/*.mmd
# the default scope's reports are compared by tests/test_checker.py; the overlap scope (12 designs, about 2.2 minutes
# on two cores) once here, in its process pool: every design as expected and every committed report what it writes
echo "test: specflip check --overlap --check-reports"
.venv/bin/specflip check --overlap --check-reports
# a real-object test (marked sglang) that skips fails the run here (tests/real_objects_required.py)
export SPECFLIP_REQUIRE_SGLANG=1
echo "test: sglang 0.5.12 (v1 EAGLEWorker) on CPU, in .venv12"
bash scripts/setup-v1.sh
# ... and so does a v1-line test (marked sglang_v1) in this run, the one run where they must not skip
SPECFLIP_REQUIRE_SGLANG_V1=1 .venv12/bin/python -m pytest -p no:warnings tests/test_v1_switch.py tests/test_lint_v1.py \
  tests/test_keep_out_chunk_0_5_12.py
# every other SGLang line (scripts/sglang-lines.txt), each sglang --no-deps in its own folder beside .venv's torch:
# tests/test_release_conformance.py runs each on its own real objects in a subprocess, two at a time
bash scripts/setup-lines.sh
echo "test: pytest"
export SPECFLIP_SGLANG_0_5_16_SRC="$PWD/.cache/sglang-src/0.5.16"
PYTHONWARNINGS="ignore:builtin type swigvarlink:DeprecationWarning" .venv/bin/python -m pytest "$@"
