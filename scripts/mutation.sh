#!/usr/bin/env bash
# Mutation testing (mutmut 3, the dev extras) of what must never stop checking (issue 51): the guard's checks
# (shim/guard/checks.py, shim/guard/core.py), the model's invariants (statemodel/invariants.py) and the checker's
# search (proofs/bfs.py). Each target runs against the tests that exercise it; mutmut runs, per mutant, only the
# selected tests that reach the mutated function, and stops at the first failure.
#
# NOT part of scripts/test.sh / CI: one target takes from minutes (checks.py) to hours (invariants.py, bfs.py: each
# mutant re-runs checker tests) on two cores. Run it by hand, nice'd, and record the score in docs/mutation.md.
#
#   bash scripts/mutation.sh [checks|core|invariants|bfs ...]     (default: all four, one after the other)
#   MUTATION_TESTS="tests/a.py tests/b.py" bash scripts/mutation.sh checks    (another test selection)
#   MUTATION_NAMES="name1 name2" bash scripts/mutation.sh core     (only these mutants of the target, e.g. a sample:
#                                                                   scripts/mutation-sample.py names every k-th)
#   One mutant at a time (mutmut's --max-children 1): the machine's cores are shared; MUTATION_JOBS=N for more.
#
# Results: mutants/ (git-ignored); `.venv/bin/mutmut results` lists the survivors, `.venv/bin/mutmut show NAME` one.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/mutmut ] || .venv/bin/pip install -q "mutmut>=3.8,<4"

# target -> (mutant name glob, test selection)
declare -A GLOB=(
  [checks]="shim.guard.checks.*"
  [core]="shim.guard.core.*"
  [invariants]="statemodel.invariants.*"
  [bfs]="proofs.bfs.*"
)
declare -A TESTS=(
  [checks]="tests/test_guard_checks.py tests/test_invariants.py tests/test_guard_hook_rejects.py"
  # every test file whose tests reach shim/guard/core.py in-process (coverage per test, 2026-12-06), without the two
  # tests of them that reach it only in a subprocess or not at all and take 7-10 s (the rest: 0.01-0.8 s each)
  [core]="tests/test_guard_hook_rejects.py tests/test_guard_sglang.py tests/test_guard_identity.py
          tests/test_guard_overlap.py tests/test_guard_prepared_reading.py tests/test_guard_slot_values.py
          tests/test_guard_tree_draft.py tests/test_guard_warn_mode.py tests/test_switch_retract.py
          tests/test_guard_clock.py tests/test_guard_step_observes.py tests/test_guard_step_reads.py
          tests/test_guard_overlap_reads.py
          --deselect tests/test_guard_warn_mode.py::test_sigterm_reports_the_held_back_findings_before_the_process_ends
          --deselect tests/test_guard_sglang.py::test_mode_off_registers_no_hook"
  # test_known_bad_violations.py holds each known-bad design's last violations (names, expected, actual, requests)
  [invariants]="tests/test_invariants.py tests/test_known_bad_violations.py tests/test_known_bad_coverage.py
                tests/test_guard_hook_rejects.py"
  # the checker's tests that reach the search and take under 2.6 s each under mutmut's tracing (from the stats of a run
  # with the whole of both files: 49 of 66 tests, 28 s of 523 s; docs/mutation.md compares the two selections)
  [bfs]="$(grep -v '^#' scripts/mutation-bfs-tests.txt | tr '\n' ' ')"
)

# tests that read the SGLang lines' sources (.cache/sglang-src, scripts/setup.sh) find them from mutants/ too
mkdir -p mutants
[ ! -e .cache ] || [ -e mutants/.cache ] || ln -s ../.cache mutants/.cache

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(checks core invariants bfs)
for target in "${targets[@]}"; do
  glob=${GLOB[$target]:?unknown target $target (checks, core, invariants, bfs)}
  selection=${MUTATION_TESTS:-${TESTS[$target]}}
  # the selection goes into pyproject's [tool.mutmut] for this run only (mutmut reads it from there)
  cp pyproject.toml .pyproject.toml.mutation-backup
  trap 'mv -f .pyproject.toml.mutation-backup pyproject.toml' EXIT
  python3 - "$selection" <<'EOF'
import json, re, sys
path = "pyproject.toml"
text = open(path).read()
args = sys.argv[1].split() + ["-m", "not slow"]
text = re.sub(r"^pytest_add_cli_args_test_selection = .*$", "pytest_add_cli_args_test_selection = " + json.dumps(args),
              text, flags=re.M)
open(path, "w").write(text)
EOF
  echo "mutation: $target ($glob) against: $selection"
  if [ -n "${MUTATION_NAMES:-}" ]; then
    # shellcheck disable=SC2086  # one argument per name
    nice .venv/bin/mutmut run --max-children "${MUTATION_JOBS:-1}" $MUTATION_NAMES || true
  else
    nice .venv/bin/mutmut run --max-children "${MUTATION_JOBS:-1}" "$glob" || true
  fi
  mv -f .pyproject.toml.mutation-backup pyproject.toml
  trap - EXIT
done
.venv/bin/mutmut results || true
