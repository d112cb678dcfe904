"""Verdicts: each design checked exhaustively, judged against its kind, written as a proof report.

shipped:   pass (no violation, every "sometimes" reached, every state at rest good) or fail.
known-bad: refuted (a shortest counterexample whose last step breaks the expected invariant) or
           not-refuted (no violation, or one that names another invariant).
With random walks instead (`proofs.simulation`, `specflip check --simulate N`): a shipped design survives N walks
(no proof) or fails; a known-bad one is refuted by a counterexample that need not be the shortest, or not.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import attrs

from proofs.bfs import Progress, Result, check
from proofs.simulation import SimulationResult, Walks, simulate
from statemodel.design import Design, DesignKind, Scope
from statemodel.model import Model
from statemodel.state import Batch, Request, State


@attrs.frozen
class Verdict:
    design: Design
    scope: Scope
    result: Result
    verdict: str  # pass | fail | refuted | not-refuted; survived (random walks only)
    reason: str
    # random walks: the length of the counterexample the walk found, before the shrink (`result.trace` is the shrunk)
    found_steps: int | None = None

    @property
    def ok(self) -> bool:
        return self.verdict in ("pass", "refuted", "survived")

    @property
    def invariant(self) -> str | None:
        return self.result.violations[0].invariant if self.result.violations else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.design.name,
            "kind": self.design.kind.value,
            "verdict": self.verdict,
            "invariant": self.invariant,
            "trace": [step.action.describe() for step in self.result.trace],
            "states": self.result.states,
            "transitions": self.result.transitions,
            "seconds": round(self.result.seconds, 3),
            "cpu_seconds": round(self.result.cpu_seconds, 3),
            "reason": self.reason,
            **({} if self.found_steps is None else {"found_steps": self.found_steps}),
        }


def judge(design: Design, scope: Scope, result: Result) -> Verdict:
    if design.kind is not DesignKind.KNOWN_BAD:  # shipped and candidate designs must pass
        problems = []
        if result.violations:
            problems.append(f"breaks {result.violations[0].invariant} after {len(result.trace)} steps")
        if not result.complete:
            problems.append("the scope was not exhausted")
        if result.vacuous:
            problems.append(f"never reached: {', '.join(result.vacuous)} (the proof would be vacuous)")
        if result.eventually_failed:
            problems.append(f"a state at rest fails {', '.join(result.eventually_failed)}")
        elif result.complete and not result.violations and not result.states_at_rest:
            problems.append("no state at rest reached (every eventually-property would hold vacuously)")
        if problems:
            return Verdict(design, scope, result, "fail", "; ".join(problems))
        return Verdict(design, scope, result, "pass",
                       f"every invariant holds in all {result.states} states; every sometimes-property reached")
    return _judge_known_bad(design, scope, result, f"in {result.states} states", "shortest counterexample")


def _judge_known_bad(design: Design, scope: Scope, result: Result, searched: str, found: str) -> Verdict:
    """Refuted only by a counterexample whose last step breaks the design's expected invariant."""
    names = [v.invariant for v in result.violations]
    if not names:
        return Verdict(design, scope, result, "not-refuted",
                       f"no violation {searched}; expected {design.expected_invariant}")
    if names[0] != design.expected_invariant:
        return Verdict(design, scope, result, "not-refuted",
                       f"broke {names[0]}, expected {design.expected_invariant}")
    return Verdict(design, scope, result, "refuted", f"{found}: {len(result.trace)} steps, breaks {names[0]}")


def judge_walks(design: Design, scope: Scope, sim: SimulationResult) -> Verdict:
    """A verdict from random walks: the same invariants, but no walk proves a design, and a counterexample found
    at random need not be the shortest."""
    result, where = sim.result, f"walk {sim.walks_run:,} of seed {sim.settings.seed}"
    if sim.shrink_replays:
        where += f", found in {sim.found_steps} steps, shrunk in {sim.shrink_replays} replays"
    if design.kind is not DesignKind.KNOWN_BAD:
        if result.violations:
            return Verdict(design, scope, result, "fail",
                           f"breaks {result.violations[0].invariant} after {len(result.trace)} steps ({where})",
                           sim.found_steps)
        if result.eventually_failed:
            return Verdict(design, scope, result, "fail",
                           f"a state at rest fails {', '.join(result.eventually_failed)} ({where})", sim.found_steps)
        e = sim.ended
        return Verdict(design, scope, result, "survived",
                       f"no violation in {sim.walks_run:,} random walks ({result.states:,} distinct states; "
                       f"{e['at rest']:,} ended at rest, {e['looped']:,} where every step led back, "
                       f"{e['depth']:,} at depth {sim.settings.max_depth}): not a proof")
    verdict = _judge_known_bad(design, scope, result, f"in {sim.walks_run:,} random walks",
                               f"a counterexample, not proven the shortest, in {where}")
    return attrs.evolve(verdict, found_steps=sim.found_steps) if result.violations else verdict


def run_design(design: Design, scope: Scope | None = None, *, progress: Progress | None = None,
               max_states: int = 2_000_000) -> Verdict:
    scope = scope or Scope()
    result = check(Model(design, scope), progress=progress, max_states=max_states)
    return judge(design, scope, result)


def stderr_progress(name: str) -> Progress:
    """Progress lines for one design on stderr (stdout is left to the verdicts and `--json`)."""
    started = time.perf_counter()

    def progress(states: int, transitions: int, depth: int) -> None:
        print(f"  … {name}: {states:,} states, {transitions:,} transitions, depth {depth}, "
              f"{time.perf_counter() - started:.0f}s", file=sys.stderr, flush=True)

    return progress


def _run_job(job: tuple[Design, Scope, int, bool, Walks | None]) -> Verdict:
    design, scope, max_states, show_progress, walks = job
    if walks is not None:
        return judge_walks(design, scope, simulate(Model(design, scope), walks))
    return run_design(design, scope, progress=stderr_progress(design.name) if show_progress else None,
                      max_states=max_states)


def run_designs(designs: Sequence[Design], scope_for: Callable[[Design], Scope], *, max_states: int = 2_000_000,
                jobs: int | None = None, show_progress: bool = False,
                on_verdict: Callable[[Verdict], None] | None = None,
                expected_states: Callable[[Design], int | None] | None = None,
                walks: Walks | None = None) -> list[Verdict]:
    """Every design checked (exhaustively; by random walks when `walks` is given), in a pool of `jobs` processes
    (default: one per core); the designs are independent, so a design's verdict does not depend on where it ran.
    Verdicts come back in the order of `designs`; `on_verdict` sees each as it is ready, in that order too.
    `expected_states` (a guess, from the last run's reports, say; None: unknown) only orders the work: the largest
    designs start first, so that the pool does not end on one large design alone (longest first)."""
    jobs = min(jobs or os.cpu_count() or 1, len(designs))
    work = [(d, scope_for(d), max_states, show_progress, walks) for d in designs]
    verdicts: list[Verdict] = []
    if jobs <= 1:
        for job in work:
            verdicts.append(_run_job(job))
            if on_verdict is not None:
                on_verdict(verdicts[-1])
        return verdicts
    order = list(range(len(work)))
    if expected_states is not None:
        guesses = [expected_states(d) for d in designs]
        # unknown first (it may be large), then the largest guess first
        order.sort(key=lambda i: (guesses[i] is not None, -(guesses[i] or 0)))
    done: dict[int, Verdict] = {}
    # spawned, not forked: a caller (pytest, with torch's threads) may not survive a fork
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_run_job, work[i]): i for i in order}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            while len(verdicts) in done:  # hand on every verdict whose predecessors are in
                verdicts.append(done.pop(len(verdicts)))
                if on_verdict is not None:
                    on_verdict(verdicts[-1])
    return verdicts


def reported_states(directory: Path) -> Callable[[Design], int | None]:
    """The states each design's proof report under `directory` says were explored (None: no report, or not
    one this version wrote): `run_designs`'s guess of how large a design is."""
    def states(design: Design) -> int | None:
        try:
            text = (directory / f"{design.name}.md").read_text()
        except OSError:
            return None
        match = _EXPLORED.search(text)
        return int(match.group(1)) if match else None

    return states


# ----------------------------------------------------------------------------------------------
# Readable reports


def describe_request(r: Request) -> str:
    return (f"r{r.rid} {r.status.value} seq_len={r.seq_len} out={r.committed}/{r.max_new_tokens} "
            f"kv={r.kv_held}+{r.kv_reserved} draft_kv={r.draft_kv_len}{'' if r.draft_hidden_ready else ' no-hidden'}"
            + (f" tree_prefix={r.cached_len}" if r.cached_len else ""))


def describe_batch(b: Batch) -> str:
    graph = b.graph.describe() if b.graph else "eager"
    algo = "EAGLE" if b.spec_algorithm_on else "NONE"
    return (f"{b.forward_mode.value} rids={list(b.rids)} spec_info={b.spec_info.describe()} "
            f"spec_algorithm={algo} out_cache_loc={b.out_cache_loc_width} graph={graph}")


def describe_state(s: State) -> list[str]:
    lines = [f"stage={s.stage.value} spec={s.spec_mode.value} num_steps={s.num_steps} kv_free={s.kv_free}/"
             f"{s.kv_pool_size}" + (f" t_off={s.thresholds.t_off} t_on={s.thresholds.t_on}" if s.thresholds else "")]
    lines.append("running: " + describe_batch(s.running))
    if s.pending is not None:
        lines.append("pending: " + describe_batch(s.pending))
    if s.launched is not None:
        lines.append("launched: " + describe_batch(s.launched))
    if s.prefix_cache:  # radix cache only: per cached token, D = its draft KV written, - = not
        lines.append("radix tree: " + "".join("D" if mark else "-" for mark in s.prefix_cache))
    if s.unprocessed:  # overlap schedule only
        lines.append("unprocessed results: " + "; ".join(u.describe() for u in s.unprocessed))
    lines.extend(describe_request(r) for r in s.requests if r.status.value != "not_arrived")
    return lines


_EXPLORED = re.compile(r"^- Explored: (\d+) states", re.MULTILINE)  # report_markdown's line

# the line every report carries: `specflip check --reports-dir` overwrites only files that carry it
REPORT_MARK = "Generated by `specflip check`; do not edit by hand."


def report_markdown(v: Verdict) -> str:
    r = v.result
    d = v.design
    out = [f"# Proof report: `{d.name}` ({d.kind.value})", "",
           REPORT_MARK, "",
           f"**Verdict: {v.verdict}** — {v.reason}.", "",
           d.summary, "", f"- SGLang line: {d.sglang_line}", f"- Source: {d.source}",
           f"- Policy: {d.policy.describe()}", f"- Scope: {v.scope.describe()}",
           f"- Explored: {r.states} states (counted by `Model.dedup_key`: a finished request out of every batch by "
           f"its status, output and KV only, threshold pairs the policy answers alike from there on as one, the "
           f"last forward's batch only where a step reads it), {r.transitions} transitions, every one checked with "
           f"every invariant, depth {r.max_depth}"
           f"{'' if r.complete else ' (stopped before exhausting the scope)'}", ""]
    out += ["## Invariants", ""]
    broken = {x.invariant for x in r.violations}
    for name in r.invariants_checked:
        status = "**broken**" if name in broken else ("held up to the counterexample" if broken else "holds")
        out.append(f"- `{name}`: {status}")
    out += ["", "## Sometimes (reachability, against vacuity)", ""]
    unreached = "not reached before the counterexample" if r.violations else "NOT reached"
    out += [f"- `{name}`: {'reached' if ok else unreached}" for name, ok in r.sometimes_reached.items()]
    if r.violations:
        out += ["", f"## Shortest counterexample ({len(r.trace)} steps)", "", "```"]
        if r.initial is not None and r.initial.thresholds is not None:
            out.append(f"0. initial state: t_off={r.initial.thresholds.t_off} t_on={r.initial.thresholds.t_on}")
        for step in r.trace:
            out.append(f"{step.index}. {step.action.describe()}")
        out += ["```", "", "State after the last step:", "", "```"]
        out += describe_state(r.trace[-1].state) if r.trace else []
        out += ["```", "", "Broken at the last step:", ""]
        out += [f"- `{x.invariant}`: {x.message}" for x in r.violations]
    out.append("")
    return "\n".join(out)


def write_reports(verdicts: Iterable[Verdict], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for v in verdicts:
        path = directory / f"{v.design.name}.md"
        path.write_text(report_markdown(v))
        written.append(path)
    return written


def stale_reports(verdicts: Iterable[Verdict], directory: Path) -> list[str]:
    """The reports under `directory` that differ from what the verdicts would write (missing included)."""
    stale = []
    for v in verdicts:
        path = directory / f"{v.design.name}.md"
        if not path.is_file() or path.read_text() != report_markdown(v):
            stale.append(str(path))
    return stale


def verdicts_json(verdicts: Iterable[Verdict]) -> str:
    return json.dumps({"designs": [v.to_json() for v in verdicts]}, indent=2)
