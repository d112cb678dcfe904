"""Rank agreement: under tensor parallelism every rank's scheduler must take the same transitions.

The seeds' crash hit one rank (TP6) and took the whole server down. With one trace file per rank,
`check_rank_agreement` compares the ranks' step sequences (action, arguments, the model-level state
change, new requests, violations) and names the first step at which a rank diverged and which rank.
A rank that stopped early (a crash, a truncated file) diverges at the first step it lacks.

The switch's traces (SPECFLIP_SWITCH_TRACE, one switch-<pid>.jsonl per scheduler process, so one per TP rank) are
compared the same way by `check_switch_agreement` (`specflip ranks`), for either policy: thresholds and auto.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from specflip.jsonl import json_objects
from specflip.trace_reader import read_records

# Fields of a step record that every rank must agree on; `where` (the hooked function) and the
# wall-clock are rank-local details.
AGREED_FIELDS = ("action", "args", "delta", "new_rids", "violations")


@attrs.frozen
class RankDivergence:
    step: int
    rank: int
    path: str
    line: int | None  # None: the rank's trace ends before this step
    expected: dict[str, Any] | None
    actual: dict[str, Any] | None
    agreeing_ranks: tuple[int, ...]

    def describe(self) -> str:
        if self.actual is None:
            return (f"rank {self.rank} ({self.path}) stopped before step {self.step}; ranks "
                    f"{list(self.agreeing_ranks)} went on to {_describe(self.expected)}")
        fields = dict.fromkeys([*(self.expected or {}), *self.actual])
        differing = [f for f in fields if (self.expected or {}).get(f) != self.actual.get(f)]
        return (f"rank {self.rank} diverged first, at step {self.step} ({self.path}:{self.line}): it took "
                f"{_describe(self.actual)} where ranks {list(self.agreeing_ranks)} took {_describe(self.expected)}"
                f" (differs in {', '.join(differing)})")


@attrs.frozen
class RankAgreement:
    ranks: tuple[int, ...]
    steps_compared: int
    divergence: RankDivergence | None

    @property
    def agree(self) -> bool:
        return self.divergence is None

    def describe(self) -> str:
        if self.divergence is None:
            return f"all {len(self.ranks)} ranks {list(self.ranks)} took the same {self.steps_compared} transitions"
        return self.divergence.describe()


class RankTraceError(ValueError):
    """Rank files that cannot be compared (two files for one rank, one file mixing ranks)."""


def _describe(record: dict[str, Any] | None) -> str:
    if record is None:
        return "nothing"
    args = record.get("args") or []
    return f"{record['action']}({', '.join(map(str, args))})" if args else str(record["action"])


def _steps_of(path: Path, up_to_breaks: bool = False) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
    rank: int | None = None
    steps: list[tuple[int, dict[str, Any]]] = []
    for line, record in read_records(path, breaks=[] if up_to_breaks else None):
        if rank is None:
            rank = int(record["rank"])
        elif int(record["rank"]) != rank:
            raise RankTraceError(f"{path}:{line}: a record of rank {record['rank']} in the trace of rank {rank}; "
                                 "give one file per rank")
        if record["kind"] == "step":
            steps.append((line, {f: record.get(f) for f in AGREED_FIELDS}))
    assert rank is not None  # read_records rejects a file without a header
    return rank, steps


def check_rank_agreement(paths: Sequence[str | Path], *, up_to_breaks: bool = False) -> RankAgreement:
    """Compare per-rank traces step by step; the majority at each step is the reference. `up_to_breaks`: a file
    that breaks after its header is compared up to the break (explain reports the break itself)."""
    per_rank: dict[int, tuple[Path, list[tuple[int, dict[str, Any]]]]] = {}
    for raw in paths:
        path = Path(raw)
        rank, steps = _steps_of(path, up_to_breaks)
        if rank in per_rank:
            raise RankTraceError(f"two traces for rank {rank}: {per_rank[rank][0]} and {path}")
        per_rank[rank] = (path, steps)
    return _compare(per_rank)


def _compare(per_rank: dict[int, tuple[Path, list[tuple[int, dict[str, Any]]]]]) -> RankAgreement:
    """The ranks' record sequences, compared position by position; the majority at each is the reference."""
    ranks = tuple(sorted(per_rank))
    longest = max(len(steps) for _, steps in per_rank.values())
    for index in range(longest):
        seen = {r: per_rank[r][1][index][1] if index < len(per_rank[r][1]) else None for r in ranks}
        keys = {r: _key(rec) for r, rec in seen.items()}
        majority, _ = Counter(k for k in keys.values() if k is not None).most_common(1)[0]
        odd = [r for r in ranks if keys[r] != majority]
        if odd:
            reference = next(seen[r] for r in ranks if keys[r] == majority)
            rank = odd[0]
            path, steps = per_rank[rank]
            line = steps[index][0] if index < len(steps) else None
            agreeing = tuple(r for r in ranks if keys[r] == majority)
            return RankAgreement(ranks, index, RankDivergence(index + 1, rank, str(path), line, reference,
                                                              seen[rank], agreeing))
    return RankAgreement(ranks, longest, None)


def _key(record: dict[str, Any] | None) -> str | None:
    return None if record is None else json.dumps(record, sort_keys=True)


# The switch trace (shim/switch/v2.py, shim/switch/auto.py): the records every rank must write alike, under either
# policy: each traced scheduler step (decode step or prefill), each flip (with the auto learner's inputs and state
# digest), each agreed window of the auto switch's observations. Of their fields only these are rank-local: when,
# how long a step took on this rank's device, whether it ran a CUDA graph, and the rank itself.
SWITCH_RECORDS = ("step", "prefill", "flip_off", "flip_on", "auto_observe")
SWITCH_STEPS = ("step", "prefill")
SWITCH_FLIPS = ("flip_off", "flip_on")
SWITCH_RANK_LOCAL = ("t", "ms", "graph", "rank")
# the fields a record is shown with in a message (the differing ones are named besides)
_SHOWN = ("running", "waiting", "chunked", "bs", "decode_step", "n", "reason")
RANKS_FROM_FIELD = "the records' rank field"
RANKS_FROM_ORDER = "file order (the traces carry no rank field)"


@attrs.frozen
class SwitchFlip:
    step: int  # the scheduler steps (decode steps and prefills) the switch traced before this flip
    decision: str
    running: int | None
    waiting: int | None
    chunked: int | None

    def describe(self) -> str:
        batch = "/".join("-" if n is None else str(n) for n in (self.running, self.waiting, self.chunked))
        return f"{self.step}:{batch} {self.decision}"


@attrs.frozen
class SwitchRankTrace:
    rank: int
    path: str
    records: tuple[tuple[int, dict[str, Any]], ...]  # (line, agreed fields)

    @property
    def flips(self) -> tuple[SwitchFlip, ...]:
        return tuple(_flips(r for _, r in self.records))


def _flips(records: Any) -> list[SwitchFlip]:
    steps, found = 0, []
    for record in records:
        if record["action"] in SWITCH_STEPS:
            steps += 1
        elif record["action"] in SWITCH_FLIPS:
            found.append(SwitchFlip(steps, record["action"], record.get("running"), record.get("waiting"),
                                    record.get("chunked")))
    return found


@attrs.frozen
class SwitchAgreement:
    traces: tuple[SwitchRankTrace, ...]  # by rank
    ranks_from: str  # RANKS_FROM_FIELD or RANKS_FROM_ORDER
    result: RankAgreement

    @property
    def agree(self) -> bool:
        return self.result.agree

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.result.ranks

    @property
    def records_compared(self) -> int:
        return self.result.steps_compared

    def where(self) -> tuple[int, int]:
        """(scheduler step index, flips before) at the first divergence, from the records all ranks agree on."""
        d = self.result.divergence
        assert d is not None
        before = [r for _, r in self.traces[0].records[:d.step - 1]]
        return sum(1 for r in before if r["action"] in SWITCH_STEPS), sum(1 for r in before if r["action"] in
                                                                           SWITCH_FLIPS)

    def describe(self) -> str:
        d = self.result.divergence
        if d is None:
            return (f"all {len(self.ranks)} ranks {list(self.ranks)} wrote the same {self.records_compared} switch "
                    "records (steps, prefills, flips, auto windows)")
        step, flips = self.where()
        at = f"switch record {d.step} (scheduler step index {step}, after flip {flips})"
        if d.actual is None:
            return (f"rank {d.rank} ({d.path}) stopped before {at}; ranks {list(d.agreeing_ranks)} went on to "
                    f"{_show(d.expected)}")
        fields = dict.fromkeys([*(d.expected or {}), *d.actual])
        differing = [f for f in fields if (d.expected or {}).get(f) != d.actual.get(f)]
        return (f"rank {d.rank} diverged first, at {at} ({d.path}:{d.line}): it has {_show(d.actual)} where ranks "
                f"{list(d.agreeing_ranks)} have {_show(d.expected)} (differs in {', '.join(differing)})")

    def report_lines(self) -> list[str]:
        """The per-flip listing (step index, batch, decision on each rank), then the verdict."""
        lines = [f"{len(self.traces)} switch traces, ranks from {self.ranks_from}: "
                 + ", ".join(f"rank {t.rank} = {t.path}" for t in self.traces),
                 "per flip: scheduler step index:running/waiting/chunked decision, on each rank"]
        flips = [t.flips for t in self.traces]
        for i in range(max(len(f) for f in flips)):
            lines.append(f"  flip {i + 1}: " + " | ".join("-" if i >= len(f) else f[i].describe() for f in flips))
        lines.append(("OK: " if self.agree else "DIVERGED: ") + self.describe())
        return lines

    def as_json(self) -> dict[str, Any]:
        d = self.result.divergence
        first = None
        if d is not None:
            step, flips = self.where()
            first = {"record": d.step, "step_index": step, "flips_before": flips, "rank": d.rank,
                     "agreeing_ranks": list(d.agreeing_ranks), "path": d.path, "line": d.line,
                     "message": self.describe()}
        return {"ranks": list(self.ranks), "ranks_from": self.ranks_from,
                "files": {str(t.rank): t.path for t in self.traces}, "agree": self.agree,
                "compared": self.records_compared,
                "flips": {str(t.rank): [attrs.asdict(f) for f in t.flips] for t in self.traces},
                "first_divergence": first}


def _show(record: dict[str, Any] | None) -> str:
    if record is None:
        return "nothing"
    shown = [f"{f}={record[f]}" for f in _SHOWN if record.get(f) is not None]
    return f"{record['action']}({', '.join(shown)})"


def _natural(path: Path) -> list[Any]:
    # switch-rank10 after switch-rank2
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def switch_trace_files(paths: Sequence[str | Path]) -> list[Path]:
    """The files named, a directory standing for its switch-*.jsonl (in name order, numbers by value)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("switch-*.jsonl"), key=_natural)
            if not found:
                raise RankTraceError(f"{path}: no switch-*.jsonl in this directory (SPECFLIP_SWITCH_TRACE writes one "
                                     "per scheduler process)")
            files += found
        else:
            files.append(path)
    seen: dict[Path, Path] = {}
    for path in files:
        key = path.resolve()
        if key in seen:
            raise RankTraceError(f"{path}: given twice (also as {seen[key]})")
        seen[key] = path
    if len(files) < 2:
        raise RankTraceError(f"need at least two switch traces (one per rank) to compare, got {len(files)}: "
                             + ", ".join(map(str, files)))
    return files


def _switch_records(path: Path) -> tuple[int | None, list[tuple[int, dict[str, Any]]]]:
    """The file's rank (from its records' rank field, None without one) and its agreed records."""
    ranks: set[int] = set()
    records: list[tuple[int, dict[str, Any]]] = []
    switch_trace = False
    for number, record in json_objects(path, RankTraceError, what="a record"):
        action = record.get("action")
        switch_trace = switch_trace or action == "config"
        if action not in SWITCH_RECORDS:
            continue
        if "rank" in record:
            try:
                ranks.add(int(record["rank"]))
            except (TypeError, ValueError):
                raise RankTraceError(f"{path}:{number}: rank {record['rank']!r} is not an integer") from None
            if len(ranks) > 1:
                raise RankTraceError(f"{path}:{number}: records of ranks {sorted(ranks)} in one trace; give one "
                                     "file per rank")
        records.append((number, {f: v for f, v in record.items() if f not in SWITCH_RANK_LOCAL}))
    if not records and not switch_trace:
        raise RankTraceError(f"{path}: no switch records ({', '.join(SWITCH_RECORDS)}); not a switch trace "
                             "(SPECFLIP_SWITCH_TRACE writes them)")
    return (ranks.pop() if ranks else None), records


def check_switch_agreement(paths: Sequence[str | Path]) -> SwitchAgreement:
    """Compare per-rank switch traces (files, or directories of switch-*.jsonl) record by record: every traced step,
    every flip (with the auto learner's inputs and state digest) and every auto window must be the same on every
    rank. Ranks come from the records' rank field (the auto switch writes it); traces without one (thresholds) are
    numbered in the order given."""
    files = switch_trace_files(paths)
    read = [(path, *_switch_records(path)) for path in files]
    with_rank = [path for path, rank, _ in read if rank is not None]
    if with_rank and len(with_rank) < len(read):
        without = next(path for path, rank, _ in read if rank is None)
        raise RankTraceError(f"{with_rank[0]} has a rank field and {without} none; give the traces of one run")
    ranks_from = RANKS_FROM_FIELD if with_rank else RANKS_FROM_ORDER
    per_rank: dict[int, tuple[Path, list[tuple[int, dict[str, Any]]]]] = {}
    for index, (path, rank, records) in enumerate(read):
        rank = index if rank is None else rank
        if rank in per_rank:
            raise RankTraceError(f"two traces for rank {rank}: {per_rank[rank][0]} and {path}")
        per_rank[rank] = (path, records)
    traces = tuple(SwitchRankTrace(r, str(per_rank[r][0]), tuple(per_rank[r][1])) for r in sorted(per_rank))
    return SwitchAgreement(traces, ranks_from, _compare(per_rank))
