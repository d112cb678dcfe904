"""Rank agreement: under tensor parallelism every rank's scheduler must take the same transitions.

The seeds' crash hit one rank (TP6) and took the whole server down. With one trace file per rank,
`check_rank_agreement` compares the ranks' step sequences (action, arguments, the model-level state
change, new requests, violations) and names the first step at which a rank diverged and which rank.
A rank that stopped early (a crash, a truncated file) diverges at the first step it lacks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from shim.guard.trace import read_records

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
    import json

    return None if record is None else json.dumps(record, sort_keys=True)


# The auto switch's records in the switch trace (shim/switch/v2.py, shim/switch/auto.py): each agreed window of
# observations and each flip, with the learner's inputs and a digest of its state. Ranks agree when every rank
# wrote the same sequence of them (the wall-clock `t` and `ms` are rank-local).
SWITCH_RECORDS = ("auto_observe", "flip_off", "flip_on")
SWITCH_AGREED_FIELDS = ("action", "reason", "demand", "running", "waiting", "learner_step", "spec_value",
                        "plain_value", "incumbent", "digest", "decode_step", "n", "spec", "seconds", "accept_mean")


def _switch_records(path: Path) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
    import json

    rank: int | None = None
    records: list[tuple[int, dict[str, Any]]] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RankTraceError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RankTraceError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or record.get("action") not in SWITCH_RECORDS or "rank" not in record:
            continue
        if rank is None:
            rank = int(record["rank"])
        elif int(record["rank"]) != rank:
            raise RankTraceError(f"{path}:{number}: a record of rank {record['rank']} in the trace of rank {rank}; "
                                 "give one file per rank")
        records.append((number, {f: record.get(f) for f in SWITCH_AGREED_FIELDS if f in record}))
    if rank is None:
        raise RankTraceError(f"{path}: no auto switch records with a rank (SPECFLIP_SWITCH=auto with "
                             "SPECFLIP_SWITCH_TRACE writes them)")
    return rank, records


def check_switch_agreement(paths: Sequence[str | Path]) -> RankAgreement:
    """Compare the auto switch's per-rank switch traces (switch-<pid>.jsonl, one per rank): every window of agreed
    observations and every flip, with the learner's inputs and state digest, must be the same on every rank."""
    per_rank: dict[int, tuple[Path, list[tuple[int, dict[str, Any]]]]] = {}
    for raw in paths:
        path = Path(raw)
        rank, records = _switch_records(path)
        if rank in per_rank:
            raise RankTraceError(f"two traces for rank {rank}: {per_rank[rank][0]} and {path}")
        per_rank[rank] = (path, records)
    return _compare(per_rank)
