"""`specflip explain TRACE...`: replay guard traces through the model.

Each step record is re-checked from the rebuilt states (`shim.guard.checks.step_violations`: the model's
invariants and its stage/mode rules), independently of what the guard that wrote it concluded. The
report gives the first illegal step, or says the trace conforms, and which model actions it covered.

Python API (used by the GPU replay): `explain_traces(paths) -> ExplainReport`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from shim.guard.checks import state_violations, step_violations
from shim.guard.trace import (
    TraceFormatError,
    apply_delta,
    compact_state,
    rid_name,
    scope_from_json,
    state_from_json,
)
from specflip.ranks import RankAgreement, RankTraceError, check_rank_agreement
from specflip.trace_reader import read_records
from statemodel.actions import ACTION_CATALOGUE, Action, transitions_in
from statemodel.design import Design, Scope
from statemodel.designs import get_design
from statemodel.invariants import Violation
from statemodel.state import Request, State


@attrs.frozen
class IllegalStep:
    path: str
    line: int
    rank: int
    step: int
    action: str
    args: tuple[int, ...]
    where: str
    rids: tuple[str, ...]
    violations: tuple[Violation, ...]

    def describe(self) -> str:
        first = self.violations[0]
        who = f" requests {list(self.rids)}" if self.rids else ""
        head = (f"{self.path}:{self.line}: step {self.step} on rank {self.rank}: {self.action}"
                f"{list(self.args) if self.args else ''} [{self.where}]{who} breaks {first.invariant}")
        return "\n".join([head] + [f"    {v.describe()}" for v in self.violations])


@attrs.frozen
class TraceSummary:
    path: str
    ranks: tuple[int, ...]
    steps: int
    releases: tuple[str, ...]
    designs: tuple[str, ...]
    broken: str | None = None  # where the file stops being a valid trace ("path:line: problem"); read up to it


@attrs.frozen
class ExplainReport:
    """`conforms`: no step broke the model. `first_illegal`: the earliest such step of each file, in
    file order (the first entry is the first one found). `covered`: action name -> steps, over all files;
    `not_covered`: catalogue actions no step took."""

    files: tuple[TraceSummary, ...]
    first_illegal: tuple[IllegalStep, ...]
    covered: dict[str, int]
    not_covered: tuple[str, ...]
    ranks: RankAgreement | None = None  # several single-rank files: did every rank take the same steps?

    @property
    def breaks(self) -> tuple[str, ...]:
        """Each broken file's break ("path:line: problem"); its steps before the break were explained."""
        return tuple(f.broken for f in self.files if f.broken is not None)

    @property
    def conforms(self) -> bool:
        return not self.first_illegal and (self.ranks is None or self.ranks.agree) and not self.breaks

    def to_json(self) -> dict[str, Any]:
        return {
            "conforms": self.conforms,
            "files": [attrs.asdict(f) for f in self.files],
            "first_illegal": [
                {"path": s.path, "line": s.line, "rank": s.rank, "step": s.step, "action": s.action,
                 "args": list(s.args), "where": s.where, "rids": list(s.rids),
                 "violations": [attrs.asdict(v) for v in s.violations]}
                for s in self.first_illegal
            ],
            "breaks": list(self.breaks),
            "covered": self.covered,
            "not_covered": list(self.not_covered),
            "rank_agreement": None if self.ranks is None else {
                "ranks": list(self.ranks.ranks), "agree": self.ranks.agree,
                "steps_compared": self.ranks.steps_compared,
                "first_divergence": None if self.ranks.divergence is None else {
                    "step": self.ranks.divergence.step, "rank": self.ranks.divergence.rank,
                    "path": self.ranks.divergence.path, "line": self.ranks.divergence.line,
                    "message": self.ranks.divergence.describe()},
            },
        }

    def render(self) -> str:
        lines = []
        for f in self.files:
            lines.append(f"{f.path}: {f.steps} steps, rank(s) {list(f.ranks)}, sglang {', '.join(f.releases)}, "
                         f"reference design {', '.join(f.designs)}")
            if f.broken is not None:
                lines.append(f"  the trace breaks at {f.broken}; explained up to the line before it")
        if not self.first_illegal and self.breaks:
            lines.append("no illegal step before the break")
        elif not self.first_illegal:
            lines.append("the trace conforms to the model: every step is a legal transition and every invariant held")
        else:
            lines.append("first illegal step:" if len(self.first_illegal) == 1 else "first illegal step per file:")
            lines.extend(s.describe() for s in self.first_illegal)
        covered = ", ".join(f"{name} x{count}" for name, count in self.covered.items())
        lines.append(f"transitions covered: {covered or 'none'}")
        if self.not_covered:
            lines.append(f"not covered: {', '.join(self.not_covered)}")
        if self.ranks is not None:
            lines.append(f"rank agreement: {self.ranks.describe()}")
        return "\n".join(lines)


def explain_file(path: str | Path) -> tuple[TraceSummary, IllegalStep | None, dict[str, int]]:
    """Replay one trace file. Raises TraceFormatError (with the line) for a file that is not a trace; a trace
    that breaks after its header (cut short by a crash, a damaged line) is explained up to the break, which
    the summary's `broken` names."""
    name = str(path)
    state: State | None = None
    scope: Scope | None = None
    design: Design | None = None
    names: list[str] = []
    covered: dict[str, int] = {}
    ranks: set[int] = set()
    releases: list[str] = []
    designs: list[str] = []
    steps = 0
    first: IllegalStep | None = None
    breaks: list[TraceFormatError] = []
    for line, record in read_records(path, breaks=breaks):
        kind = record["kind"]
        ranks.add(record["rank"])
        try:
            if kind == "header":
                state = state_from_json(record["state"])
                scope = scope_from_json(record["scope"])
                design = get_design(str(record["design"]))
                names = [str(n) for n in record["rids"]]
                releases.append(str(record["release"]))
                designs.append(str(record["design"]))
                continue
            assert state is not None and scope is not None and design is not None  # a header comes first
            if kind == "compact":
                keep = [int(i) for i in record["keep"]]
                state = compact_state(state, keep)
                names = [names[i] for i in keep]
                continue
            if kind == "step":
                state = _with_arrivals(state, record["delta"])
            after = apply_delta(state, record["delta"])
            if kind == "refine":
                found = state_violations(after, scope)
                action = Action(str(record.get("action", "refine")))
            else:
                names.extend(str(n) for n in record["new_rids"])
                action = Action(str(record["action"]), tuple(int(a) for a in record["args"]))
                found = step_violations(state, action, after, scope, design)
                steps += 1
                covered[action.name] = covered.get(action.name, 0) + transitions_in(action)
        except TraceFormatError:
            raise
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            # values of the wrong shape inside a record (read_records checks the top-level fields' types)
            problem = TraceFormatError(name, line, f"{kind} record does not rebuild a model state: "
                                                   f"{type(exc).__name__}: {exc}")
            if design is None:  # the header itself does not rebuild: nothing to explain
                raise problem from None
            breaks.append(problem)
            break
        if not found and record.get("violations"):
            # what the guard found with checks a trace cannot redo (slot identity, token content, the tree's draft
            # coverage: they read positions and tokens the trace does not hold), as it recorded it
            found = _recorded_violations(record["violations"], names)
        if found and first is None:
            rids = tuple(dict.fromkeys(rid_name(names, r) for v in found for r in v.rids))
            first = IllegalStep(path=name, line=line, rank=int(record["rank"]), step=int(record["step"]),
                                action=action.name, args=action.args, where=str(record.get("where", "")),
                                rids=rids, violations=tuple(found))
        state = after
    summary = TraceSummary(path=name, ranks=tuple(sorted(ranks)), steps=steps, releases=tuple(dict.fromkeys(releases)),
                           designs=tuple(dict.fromkeys(designs)), broken=str(breaks[0]) if breaks else None)
    return summary, first, covered


def _recorded_violations(recorded: list[dict[str, Any]], names: list[str]) -> list[Violation]:
    index = {name: i for i, name in enumerate(names)}
    return [Violation(str(v["invariant"]), f"{v.get('message', '')} (recorded by the guard)",
                      tuple(index[r] for r in v.get("rids", ()) if r in index), str(v.get("expected", "")),
                      str(v.get("actual", ""))) for v in recorded]


def _with_arrivals(state: State, delta: dict[str, Any]) -> State:
    """Requests a step appends existed before it as NOT_ARRIVED (as in statemodel's initial states)."""
    count = int(delta.get("n_requests", len(state.requests)))
    if count <= len(state.requests):
        return state
    new = []
    for index in range(len(state.requests), count):
        data = delta["requests"][str(index)]
        new.append(Request(rid=index, prompt_len=int(data["prompt_len"]), max_new_tokens=int(data["max_new_tokens"])))
    return attrs.evolve(state, requests=state.requests + tuple(new))


def explain_traces(paths: Sequence[str | Path]) -> ExplainReport:
    """Replay every file (one per rank is fine); TraceFormatError on the first malformed line."""
    files = []
    illegal = []
    covered: dict[str, int] = {}
    for path in paths:
        summary, first, counts = explain_file(path)
        files.append(summary)
        if first is not None:
            illegal.append(first)
        for name, count in counts.items():
            covered[name] = covered.get(name, 0) + count
    order = [a.name for a in ACTION_CATALOGUE]
    covered = {name: covered[name] for name in order if name in covered}
    ranks = None
    # several files, one rank each and no rank twice: one run's ranks, which must agree step by step
    file_ranks = [f.ranks[0] for f in files if len(f.ranks) == 1]
    if len(files) > 1 and len(file_ranks) == len(files) and len(set(file_ranks)) == len(files):
        ranks = check_rank_agreement(paths, up_to_breaks=True)
    return ExplainReport(files=tuple(files), first_illegal=tuple(illegal), covered=covered,
                         not_covered=tuple(n for n in order if n not in covered), ranks=ranks)


def main(args: argparse.Namespace) -> int:
    """0: conforms; 1: an illegal step (or ranks that disagree); 2: a file that is not a trace, or a trace that
    breaks (one line each on stderr naming file and line; a broken trace is explained up to its break)."""
    try:
        report = explain_traces(args.traces)
    except TraceFormatError as exc:
        print(f"specflip explain: malformed trace: {exc}", file=sys.stderr)
        return 2
    except RankTraceError as exc:
        print(f"specflip explain: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.render())
    for broken in report.breaks:
        print(f"specflip explain: malformed trace: {broken}", file=sys.stderr)
    if report.first_illegal or (report.ranks is not None and not report.ranks.agree):
        return 1
    return 2 if report.breaks else 0
