"""Per-step rank agreement under tensor parallelism (TP > 1), checked live before the forward.

Every TP rank runs its own scheduler on identical inputs; a flip taken on one rank and not on another makes the ranks
launch different forwards, whose NCCL collectives then hang or mix batches. `specflip.ranks` finds such a
divergence afterwards in the per-rank traces; this module stops it while the server runs. Once per scheduler
iteration, right after `Scheduler.get_next_batch_to_run` returned the batch to run (after the switch's flip, before
`run_batch` and so before any NCCL collective of the model), every rank contributes a `StepFingerprint` of the step it
is about to run and the ranks all-gather them in one small collective over SGLang's own CPU (gloo) group of the TP
group (`Scheduler.tp_cpu_group`). All ranks then hold the same list, so they all reach the same verdict: on a
mismatch each one raises `RankDisagreement` (assert mode) or logs it once and stops checking (warn and trace mode).

Why the exchange itself cannot hang on a divergent flip: it is called exactly once per scheduler iteration on every
rank, whatever that rank decided (a rank with no batch to run contributes a fingerprint saying so), so the k-th
exchange of every rank pairs with the k-th of every other. What can still hang it is a rank that never reaches the
next iteration (a crash, a deadlock elsewhere): SGLang's scheduler watchdog handles that (docs/tp.md).

SGLang-free: the adapter (`shim.releases.guard_ranks`, `after_get_next_batch_to_run`) reads the live batch into
a fingerprint and passes the exchange; the exchange over a torch.distributed group is `group_exchange`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from shim.guard.core import Mode, SpecFlipViolation
from shim.settings import SettingError, settings

logger = logging.getLogger("specflip.guard")

ENV_RANK_CHECK = settings.RANK_CHECK.name  # declared in shim/settings.py
INVARIANT = "ranks_agree"
ACTION = "schedule_step"  # what the ranks disagree on: the step get_next_batch_to_run planned
ABSENT = -1  # a field with no value on this rank (no batch; the guard is off here)
UNREADABLE = -2  # every field of a step this rank could not read (an error in the adapter): exchanged all the same
_HASH_MASK = (1 << 63) - 1  # an int64 tensor entry

# this rank's values in, every rank's values out (index = rank)
Exchange = Callable[[tuple[int, ...]], Sequence[tuple[int, ...]]]


class RankCheckConfigError(ValueError):
    """A SPECFLIP_RANK_CHECK value the guard does not know."""


def rank_check_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """SPECFLIP_RANK_CHECK: on (default, when the guard is on and TP > 1) or off (`0`, `off`)."""
    try:
        return bool(settings.RANK_CHECK.get(environ))
    except SettingError as exc:
        raise RankCheckConfigError(str(exc)) from None


def rids_hash(rids: Iterable[str]) -> int:
    """A 63-bit digest of the request ids in batch order. hashlib, not `hash()`: str hashes are salted per process."""
    digest = hashlib.blake2b("\x1f".join(rids).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _HASH_MASK


@attrs.frozen
class StepFingerprint:
    """What one rank is about to run at one scheduler iteration; every field is an int every rank must agree on."""

    step: int  # the rank's count of scheduler iterations checked (1, 2, ...)
    has_batch: int  # 1: a batch runs this iteration; 0: none (the others are ABSENT)
    forward_mode: int  # SGLang's ForwardMode value
    batch_size: int
    rids_hash: int  # rids_hash() of the batch's request ids, in order
    tokens: int  # KV slots the forward writes: out_cache_loc (prefill, plain decode); a verify's batch x (steps + 1)
    spec_algorithm_on: int  # the batch's spec_algorithm is not NONE (the flip of the plain path sets it)
    spec_mode_on: int  # the guard's model mode (moved by every flip the switch announces); ABSENT: guard off here
    num_steps: int  # the guard's model step count (the adaptive controller's); ABSENT: guard off here
    transitions: int  # model transitions the guard has taken on this rank; ABSENT: guard off here

    def values(self) -> tuple[int, ...]:
        return attrs.astuple(self)

    @classmethod
    def from_values(cls, values: Sequence[int]) -> StepFingerprint:
        return cls(*(int(v) for v in values))

    def describe(self) -> str:
        if self.has_batch == UNREADABLE:
            return f"step {self.step}: unreadable (an error reading the step on that rank, logged there)"
        if not self.has_batch:
            head = "no batch"
        else:
            spec = "spec on" if self.spec_algorithm_on else "spec off"
            head = (f"forward_mode {self.forward_mode}, {self.batch_size} requests (rids #{self.rids_hash:016x}), "
                    f"{self.tokens} tokens written, batch {spec}")
        guard = ("guard off on this rank" if self.transitions == ABSENT else
                 f"model mode {'on' if self.spec_mode_on else 'off'}, {self.num_steps} draft steps, "
                 f"{self.transitions} transitions")
        return f"step {self.step}: {head}; {guard}"


FIELDS = tuple(f.name for f in attrs.fields(StepFingerprint))


def fingerprint(step: int, *, forward_mode: int | None, rids: Sequence[str], out_cache_loc_width: int,
                spec_algorithm_on: bool, spec_decode: bool, guard_mode_on: bool | None, guard_num_steps: int | None,
                guard_transitions: int | None) -> StepFingerprint:
    """The fingerprint of a step from host values. `forward_mode` None: no batch runs. `spec_decode`: a speculative
    decode, whose verify writes (steps + 1) tokens per request in the worker (out_cache_loc is empty until then).
    `guard_*` None: the guard is off on this rank."""
    guard_on = guard_transitions is not None
    g_mode = int(bool(guard_mode_on)) if guard_on else ABSENT
    g_steps = int(guard_num_steps) if guard_on and guard_num_steps is not None else ABSENT
    g_trans = int(guard_transitions) if guard_transitions is not None else ABSENT
    if forward_mode is None:
        return StepFingerprint(step, 0, ABSENT, 0, ABSENT, 0, ABSENT, g_mode, g_steps, g_trans)
    bs = len(rids)
    if spec_decode:
        tokens = bs * (g_steps + 1) if g_steps != ABSENT else ABSENT
    else:
        tokens = out_cache_loc_width
    return StepFingerprint(step, 1, int(forward_mode), bs, rids_hash(rids), tokens, int(spec_algorithm_on),
                           g_mode, g_steps, g_trans)


class RankDisagreement(SpecFlipViolation):
    """The TP ranks are about to run different steps. Raised on every rank, before the forward.

    `step`: the scheduler iteration; `groups`: each distinct fingerprint with the ranks that hold it."""

    def __init__(self, message: str, *, rank: int, step: int,
                 groups: tuple[tuple[StepFingerprint, tuple[int, ...]], ...]) -> None:
        super().__init__(message, invariant=INVARIANT, action=ACTION, rank=rank, rids=(), violations=())
        self.step = step
        self.groups = groups


def disagreement(gathered: Sequence[Sequence[int]]) -> tuple[tuple[StepFingerprint, tuple[int, ...]], ...] | None:
    """The distinct fingerprints with the ranks holding each, largest group first (ties: lowest rank), or None when
    every rank holds the same one. A pure function of the gathered list: every rank reaches the same answer."""
    by_values: dict[tuple[int, ...], list[int]] = {}
    for rank, values in enumerate(gathered):
        by_values.setdefault(tuple(int(v) for v in values), []).append(rank)
    if len(by_values) == 1:
        return None
    ordered = sorted(by_values.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    return tuple((StepFingerprint.from_values(v), tuple(ranks)) for v, ranks in ordered)


def describe_disagreement(groups: tuple[tuple[StepFingerprint, tuple[int, ...]], ...], rank: int) -> str:
    """One message naming the step, which ranks hold which fingerprint and the fields that differ."""
    differing = [f for f in FIELDS if len({getattr(fp, f) for fp, _ in groups}) > 1]
    steps = sorted({fp.step for fp, _ in groups})
    at = f"scheduler step {steps[0]}" if len(steps) == 1 else f"scheduler steps {steps} (a rank skipped a step)"
    held = "; ".join(f"ranks {list(ranks)} hold {fp.describe()}" for fp, ranks in groups)
    return (f"specflip: {INVARIANT} broken at {at} on TP rank {rank}: the TP ranks are about to run different "
            f"steps (differs in {', '.join(differing)}): {held}. Stopped before the forward, so before the model's "
            f"collectives")


class RankChecker:
    """One per scheduler process while TP > 1: one exchange per scheduler iteration, on every rank."""

    def __init__(self, exchange: Exchange, *, rank: int, world_size: int, mode: Mode) -> None:
        self.exchange = exchange
        self.rank = rank
        self.world_size = world_size
        self.mode = mode
        self.step = 0
        self.stopped = False  # warn / trace mode after a disagreement: every rank stops at the same step
        self.found: list[str] = []

    def check(self, make: Callable[[int], StepFingerprint]) -> None:
        """Exchange this iteration's fingerprint (`make(step)`) and compare. Raises RankDisagreement in assert mode."""
        if self.stopped:
            return
        self.step += 1
        try:
            mine = make(self.step)
        except Exception:  # noqa: BLE001 - this rank must still take part, or its peers wait in the exchange
            logger.exception("specflip guard: could not read this rank's step; it is exchanged as unreadable")
            mine = StepFingerprint(self.step, *([UNREADABLE] * (len(FIELDS) - 1)))
        gathered = self.exchange(mine.values())
        groups = disagreement(gathered)
        if groups is None:
            return
        message = describe_disagreement(groups, self.rank)
        if self.mode is Mode.ASSERT:
            raise RankDisagreement(message, rank=self.rank, step=self.step, groups=groups)
        # every rank saw the same list: all stop here together, so no exchange is left waiting for a peer
        self.stopped = True
        self.found.append(message)
        logger.warning("%s (warn mode: serving goes on; the rank check stops on every rank)", message)


def group_exchange(group: Any, world_size: int, width: int = len(FIELDS)) -> Exchange:
    """All-gather of one int64 row per rank over a torch.distributed group (SGLang's gloo `tp_cpu_group`)."""
    import torch
    import torch.distributed as dist

    out = [torch.empty(width, dtype=torch.int64) for _ in range(world_size)]

    def exchange(values: tuple[int, ...]) -> list[tuple[int, ...]]:
        dist.all_gather(out, torch.tensor(values, dtype=torch.int64), group=group)
        return [tuple(t.tolist()) for t in out]

    return exchange
