#!/usr/bin/env bash
# The one command that runs every test: sets up (idempotent; seconds once done), lints, checks the
# committed diagrams against the model, then runs the whole pytest suite (model, checker, Hypothesis,
# the guard on real SGLang objects, lint, replay).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check .
if .venv/bin/python -c "import specflip.diagrams" 2>/dev/null; then
  echo "test: specflip diagram --check"
  .venv/bin/specflip diagram --check
fi
echo "test: pytest"
.venv/bin/python -m pytest "$@"
