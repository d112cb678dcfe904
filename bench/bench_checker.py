"""Benchmark: the checker of a base commit and of this tree side by side, and its time to each known-bad bug next
to Hypothesis's.

    python bench/bench_checker.py [--base REV] [--jobs J] [--overlap] [--design NAME ...] [--repeat N]
                                  [--new REV] [--no-base] [--no-hypothesis] [--end-to-end-only] [--pre-issue-20]
                                  [--symmetry] [--walks N] [--json FILE]

Everything is measured in one run on this machine, side by side:

- base against this tree: the base commit's code (`git archive REV` into a temporary directory) and this tree's,
  each design checked in a fresh interpreter, base then new, design after design (so both see the same load);
  then `specflip check --no-reports --json --jobs J` end to end, base then new. States, transitions, verdict and
  trace length are compared; where they differ the base counted states by a coarser or finer key, which the
  docs state (docs/model.md, "What the checker counts").
- `--walks N`: also `specflip check --simulate N --jobs 1` (with `--overlap`, of the overlap designs) of base and
  new, interleaved for `--repeat` rounds (medians): the walks of every design, verdicts and counterexample lengths
  compared.
- `--pre-issue-20`: also the checker as it was before issue 20 (`check_before_issue_20`, a frozen copy kept here
  for this comparison only: it checks an edge only when it reaches a new state), on this tree's model.
- Hypothesis against the checker: time to each known-bad design's first counterexample, finding only (generate
  phase) and finding + shrinking (what Hypothesis reports by default), with a fixed seed per repeat; beside them
  the checker's random walks (`specflip check --simulate`, `proofs/simulation.py`) with the same seeds, finding
  only and finding + shrinking (`proofs/shrink.py`, what `--simulate` reports): both walk the model at random, so
  their ratio is what Hypothesis's own machinery costs; BFS's, what a proof of shortness costs. Last, a walk
  straight down BFS's shortest counterexample, no search (`straight_walk_cpu`): Hypothesis's finding over it bounds
  what any search of the model could reach at the model's cost a step.

Wall and CPU seconds are both reported: the machine is shared, so wall time is noisy; CPU time is what each
checker spent. `--symmetry` also counts the states of each shipped design by the dedup key with every batch's
request order canonicalised (the one symmetry of the model; docs/model.md, "No symmetry reduction"). `--new REV`
checks a commit's code as the new side, so that the tree may change while it runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import seed as hyp_seed  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from proofs.bfs import Result, TraceStep, check  # noqa: E402
from proofs.hypothesis_walk import ModelViolation, machine_for  # noqa: E402
from proofs.simulation import Walks, simulate  # noqa: E402
from specflip.cli_args import OneLineParser, positive_int  # noqa: E402
from statemodel.actions import Action  # noqa: E402
from statemodel.design import Design, Scope  # noqa: E402
from statemodel.designs import ALL_DESIGNS, KNOWN_BAD, OVERLAP_DESIGNS, overlap_scope  # noqa: E402
from statemodel.invariants import Violation  # noqa: E402
from statemodel.model import Model  # noqa: E402
from statemodel.state import State, Unprocessed  # noqa: E402


def check_before_issue_20(model: Model, max_states: int = 2_000_000) -> Result:
    """The checker before issue 20, for this comparison only: `if nxt in parent: continue` came before
    `check_step`, so an edge into a state seen before was never checked."""
    started, cpu_started = time.perf_counter(), time.process_time()
    parent: dict[State, tuple[State, Action] | None] = {}
    depth_of: dict[State, int] = {}
    queue: deque[State] = deque()
    sometimes = model.sometimes()
    reached = {s.name: False for s in sometimes}
    eventually = model.eventually()
    transitions = 0
    max_depth = 0

    def finish(violations: list[Violation], last: State | None, failed: tuple[str, ...] = (),
               complete: bool = True) -> Result:
        steps: list[TraceStep] = []
        cur = last
        while cur is not None and parent[cur] is not None:
            prev, action = parent[cur]  # type: ignore[misc]
            steps.append(TraceStep(0, action, cur))
            cur = prev
        trace = tuple(TraceStep(i + 1, s.action, s.state) for i, s in enumerate(reversed(steps)))
        return Result(
            design=model.design.name, states=len(parent), transitions=transitions, max_depth=max_depth,
            seconds=time.perf_counter() - started, complete=complete, violations=tuple(violations),
            trace=trace, initial=cur, sometimes_reached=reached, eventually_failed=failed, eventually_trace=(),
            invariants_checked=tuple(i.name for i in model.always()), cpu_seconds=time.process_time() - cpu_started,
        )

    for init in model.init_states():
        if init in parent:
            continue
        parent[init] = None
        depth_of[init] = 0
        bad = model.check_state(init)
        if bad:
            return finish(bad, init)
        queue.append(init)
    failed_eventually: list[str] = []
    while queue:
        state = queue.popleft()
        depth = depth_of[state]
        acts = model.actions(state)
        if not acts and not failed_eventually:
            failed_eventually = [e.name for e in eventually if not e.holds(state)]
        for action in acts:
            nxt = model.next_state(state, action)
            transitions += 1
            for s in sometimes:
                if not reached[s.name] and s.holds(state, action, nxt):
                    reached[s.name] = True
            if nxt in parent:
                continue
            parent[nxt] = (state, action)
            depth_of[nxt] = depth + 1
            max_depth = max(max_depth, depth + 1)
            bad = model.check_step(state, action, nxt)
            if bad:
                return finish(bad, nxt)
            queue.append(nxt)
            if len(parent) >= max_states:
                return finish([], None, complete=False)
    return finish([], None, tuple(failed_eventually))


def batch_order_canonical(state: State) -> State:
    """`state` with the requests of every batch (running, pending, launched, each unprocessed result) in id
    order: the model reads a batch as a set (every rule is per request; a verify's accepts go with its rids)."""
    def canonical(batch):  # noqa: ANN001, ANN202
        if batch is None or len(batch.rids) < 2 or list(batch.rids) == sorted(batch.rids):
            return batch
        return batch.replace(rids=tuple(sorted(batch.rids)))
    unprocessed = tuple(u if list(u.rids) == sorted(u.rids) else Unprocessed(tuple(sorted(u.rids)), u.steps,
                                                                                u.draft_extended)
                        for u in state.unprocessed)
    return state.replace(running=canonical(state.running), pending=canonical(state.pending),
                         launched=canonical(state.launched), unprocessed=unprocessed)


def count_up_to_batch_order(model: Model) -> int:
    """States of `model` as the checker counts them (`Model.dedup_key`), two states whose keys differ only in the
    order of a batch's requests counted once: what that symmetry reduction would save (docs/model.md)."""
    seen: set[object] = set()
    queue: deque[State] = deque()
    for init in model.init_states():
        key = model.dedup_key(batch_order_canonical(init))
        if key not in seen:
            seen.add(key)
            queue.append(init)
    while queue:
        state = queue.popleft()
        for action in model.actions(state):
            after = model.next_state(state, action)
            key = model.dedup_key(batch_order_canonical(after))
            if key not in seen:
                seen.add(key)
                queue.append(after)
    return len(seen)


def time_hypothesis(design: Design, seed: int, shrink: bool) -> tuple[float, float, int]:
    """Wall and CPU seconds until Hypothesis raised the design's first counterexample (finding only, or finding and
    shrinking it), and the steps of the one it reports; nan, nan, 0 if it found none."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    conf = settings(max_examples=20_000, stateful_step_count=80, deadline=None, database=None, phases=phases,
                    suppress_health_check=list(HealthCheck))
    machine = machine_for(design)
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        run_state_machine_as_test(hyp_seed(seed)(machine), settings=conf)
    except ModelViolation as exc:
        return time.perf_counter() - started, time.process_time() - cpu_started, len(exc.steps)
    return float("nan"), float("nan"), 0


def _summary(r: Result) -> tuple[str | None, int]:
    return (r.violations[0].invariant if r.violations else None), len(r.trace)


# run in a fresh interpreter with the code under test first on sys.path: one design, one JSON line
_ONE_DESIGN = """
import json, sys
from proofs.bfs import check
from statemodel.design import Scope
from statemodel.designs import ALL_DESIGNS, OVERLAP_DESIGNS, overlap_scope
from statemodel.model import Model
name, overlap, limit = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
design = {d.name: d for d in (OVERLAP_DESIGNS if overlap else ALL_DESIGNS)}[name]
r = check(Model(design, overlap_scope(design) if overlap else Scope()), max_states=limit)
print(json.dumps({"states": r.states, "transitions": r.transitions, "wall": r.seconds, "cpu": r.cpu_seconds,
                  "invariant": r.violations[0].invariant if r.violations else None, "steps": len(r.trace),
                  "complete": r.complete}))
"""


def source_tree(rev: str, into: Path) -> Path:
    """The files of commit `rev` of this repository, unpacked under `into` (no git worktree is made)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _env(code_root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code_root), "PYTHONHASHSEED": "0"}


def run_one(code_root: Path, design: str, overlap: bool, limit: int) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _ONE_DESIGN, design, "1" if overlap else "0", str(limit)],
                         cwd=code_root, env=_env(code_root), check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_cli(code_root: Path, overlap: bool, jobs: int | None, simulate: int | None = None
            ) -> tuple[float, float, list[dict[str, object]]]:
    """`specflip check --no-reports --json` of the code under `code_root` (with `simulate`: its random walks, that
    many per design): wall seconds, the checker's CPU seconds summed over designs, and the verdicts."""
    cmd = [sys.executable, "-m", "specflip.cli", "check", "--no-reports", "--json"]
    cmd += ["--overlap"] if overlap else []
    cmd += ["--jobs", str(jobs)] if jobs else []
    cmd += ["--simulate", str(simulate)] if simulate else []
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=code_root, env=_env(code_root), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"bench_checker: {code_root}: specflip check exited {done.returncode}: {done.stderr[-500:]}")
    designs = json.loads(done.stdout)["designs"]
    return wall, sum(d["cpu_seconds"] for d in designs), designs


def compare_with_base(base_root: Path, designs: list[Design], overlap: bool, limit: int, jobs: int | None,
                      figures: dict[str, object], end_to_end: bool = True, per_design: bool = True,
                      new_root: Path = ROOT) -> None:
    if per_design:
        compare_designs_with_base(base_root, designs, overlap, limit, figures, new_root)
    if end_to_end:
        compare_cli_with_base(base_root, overlap, jobs, figures, new_root)


def compare_designs_with_base(base_root: Path, designs: list[Design], overlap: bool, limit: int,
                              figures: dict[str, object], new_root: Path = ROOT) -> None:
    print(f"{'design':40s} {'states base':>11s} {'new':>9s} {'x':>5s} {'transitions base':>16s} {'new':>9s} | "
          f"{'CPU base':>8s} {'new':>7s} {'x':>5s} | {'wall base':>9s} {'new':>7s} | verdict (base = new)")
    rows = []
    for design in designs:
        base = run_one(base_root, design.name, overlap, limit)
        new = run_one(new_root, design.name, overlap, limit)
        same = (base["invariant"], base["steps"], base["complete"]) == (new["invariant"], new["steps"], new["complete"])
        rows.append({"design": design.name, "base": base, "new": new, "same_verdict": same})
        print(f"{design.name:40s} {base['states']:11,d} {new['states']:9,d} {base['states'] / new['states']:5.2f} "
              f"{base['transitions']:16,d} {new['transitions']:9,d} | {base['cpu']:8.2f} {new['cpu']:7.2f} "
              f"{base['cpu'] / max(new['cpu'], 1e-3):5.2f} | {base['wall']:9.2f} {new['wall']:7.2f} | "
              f"{new['invariant'] or 'no violation'} ({new['steps']} steps) {'same' if same else 'DIFFERS'}",
              flush=True)
    cpu_base = sum(r["base"]["cpu"] for r in rows)  # type: ignore[index]
    cpu_new = sum(r["new"]["cpu"] for r in rows)  # type: ignore[index]
    print(f"\nall {len(rows)} designs, one after another: CPU base {cpu_base:.1f} s, new {cpu_new:.1f} s "
          f"({cpu_base / cpu_new:.2f}x); verdicts "
          f"{'all the same' if all(r['same_verdict'] for r in rows) else 'DIFFER'}")
    figures["base_vs_new"] = rows


def _verdicts(designs: list[dict[str, object]]) -> dict[str, tuple[object, object, int]]:
    """Design name -> (verdict, invariant, counterexample length), from `specflip check --json`."""
    return {d["name"]: (d["verdict"], d["invariant"], len(d["trace"])) for d in designs}  # type: ignore[arg-type]


def compare_cli_with_base(base_root: Path, overlap: bool, jobs: int | None, figures: dict[str, object],
                          new_root: Path = ROOT) -> None:
    load = os.getloadavg()[0]
    base_wall, base_cpu, base_verdicts = run_cli(base_root, overlap, jobs)
    new_wall, new_cpu, new_verdicts = run_cli(new_root, overlap, jobs)
    # a base older than a design checks fewer designs: compare the verdicts of the designs both check
    base_by_name, new_by_name = _verdicts(base_verdicts), _verdicts(new_verdicts)
    common = [name for name in base_by_name if name in new_by_name]
    same = len(common) == len(base_by_name) and all(base_by_name[n] == new_by_name[n] for n in common)
    only_new = len(new_by_name) - len(common)
    print(f"`specflip check{' --overlap' if overlap else ''}` end to end (jobs {jobs or 'one per core'}): base "
          f"{base_wall:.1f} s wall / {base_cpu:.1f} s CPU, new {new_wall:.1f} s wall / {new_cpu:.1f} s CPU: "
          f"{base_wall / new_wall:.2f}x wall, {base_cpu / new_cpu:.2f}x CPU; verdicts "
          f"{'the same' if same else 'DIFFER'} on the {len(common)} designs both check"
          f"{f' ({only_new} more in new, not in base)' if only_new else ''} (load average {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after)\n",
          flush=True)
    figures["cli"] = {"base_wall": base_wall, "base_cpu": base_cpu, "new_wall": new_wall, "new_cpu": new_cpu,
                      "jobs": jobs or "cores", "same_verdicts": same, "designs_compared": len(common),
                      "designs_only_new": only_new, "load_before": load,
                      "load_after": os.getloadavg()[0]}


def compare_walks_with_base(base_root: Path, walks: int, rounds: int, overlap: bool, figures: dict[str, object],
                            new_root: Path = ROOT) -> None:
    """`specflip check --simulate WALKS --jobs 1` of base and new, interleaved for `rounds` rounds: the walks of
    every design (of the overlap scope with `overlap`), one process, so the CPU seconds compare (medians)."""
    runs: dict[str, list[tuple[float, float, list[dict[str, object]]]]] = {"base": [], "new": []}
    for _ in range(rounds):
        runs["base"].append(run_cli(base_root, overlap, 1, simulate=walks))
        runs["new"].append(run_cli(new_root, overlap, 1, simulate=walks))
    verdicts = {side: _verdicts(got[0][2]) for side, got in runs.items()}
    same = verdicts["base"] == verdicts["new"]
    cpu = {side: statistics.median(r[1] for r in got) for side, got in runs.items()}
    wall = {side: statistics.median(r[0] for r in got) for side, got in runs.items()}
    command = f"specflip check{' --overlap' if overlap else ''} --simulate {walks} --jobs 1"
    print(f"`{command}` ({len(verdicts['new'])} designs), the median of {rounds} "
          f"rounds, base and new interleaved: base {wall['base']:.1f} s wall / {cpu['base']:.1f} s CPU, new "
          f"{wall['new']:.1f} s wall / {cpu['new']:.1f} s CPU: {cpu['base'] / cpu['new']:.2f}x CPU; verdicts and "
          f"counterexample lengths {'the same' if same else 'DIFFER'}\n", flush=True)
    figures["walks_base_vs_new"] = {"walks": walks, "rounds": rounds, "base_cpu": cpu["base"], "new_cpu": cpu["new"],
                                    "base_wall": wall["base"], "new_wall": wall["new"], "same_verdicts": same}


def compare_with_pre_issue_20(designs: list[Design], scope_for, limit: int,  # noqa: ANN001
                              symmetry: bool, figures: dict[str, object]) -> None:
    print(f"{'design':32s} {'states before':>13s} {'after':>8s} {'x':>5s} {'transitions':>11s} | "
          f"{'before wall':>11s} {'cpu':>6s} | {'after wall':>10s} {'cpu':>6s} | verdict (before = after)")
    rows = []
    for design in designs:
        model = Model(design, scope_for(design))
        gc.collect()
        before = check_before_issue_20(model, limit)
        gc.collect()
        after = check(model, max_states=limit)
        same = _summary(before) == _summary(after)
        row = {"design": design.name, "kind": design.kind.value, "states": after.states,
               "states_before": before.states, "transitions": after.transitions,
               "before_seconds": before.seconds, "before_cpu_seconds": before.cpu_seconds,
               "after_seconds": after.seconds, "after_cpu_seconds": after.cpu_seconds,
               "invariant": _summary(after)[0], "trace_steps": _summary(after)[1], "same_verdict": same}
        if symmetry and not after.violations:
            row["states_up_to_batch_order"] = count_up_to_batch_order(model)
        rows.append(row)
        print(f"{design.name:32s} {before.states:13,d} {after.states:8,d} {before.states / after.states:5.2f} "
              f"{after.transitions:11,d} | {before.seconds:11.2f} "
              f"{before.cpu_seconds:6.2f} | {after.seconds:10.2f} {after.cpu_seconds:6.2f} | "
              f"{row['invariant'] or 'no violation'} ({row['trace_steps']} steps) {'same' if same else 'DIFFERS'}"
              + (f"; up to batch order: {row['states_up_to_batch_order']:,} states "
                 f"(x{after.states / row['states_up_to_batch_order']:.3f})" if "states_up_to_batch_order" in row
                 else ""), flush=True)
    figures["pre_issue_20"] = rows
    print()


def straight_walk_cpu(model: Model, initial: State, actions: list[Action], runs: int) -> float:
    """CPU seconds (median of `runs`) of a walk that goes straight down a known counterexample: no search, each step
    only what any search of the model pays for it (the enabled actions, the step, every invariant, the state's key;
    the initial states are asked for, and the model keeps them once built, as Hypothesis's machine builds them
    before its timer starts). A lower bound on the time any search of this model needs to find that bug."""
    times = []
    for _ in range(runs):
        started = time.process_time()
        model.init_states()
        state = initial
        for action in actions:
            if action not in model.actions(state):
                raise SystemExit(f"bench_checker: {action.describe()} is not enabled on the shortest counterexample")
            after = model.next_state(state, action)
            model.check_step(state, action, after)
            model.dedup_key(after)
            state = after
        times.append(time.process_time() - started)
    return statistics.median(times)


def compare_with_hypothesis(repeat: int, figures: dict[str, object]) -> None:
    """Time to each known-bad design's first counterexample, as each tool hands one over and finding alone: the
    checker's (BFS: a shortest one), its random walks' (`specflip check --simulate`: found, then shrunk) against
    Hypothesis finding one (its generate phase alone), and finding and shrinking one (what it reports by default).
    Like for like: the walks' finding against Hypothesis's finding, the walks' shrunk counterexample against
    Hypothesis's. CPU seconds are the comparison (the machine is shared); wall seconds are printed beside them. Last,
    a walk straight down BFS's shortest counterexample (`straight_walk_cpu`): Hypothesis's finding over it is the
    most that any search of this model, at this model's cost a step, could reach."""
    print(f"{'known-bad design':32s} {'BFS cpu':>8s} {'steps':>5s} | {'walk find':>9s} {'steps':>5s} "
          f"{'+shrink':>8s} {'steps':>5s} | {'Hyp find':>9s} {'+shrink':>8s} {'steps':>5s} | "
          f"{'find: Hyp/walk':>14s} {'shrunk: Hyp/walk':>16s} {'Hyp find/BFS':>12s} | {'straight':>8s} "
          f"{'Hyp find/straight':>17s} | wall: {'BFS':>6s} {'walk':>7s} {'find':>7s} {'+shrink':>8s}")
    rows = []
    for design in KNOWN_BAD:
        model = Model(design, Scope())
        bfs_runs = [check(model) for _ in range(repeat)]
        bfs = statistics.median(r.seconds for r in bfs_runs)
        bfs_cpu = statistics.median(r.cpu_seconds for r in bfs_runs)
        sims = [simulate(model, Walks(walks=100_000, seed=seed)) for seed in range(repeat)]
        if not all(s.result.violations for s in sims):
            raise SystemExit(f"bench_checker: the random walks found no counterexample of {design.name}")
        walk, walk_cpu = (statistics.median(s.result.seconds for s in sims),
                          statistics.median(s.result.cpu_seconds for s in sims))
        walk_find_cpu = statistics.median(s.result.cpu_seconds - s.shrink_cpu_seconds for s in sims)
        found_steps = statistics.median(s.found_steps for s in sims)
        walk_steps = statistics.median(len(s.result.trace) for s in sims)
        find = [time_hypothesis(design, seed, shrink=False) for seed in range(repeat)]
        shrunk = [time_hypothesis(design, seed, shrink=True) for seed in range(repeat)]
        find_s, find_cpu = statistics.median(t for t, _, _ in find), statistics.median(c for _, c, _ in find)
        shrink_s, shrink_cpu = statistics.median(t for t, _, _ in shrunk), statistics.median(c for _, c, _ in shrunk)
        steps = statistics.median(n for _, _, n in shrunk)
        straight = straight_walk_cpu(model, bfs_runs[0].initial, [t.action for t in bfs_runs[0].trace], 50 * repeat)
        print(f"{design.name:32s} {bfs_cpu:8.3f} {len(bfs_runs[0].trace):5d} | {walk_find_cpu:9.4f} {found_steps:5.0f} "
              f"{walk_cpu:8.4f} {walk_steps:5.0f} | {find_cpu:9.3f} {shrink_cpu:8.3f} {steps:5.0f} | "
              f"{find_cpu / walk_find_cpu:13.0f}x {shrink_cpu / walk_cpu:15.0f}x {find_cpu / bfs_cpu:11.1f}x | "
              f"{straight:8.5f} {find_cpu / straight:16.0f}x | wall: "
              f"{bfs:6.3f} {walk:7.4f} {find_s:7.3f} {shrink_s:8.3f}", flush=True)
        rows.append({
            "design": design.name, "bfs_seconds": bfs, "bfs_cpu_seconds": bfs_cpu, "bfs_steps": len(bfs_runs[0].trace),
            "walk_seconds": walk, "walk_cpu_seconds": walk_cpu, "walk_find_cpu_seconds": walk_find_cpu,
            "walk_found_steps": found_steps, "walk_steps": walk_steps,
            "hypothesis_find_seconds": find_s, "hypothesis_find_cpu_seconds": find_cpu,
            "hypothesis_shrink_seconds": shrink_s, "hypothesis_shrink_cpu_seconds": shrink_cpu,
            "hypothesis_steps_after_shrink": steps, "find_ratio_cpu": find_cpu / bfs_cpu,
            "find_over_walk_find_cpu": find_cpu / walk_find_cpu, "shrink_over_walk_cpu": shrink_cpu / walk_cpu,
            "shrink_ratio_cpu": shrink_cpu / bfs_cpu, "straight_walk_cpu_seconds": straight,
            "find_over_straight_walk_cpu": find_cpu / straight,
        })
    totals = {key: sum(r[key] for r in rows) for key in (
        "bfs_seconds", "bfs_cpu_seconds", "walk_seconds", "walk_cpu_seconds", "walk_find_cpu_seconds",
        "hypothesis_find_seconds", "hypothesis_find_cpu_seconds", "hypothesis_shrink_seconds",
        "hypothesis_shrink_cpu_seconds")}
    t = totals
    print(f"all {len(rows)} known-bad designs, CPU summed: BFS {t['bfs_cpu_seconds']:.2f} s; walks finding "
          f"{t['walk_find_cpu_seconds']:.3f} s, finding + shrinking {t['walk_cpu_seconds']:.3f} s; Hypothesis finding "
          f"{t['hypothesis_find_cpu_seconds']:.2f} s, finding + shrinking {t['hypothesis_shrink_cpu_seconds']:.2f} s")
    for label, key in (("finding, Hypothesis / walks", "find_over_walk_find_cpu"),
                       ("a shrunk counterexample, Hypothesis / walks", "shrink_over_walk_cpu"),
                       ("finding, Hypothesis / BFS (shortest)", "find_ratio_cpu"),
                       ("Hypothesis shrunk / BFS (shortest)", "shrink_ratio_cpu"),
                       ("finding, Hypothesis / straight down the shortest counterexample (no search: the most any "
                        "search of this model could reach)", "find_over_straight_walk_cpu")):
        worst = min(rows, key=lambda r: r[key])
        print(f"  {label}: {min(r[key] for r in rows):.1f}x to {max(r[key] for r in rows):.0f}x per design "
              f"(lowest: {worst['design']}); target >= 100x per design: "
              f"{'met' if worst[key] >= 100 else 'NOT met'}")
    figures["known_bad"] = rows
    figures["known_bad_totals"] = totals


def main() -> int:
    parser = OneLineParser(prog="bench_checker", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="7e32e5e", help="the commit to compare with (default: 7e32e5e, the "
                        "checker before its state-count reduction and hot-path work)")
    parser.add_argument("--new", help="check this commit's code as the new side (default: this tree, uncommitted "
                        "changes included)")
    parser.add_argument("--no-base", dest="with_base", action="store_false")
    parser.add_argument("--repeat", type=positive_int, default=5, help="runs per known-bad design: the walks and "
                        "Hypothesis once per seed 0..N-1, BFS N times (medians compared; default 5)")
    parser.add_argument("--jobs", type=positive_int, help="processes for `specflip check` (default: one per core)")
    parser.add_argument("--pre-issue-20", action="store_true", help="also the checker before issue 20")
    parser.add_argument("--symmetry", action="store_true", help="with --pre-issue-20: also count states up to "
                        "batch order")
    parser.add_argument("--overlap", action="store_true", help="the overlap designs and scope instead")
    parser.add_argument("--no-hypothesis", dest="hypothesis", action="store_false")
    parser.add_argument("--design", action="append", help="only this design (repeatable); with it, no end-to-end "
                        "`specflip check` run")
    parser.add_argument("--end-to-end-only", action="store_true", help="only `specflip check` end to end, base "
                        "then new (no per-design table)")
    parser.add_argument("--walks", type=positive_int, help="also `specflip check --simulate WALKS` of base and new "
                        "(interleaved, --repeat rounds)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if args.walks and not args.with_base:
        parser.error("--walks compares base and new: it needs a base (drop --no-base)")
    designs = list(OVERLAP_DESIGNS if args.overlap else ALL_DESIGNS)
    if args.design:
        unknown = sorted(set(args.design) - {d.name for d in designs})
        if unknown:
            parser.error(f"unknown design(s) {', '.join(unknown)}")
        designs = [d for d in designs if d.name in args.design]
    scope_for = overlap_scope if args.overlap else (lambda d: Scope())
    limit = 12_000_000 if args.overlap else 2_000_000
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    figures: dict[str, object] = {"scope": scope_for(designs[0]).describe(), "base": args.base,
                                  "new": args.new or head}
    print(f"scope: {figures['scope']}; base {args.base}, new "
          f"{args.new or head + ' (+ uncommitted changes, if any)'}\n")
    if args.with_base:
        with tempfile.TemporaryDirectory(prefix="specflip-base-") as tmp, \
                tempfile.TemporaryDirectory(prefix="specflip-new-") as tmp_new:
            new_root = source_tree(args.new, Path(tmp_new)) if args.new else ROOT
            base_root = source_tree(args.base, Path(tmp))
            if args.walks:
                compare_walks_with_base(base_root, args.walks, args.repeat, args.overlap, figures, new_root)
            compare_with_base(base_root, designs, args.overlap, limit, args.jobs, figures,
                              end_to_end=not args.design, per_design=not args.end_to_end_only, new_root=new_root)
    if args.pre_issue_20:
        compare_with_pre_issue_20(designs, scope_for, limit, args.symmetry, figures)
    if args.hypothesis and not args.overlap:
        compare_with_hypothesis(args.repeat, figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
