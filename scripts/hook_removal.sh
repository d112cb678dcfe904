#!/usr/bin/env bash
# Each hook of tests/test_guard_hook_rejects.py made a pass-through in turn (tests/hook_removal_plugin.py): its case
# must fail. Not part of scripts/test.sh (one pytest process per hook: about 1-2 minutes each on two shared cores).
#   bash scripts/hook_removal.sh [method ...]     (default: every case's hook)
set -uo pipefail
cd "$(dirname "$0")/.."
hooks=("$@")
if [ ${#hooks[@]} -eq 0 ]; then
  mapfile -t hooks < <(.venv/bin/python - <<'PY'
import sys
sys.path[:0] = ["tests", "."]
import importlib
m = importlib.import_module("test_guard_hook_rejects")
print("\n".join(c.hook for c in m.CASES))
PY
)
fi
status=0
for hook in "${hooks[@]}"; do
  if H51_DISABLE_HOOK="$hook" PYTHONPATH=tests .venv/bin/python -m pytest -p hook_removal_plugin -q --no-header \
      -p no:warnings "tests/test_guard_hook_rejects.py::test_an_illegal_step_is_rejected_at_its_hook[$hook]" \
      >/dev/null 2>&1; then
    echo "hook removal: $hook removed and its case still passed"; status=1
  else
    echo "hook removal: $hook removed: its case fails"
  fi
done
exit $status
