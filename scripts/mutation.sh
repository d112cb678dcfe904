#!/usr/bin/env bash
# Mutation testing (mutmut 3, the dev extras) of what must never stop checking (issue 51): the guard's checks
# (shim/guard/checks.py, shim/guard/core.py), the model's invariants (statemodel/invariants.py), the checker's
# search (proofs/bfs.py) and the adapters' checks (shim/releases/: whether the guard is installed and checks this
# server, the scope and design it checks against, the readings of sizes and buffers it and lint rely on). Each target
# runs against the tests that exercise it; mutmut runs, per mutant, only the selected tests that reach the mutated
# function, and stops at the first failure.
#
# NOT part of scripts/test.sh / CI: one target takes from minutes (checks.py) to hours (invariants.py, bfs.py: each
# mutant re-runs checker tests) on two cores. Run it by hand, nice'd, and record the score in docs/mutation.md.
#
#   bash scripts/mutation.sh [checks|core|invariants|bfs|releases ...]   (default: all five, one after the other)
#   MUTATION_TESTS="tests/a.py tests/b.py" bash scripts/mutation.sh checks    (another test selection)
#   MUTATION_NAMES="name1 name2" bash scripts/mutation.sh core     (only these mutants of the target, e.g. a sample:
#                                                                   scripts/mutation-sample.py names every k-th)
#   MUTATION_SAMPLE="K OFFSET" bash scripts/mutation.sh releases   (every K-th of the target's mutants from OFFSET,
#                                                                   in mutmut's order: scripts/mutation-sample.py)
#   One mutant at a time (mutmut's --max-children 1): the machine's cores are shared; MUTATION_JOBS=N for more.
#
# Results: mutants/ (git-ignored); `.venv/bin/mutmut results` lists the survivors, `.venv/bin/mutmut show NAME` one.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/mutmut ] || .venv/bin/pip install -q "mutmut>=3.8,<4"

# target -> (mutant name globs, test selection). A change of selection between two runs makes mutmut forget every
# result it holds (all targets): `mutmut results` lists the last run's target only.
declare -A GLOB=(
  [checks]="shim.guard.checks.*"
  [core]="shim.guard.core.*"
  [invariants]="statemodel.invariants.*"
  [bfs]="proofs.bfs.*"
  # the adapters' functions that decide something: the guard installed or not (hook targets), checking this server or
  # not (start-up, unsupported settings), against which scope and design; the worker kind and line of a release; the
  # host readings of sizes and buffers (tensor widths, row views, free-group queues, graph sizes, lint's widths).
  # Not shim/releases/base.py: mutmut's trampolines add attributes to its `Release` protocol, and a runtime-checkable
  # protocol then refuses every line (`registry._load`'s isinstance)
  [releases]="shim.releases.guard_hooks.xǁV2Adapterǁresolve__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁinstall__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁbefore_init_model_worker__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁscheduler_tp_rank__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁguard__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁunsupported_reason__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁreference_design__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁscope__mutmut_*
              shim.releases.guard_hooks.xǁV2Adapterǁruns_overlap_loop__mutmut_*
              shim.releases.guard_reading.x_tensor_width__mutmut_*
              shim.releases.guard_reading.x_host_ints__mutmut_*
              shim.releases.guard_reading.x_cuda_graph_runner_replay__mutmut_*
              shim.releases.guard_reading.x_sorted_capture_sizes__mutmut_*
              shim.releases.guard_reading.x_row_range__mutmut_*
              shim.releases.guard_reading.xǁ_GrowingNumelSumǁ__call____mutmut_*
              shim.releases.guard_reading.x_pending_free_slots__mutmut_*
              shim.releases.registry.x_base_line__mutmut_*
              shim.releases.registry.x_release_line__mutmut_*
              shim.releases.registry.x_worker_kind__mutmut_*
              shim.releases.v0_5_23.xǁAdapterǁreq_kv_lens__mutmut_*
              shim.releases.v0_5_23.xǁAdapterǁreq_row__mutmut_*
              shim.releases.v0_5_23.xǁAdapterǁtp_rank__mutmut_*
              shim.releases.v0_5_23.x__capture_bs__mutmut_*
              shim.releases.v0_5_23.x__logits_rows__mutmut_*
              shim.releases.v0_5_23.x_tokens_per_req__mutmut_*"
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
  # the test files that call those functions (grep, 2026-12-06), without the start-up test that reaches them only in a
  # scheduler subprocess and test_release_conformance.py (launches; minutes on two shared cores)
  # (not those that name the adapter method a finding is raised from: a mutated method's frame has mutmut's name)
  [releases]="tests/test_adapter_checks.py tests/test_guard_adapters.py tests/test_guard_start_up.py tests/test_releases.py
              tests/test_release_graph_for.py tests/test_lint.py tests/test_guard_sglang.py
              --deselect tests/test_guard_start_up.py::test_the_scheduler_process_ends_with_the_one_line_and_no_traceback"
)

# files mutated for one target only, beside [tool.mutmut] only_mutate (the other targets' tests must run on their plain
# copies: tests/test_guard_hook_rejects.py and others name the adapter method a finding is raised from, and a mutated
# method's frame has mutmut's name)
declare -A EXTRA_MUTATE=(
  [releases]="shim/releases/guard_hooks.py shim/releases/guard_reading.py shim/releases/registry.py
              shim/releases/v0_5_23.py"
)

# tests that read the SGLang lines' sources (.cache/sglang-src, scripts/setup.sh) find them from mutants/ too
mkdir -p mutants
[ ! -e .cache ] || [ -e mutants/.cache ] || ln -s ../.cache mutants/.cache

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(checks core invariants bfs releases)
for target in "${targets[@]}"; do
  glob=${GLOB[$target]:?unknown target $target (checks, core, invariants, bfs, releases)}
  selection=${MUTATION_TESTS:-${TESTS[$target]}}
  # the selection goes into pyproject's [tool.mutmut] for this run only (mutmut reads it from there)
  cp pyproject.toml .pyproject.toml.mutation-backup
  trap 'mv -f .pyproject.toml.mutation-backup pyproject.toml' EXIT
  # shellcheck disable=SC2116,SC2086  # one space between the names
  extra=$(echo ${EXTRA_MUTATE[$target]:-})
  # another target's extra files, mutated by an earlier run, back to plain copies (mutmut copies a missing source)
  for other in "${EXTRA_MUTATE[@]}"; do
    for f in $other; do
      [[ " $extra " == *" $f "* ]] || rm -f "mutants/$f" "mutants/$f.meta" "mutants/$f.spans"
    done
  done
  # this target's own extra files, left as plain copies by another target's run: mutmut mutates a missing source
  # anew (a plain copy without its .meta made scripts/mutation-sample.py find no mutants of it)
  for f in $extra; do
    [ -e "mutants/$f.meta" ] || rm -f "mutants/$f" "mutants/$f.spans"
  done
  python3 - "$selection" "$extra" <<'EOF'
import json, re, sys
path = "pyproject.toml"
text = open(path).read()
args = sys.argv[1].split() + ["-m", "not slow"]
text = re.sub(r"^pytest_add_cli_args_test_selection = .*$", "pytest_add_cli_args_test_selection = " + json.dumps(args),
              text, flags=re.M)
if sys.argv[2].split():
    text = re.sub(r"^(only_mutate = \[.*?)\]", lambda m: m.group(1) + ", " + ", ".join(json.dumps(f) for f in
                  sys.argv[2].split()) + "]", text, count=1, flags=re.M | re.S)
open(path, "w").write(text)
EOF
  if [ -n "${MUTATION_SAMPLE:-}" ]; then
    set -f
    # shellcheck disable=SC2086  # K, OFFSET and one argument per glob
    MUTATION_NAMES=$(.venv/bin/python scripts/mutation-sample.py --globs $MUTATION_SAMPLE $glob)
    set +f
    echo "mutation: $target, sample every ${MUTATION_SAMPLE% *}-th from ${MUTATION_SAMPLE#* }: $(wc -w <<<"$MUTATION_NAMES") mutants"
  fi
  echo "mutation: $target ($glob) against: $selection"
  if [ -n "${MUTATION_NAMES:-}" ]; then
    # shellcheck disable=SC2086  # one argument per name
    nice .venv/bin/mutmut run --max-children "${MUTATION_JOBS:-1}" $MUTATION_NAMES || true
  else
    set -f  # the globs are mutmut's, not the shell's
    # shellcheck disable=SC2086  # one argument per glob
    nice .venv/bin/mutmut run --max-children "${MUTATION_JOBS:-1}" $glob || true
    set +f
  fi
  mv -f .pyproject.toml.mutation-backup pyproject.toml
  trap - EXIT
done
.venv/bin/mutmut results || true
