"""Slot identity by value (issue 51): a free of a tensor that is no view of a `req_to_token` row, checked against
the slots the live requests' rows hold, and every `alloc`, checked against the slots in use.

`slots_freed_owned` judges a free of a row view by its positions, from tensor metadata (no value read). A free of a copy
of a row's values (`req_to_token[row, a:b].clone()`, an `index_select`, values computed by arithmetic) has no positions:
what identifies its slots is their values. They are checked against every live request's row, `req_to_token[row, lo:hi]`
(`statemodel.identity.freed_slots_unowned`): a gather of the live rows (one [rows, longest] block), a mask of the
positions inside each range, the freed slots marked in a bitmap of the pool's slots (a scatter), read back at the
block's values (a gather) and cleared, then `any()` as a 0-d tensor (code 4ff5577 used `torch.isin`, which on CUDA sorts
through `unique` and syncs). A slot an `alloc` hands out is checked against `in_use`, one bool per slot on the
allocator's device, set at each alloc and cleared at each free (`allocated_slots_free`): the cost of the alloc's size,
not of the rows' length; the rows are read only to name a finding's holder.

That is tensor work on the device the tensors live on, with no host sync on the checked path (no `isin`, `unique`,
`nonzero`, `.item()`, boolean-mask indexing or python `if` on a device tensor; `in_use` is updated by `index_fill_`).
What needs the host is the answer. `SPECFLIP_GUARD_SLOT_VALUES` (shim/settings.py) and the guard's mode say how it is
read (`path_for`):
* auto (default): host tensors (a CPU server, the tests) are judged at the hook, before the call returns (NOW); on a
  device, the guard in assert mode takes STOP, in warn or trace mode LATE.
* sync: judged at the hook on every device (NOW: a host-device sync per alloc and per free of a copy).
* late: LATE on every device: the answer (a bool) is copied into pinned host memory without blocking, an event recorded
  behind it, and read once the event has completed (the finding comes at the next allocator hook, after the forward
  that followed the fault); on host tensors too, which is how the CPU tests reach it.
* assert: STOP in the guard's assert mode (LATE in warn and trace mode, which never take the server down), on every
  device: the answer, one int64 that names a hit (-1: none), is copied into a ring of pinned host memory without
  blocking, then `torch._assert_async(answer < 0)` runs on the same stream. At a hit the device stops there: no kernel
  queued after it runs (the next forward waits on the scheduler's stream), and the process meets the CUDA error at
  its next CUDA call, in SGLang's code or the guard's. The adapter's hook around `Scheduler.run_event_loop` then reads
  the ring (host memory, final once the device has stopped) and raises the finding from the CUDA error
  (`SpecFlipViolation`, logged), before SGLang logs the exception and stops the server. A clean answer is never read.
  On host tensors the assert raises at once: the same path, run on the CPU (tests/test_guard_slot_values.py).
* off: not checked.
Every check and bitmap update runs on the stream current at its hook. SGLang runs its allocs and frees on one stream,
the scheduler's (read in the newest and the GPU host's lines' loops: `prepare_for_decode`, `prepare_for_extend`, the
releases; the forward stream only runs the model), so they are ordered among themselves; hooks on two streams at once
could see each other's marks.
The rows' numbers (which row, its allocation) are python ints the adapter reads off the live requests; only the
answer and, at a finding, the positions that hit are read back (NOW, LATE); a STOP finding is decoded from its answer
alone (a freed copy: one slot, its row and position; an alloc: one slot, its holder not read).

Measured: on one H100 (2026-12-06, code 8c6c165, bench/gpu/results/2026-12-06_59347e0/workload_d/) the guard in
assert mode with the LATE path of that code ran at 0.80-0.92x of `auto` alone; on an H200 (code 886650f,
bench/gpu/results/2026-12-06_886650f/) bench/gpu/slot_values_check.py found that path's alloc made two host syncs per
call (`in_use[slots] = True`) and its release one, this path none, and the server with this path (auto: STOP in
assert mode) ran at 0.981-1.036x of `auto` alone over three traces (docs/guard.md, "On a GPU"). `off` (or `late`) is
the operator's way out if it costs more elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from statemodel.identity import HOLDER_UNREAD, SlotHeld, allocated_slots_free, freed_slots_unowned
from statemodel.invariants import Violation

MODES = ("auto", "sync", "late", "assert", "off")
FREE, ALLOC = "free", "alloc"
# how a check's answer is read (`SlotValueCheck.path`, from the mode, the guard's mode and the tensors' device)
NOW, LATE, STOP, OFF = "now", "late", "stop", "off"
STOPPED = "the device stopped at this check"  # in a STOP finding's action


def path_for(mode: str, stop: bool, on_host: bool) -> str:
    """How a check of `mode` is answered: NOW (at the hook), LATE (at a later allocator hook), STOP (a device assert
    behind a copy of the answer) or OFF. `stop`: the guard stops at a finding (assert mode); warn and trace mode never
    take the server down, so there a device check is LATE. `on_host`: the allocator's tensors are host tensors."""
    if mode == "off":
        return OFF
    if mode == "sync" or (mode == "auto" and on_host):
        return NOW
    if mode in ("auto", "assert") and stop:
        return STOP
    return LATE


def _joined(tensors: list[Any]) -> Any:
    """1-D slot tensors as one (None: none)."""
    if not tensors:
        return None
    import torch

    return tensors[0] if len(tensors) == 1 else torch.cat([t.to(tensors[0].dtype) for t in tensors])


class LiveRow(NamedTuple):
    """Positions [lo, hi) of a live request's req_to_token row whose slots nobody else may free or allocate."""

    row: int
    lo: int
    hi: int
    rid: int  # the model's request index (-1: not tracked)


class _Pending(NamedTuple):
    """A LATE check waiting for its answer."""

    answer: Any  # a 0-d bool tensor in (pinned) host memory
    event: Any  # a CUDA event recorded after the copy (None: the copy is done)
    describe: Callable[[], list[Violation]]  # the violations, once the answer says it hit
    action: str


STOP_ANSWERS = 1024  # the STOP answers kept (a ring): far more checks than the host runs ahead of the device


class SlotValueCheck:
    """Judges frees of copies and allocs by slot value; holds the device checks not answered yet."""

    def __init__(self, mode: str = "auto", *, stop: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"slot-value mode {mode!r} (expected one of {', '.join(MODES)})")
        self.mode = mode
        self.stop = stop  # the guard stops at a finding (assert mode): `path_for`
        self.path: str | None = OFF if mode == "off" else None  # set by `track` (None: no allocator yet)
        self.pending: list[_Pending] = []
        # STOP: the answers (int64, -1: no hit), in pinned host memory on a device, written by the checks' copies in
        # turn; (describe, action) of the check that wrote each; the next to write; the stream they were queued on
        self._answers: Any = None
        self._described: list[tuple[Callable[[int], list[Violation]], str] | None] = []
        self._next_answer = 0
        self._stream: Any = None
        self.deferred: list[Any] = []  # copies freed since the last alloc, judged again there
        # the radix tree's eviction frees each evicted leaf's slots, a copy of its values, one free per leaf (97 frees
        # for a 3,000-token prompt over short leaves): inside it (`begin_batch` ... `end_batch`, nested) those frees
        # are held and judged by one scan at its end (`take_batch`); nothing allocates and no row moves in between
        self.batching = 0
        self.batched: list[Any] = []
        self.checked = 0  # row scans run (measurement and tests)
        self.allocs = 0  # allocs checked against `in_use`
        self.allocated_slots = 0  # the slots they handed out
        # slot -> handed out by an alloc the guard saw and not freed since (the allocator's device): an alloc is
        # checked against it at the cost of its own size, not the live rows' length
        self.in_use: Any = None
        # the row scan's scratch bitmap on the same device, one bool per slot value and two more (`_scan`): all False
        # between scans
        self._marks: Any = None
        self._allocator: Any = None

    @property
    def on(self) -> bool:
        return self.path != OFF

    def track(self, allocator: Any) -> None:
        """The allocator whose slots `in_use` follows (a new one starts it afresh: its slots in use before are not
        known, and not judged); sets `path` for its device. The hooks ask `on` after this."""
        if allocator is not self._allocator:
            import torch

            self._allocator = allocator
            self.path = path_for(self.mode, self.stop, torch.device(allocator.device).type == "cpu")
            if self.path == OFF:
                self.in_use = self._marks = None
                return
            self.in_use = torch.zeros(int(allocator.size) + 2, dtype=torch.bool, device=allocator.device)
            self._marks = torch.zeros(int(allocator.size) + 4, dtype=torch.bool, device=allocator.device)
            if self.path == STOP and self._answers is None:
                on_host = torch.device(allocator.device).type == "cpu"
                self._answers = torch.full((STOP_ANSWERS,), -1, dtype=torch.int64, pin_memory=not on_host)
                self._described = [None] * STOP_ANSWERS

    def released(self, slots: Any) -> None:
        """A free: its slots are free again (every free, row view or copy)."""
        import torch

        if self.in_use is not None and slots.numel():
            self.in_use.index_fill_(0, slots.to(torch.int64), False)

    def allocated(self, slots: Any, rows: Callable[[], list[LiveRow]], req_to_token: Any,
                  action: str) -> list[Violation]:
        """An alloc: a slot it hands out that is still in use (handed out before and never freed since: put back on
        the free list behind free()'s back) is a violation, named with the live rows that hold it (`rows`, read only
        at a finding). Then its slots are in use."""
        if self.in_use is None or slots.numel() == 0:
            return []
        import torch

        index = slots.to(torch.int64)
        hit = self.in_use[index]
        self.in_use.index_fill_(0, index, True)
        self.allocs += 1
        self.allocated_slots += int(slots.numel())
        if self.path == NOW:  # judged now: no copy kept
            return self._alloc_found(slots[hit], rows(), req_to_token, action, False) if bool(hit.any()) else []
        on_host = slots.device.type == "cpu"
        if self.path == STOP:  # the largest slot handed out in use, else -1; its holder is not read (no row scan)
            return self._stop(torch.where(hit, index, -1).amax(), on_host,
                              lambda code: self._alloc_stopped(code, f"{action} ({STOPPED})"), action)
        taken = slots.clone()
        return self._late(hit.any(), on_host,
                          lambda: self._alloc_found(taken[hit], rows(), req_to_token, action, True), action)

    def check(self, slots: Any, req_to_token: Any, rows: list[LiveRow], kind: str, action: str) -> list[Violation]:
        """`slots` (a 1-D integer tensor) freed, against `rows` of `req_to_token`: the violations found now; a LATE
        check is queued for `judge_due` and finds nothing now; a STOP check is queued and asserted on the device."""
        if not rows or slots.numel() == 0:
            return []
        block, hit = self._scan(slots, req_to_token, rows)
        self.checked += 1
        frozen = tuple(rows)
        if self.path == NOW:
            return self._found(block, hit, frozen, kind, action, late=False) if bool(hit.any()) else []
        on_host = req_to_token.device.type == "cpu"
        if self.path == STOP:  # the hit with the largest (slot, row, position), as one int64 (`_stopped` decodes it)
            import torch

            width = hit.numel()
            flat = torch.arange(width, device=hit.device).view(hit.shape)
            code = torch.where(hit, block.to(torch.int64) * width + flat, -1).amax()
            return self._stop(code, on_host, lambda c: self._stopped(c, width, hit.shape[1], frozen, kind,
                                                                     f"{action} ({STOPPED})"), action)
        return self._late(hit.any(), on_host, lambda: self._found(block, hit, frozen, kind, action, late=True), action)

    def _late(self, any_hit: Any, on_host: bool, describe: Callable[[], list[Violation]],
              action: str) -> list[Violation]:
        """LATE: the answer copied into pinned host memory without blocking, a CUDA event behind it; read by
        `judge_due` at a later allocator hook once the event has completed."""
        import torch

        answer = torch.empty((), dtype=torch.bool, pin_memory=not on_host)
        answer.copy_(any_hit, non_blocking=not on_host)
        event = None
        if not on_host:
            event = torch.cuda.Event()
            event.record()
        self.pending.append(_Pending(answer, event, describe, action))
        return []

    def _stop(self, code: Any, on_host: bool, describe: Callable[[int], list[Violation]],
              action: str) -> list[Violation]:
        """STOP: the answer (`code`, -1: no hit) copied into the next of the pinned answers without blocking, then
        `torch._assert_async(code < 0)` on the same stream: at a hit the device stops there, so no kernel queued after
        it (the next forward) runs, and the process meets the CUDA error at its next CUDA call. The answer, copied
        before the assert, is read then (`stopped_findings`, from the adapter's hook around the scheduler's event
        loop); a clean answer is never read (no event, no query). On host tensors the assert raises at once: the same
        path, run on the CPU."""
        import torch

        i = self._next_answer
        self._next_answer = (i + 1) % STOP_ANSWERS
        self._answers[i].copy_(code, non_blocking=not on_host)
        self._described[i] = (describe, action)
        if not on_host:
            self._stream = torch.cuda.current_stream()
        torch._assert_async(code < 0)
        return []

    def _scan(self, slots: Any, req_to_token: Any, rows: list[LiveRow]) -> tuple[Any, Any]:
        """The rows' slots ([rows, longest]) and which of them, inside [lo, hi), are among `slots`; no host sync:
        the freed slots are marked in `marks` (scatter), the rows' slots inside their ranges read there (gather),
        the marks cleared again (scatter). Slot values outside the pool are never among them (as with `isin`)."""
        import torch

        device = req_to_token.device
        longest = max(r.hi for r in rows)
        spans = torch.tensor([(r.row, r.lo, r.hi) for r in rows], dtype=torch.int64, pin_memory=device.type != "cpu")
        if device.type != "cpu":  # pinned and non-blocking: a pageable host-to-device copy would wait for the stream
            spans = spans.to(device, non_blocking=True)
        block = req_to_token[spans[:, 0], :longest]
        at = torch.arange(longest, device=device)
        inside = (at >= spans[:, 1:2]) & (at < spans[:, 2:3])
        marks = self._marks if self._marks is not None else self._untracked_marks(slots, req_to_token)
        # slot values [0, size); `size` is never marked (read for the positions outside the ranges), `size + 1` takes
        # the freed values outside the pool
        size = marks.numel() - 2
        freed = slots.to(torch.int64)
        freed = torch.where((freed >= 0) & (freed < size), freed, size + 1)
        marks.index_fill_(0, freed, True)
        value = block.to(torch.int64)
        hit = marks[torch.where(inside & (value >= 0) & (value < size), value, size)]
        marks.index_fill_(0, freed, False)
        return block, hit

    @staticmethod
    def _untracked_marks(slots: Any, req_to_token: Any) -> Any:
        """A scan with no allocator tracked (none of the adapter's: it tracks first): a bitmap as large as the
        values need, read off the tensors (a host sync on a device)."""
        import torch

        size = int(max(int(slots.max()), int(req_to_token.max()), 0)) + 1
        return torch.zeros(size + 2, dtype=torch.bool, device=req_to_token.device)

    def defer(self, slots: Any) -> None:
        """Keep a freed copy's values for the next alloc (cloned: the caller may reuse its tensor)."""
        self.deferred.append(slots.clone())

    def take_deferred(self) -> Any:
        """The copies freed since the last alloc, as one tensor (None: none)."""
        taken, self.deferred = self.deferred, []
        return _joined(taken)

    def begin_batch(self) -> None:
        """A batch of frees opens (the tree's eviction): `hold` keeps them until its end."""
        self.batching += 1

    def hold(self, slots: Any) -> None:
        """A free inside a batch, judged at the batch's end (cloned: the caller may reuse its tensor)."""
        self.batched.append(slots.clone())

    def end_batch(self) -> Any:
        """A batch closes; at the outermost one's end, the frees held in it as one tensor (None: none, or a batch
        still open)."""
        self.batching = max(0, self.batching - 1)
        return None if self.batching else self.take_batch()

    def take_batch(self) -> Any:
        """The frees held so far, as one tensor (None: none); an alloc inside a batch takes them first."""
        if not self.batched:  # every alloc asks: nothing to swap
            return None
        taken, self.batched = self.batched, []
        return _joined(taken)

    def judge_due(self) -> list[tuple[str, list[Violation]]]:
        """(action, violations) of each queued LATE check whose answer has arrived and hit (never waits for one that
        has not arrived)."""
        if not self.pending:
            return []
        found: list[tuple[str, list[Violation]]] = []
        waiting = []
        for p in self.pending:
            if p.event is not None and not p.event.query():
                waiting.append(p)
            elif bool(p.answer):
                found.append((p.action, p.describe()))
        self.pending = waiting
        return found

    def stopped_findings(self) -> list[tuple[str, list[Violation]]]:
        """After the process met an error: (action, violations) of each STOP check whose answer says it hit -- the
        device assert that stopped the device. Reads host memory only: after a device-side assert every CUDA call
        fails, and the answers, each copied before its assert in stream order, are final. While the stream the
        checks ran on still has work in flight (the device is fine: the error is not an assert's), nothing."""
        if self._answers is None:
            return []
        if self._stream is not None:
            try:
                if not self._stream.query():
                    return []
            except RuntimeError:  # the CUDA context failed (torch.AcceleratorError is a RuntimeError): nothing runs
                pass
        found: list[tuple[str, list[Violation]]] = []
        for i, value in enumerate(self._answers.tolist()):
            described = self._described[i]
            if value >= 0 and described is not None:
                describe, action = described
                found.append((action, describe(value)))
                self._answers[i] = -1
        return found

    @staticmethod
    def _found(block: Any, hit: Any, rows: tuple[LiveRow, ...], kind: str, action: str,
               *, late: bool) -> list[Violation]:
        """The violation for a row scan that hit (reads the hit positions: a finding's cost only)."""
        held = []
        for i, position in hit.nonzero().tolist():
            r = rows[i]
            held.append(SlotHeld(slot=int(block[i, position]), rid=r.rid, row=r.row, position=position))
        what = f"{action} (judged one allocator call late)" if late else action
        return freed_slots_unowned(held, what) if kind == FREE else allocated_slots_free(held, what)

    def _alloc_found(self, slots: Any, rows: list[LiveRow], req_to_token: Any, action: str,
                     late: bool) -> list[Violation]:
        """The violation for slots an alloc handed out while in use: where a live row holds one, that row and
        position; else the slot alone (the radix tree's, or a request's the guard does not see)."""
        held: list[SlotHeld] = []
        if rows:
            block, hit = self._scan(slots, req_to_token, rows)
            for i, position in hit.nonzero().tolist():
                r = rows[i]
                held.append(SlotHeld(slot=int(block[i, position]), rid=r.rid, row=r.row, position=position))
        named = {h.slot for h in held}
        held += [SlotHeld(slot=s, rid=-1, row=-1, position=-1) for s in slots.tolist() if s not in named]
        what = f"{action} (judged one allocator call late)" if late else action
        return allocated_slots_free(held, what)

    @staticmethod
    def _stopped(code: int, width: int, longest: int, rows: tuple[LiveRow, ...], kind: str,
                 action: str) -> list[Violation]:
        """The violation of a STOP row scan from its answer alone (`check` packs slot * width + row * longest +
        position): one of the slots that hit, and the row holding it."""
        slot, flat = divmod(code, width)
        i, position = divmod(flat, longest)
        r = rows[i]
        held = [SlotHeld(slot=slot, rid=r.rid, row=r.row, position=position)]
        return (freed_slots_unowned(held, action, counted=False) if kind == FREE
                else allocated_slots_free(held, action, counted=False))

    @staticmethod
    def _alloc_stopped(code: int, action: str) -> list[Violation]:
        """The violation of a STOP alloc check from its answer alone: the largest slot handed out in use (who holds
        it is not read: that would take a row scan at every alloc)."""
        return allocated_slots_free([SlotHeld(slot=code, rid=-1, row=HOLDER_UNREAD, position=-1)], action,
                                    counted=False)
