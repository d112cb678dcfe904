"""Slot identity by value (issue 51): a free of a tensor that is no view of a `req_to_token` row, checked against
the slots the live requests' rows hold, and every `alloc`, checked against the slots in use.

`slots_freed_owned` judges a free of a row view by its positions, from tensor metadata (no value read). A free of a
copy of a row's values (`req_to_token[row, a:b].clone()`, an `index_select`, values computed by arithmetic) has no
positions: what identifies its slots is their values. They are checked against every live request's row,
`req_to_token[row, lo:hi]` (`statemodel.identity.freed_slots_unowned`): a gather of the live rows (one [rows, longest]
block), a mask of the positions inside each range, the freed slots marked in a bitmap of the pool's slots (a scatter),
read back at the block's values (a gather) and cleared, and `any()` as a 0-d tensor. No host sync: no `torch.isin`
(on CUDA it sorts through `unique`, which syncs), no boolean-mask indexing, `nonzero` or `.item()` on that path.
A slot an `alloc` hands out is checked against `in_use`, one bool per slot on the allocator's device, set at each
alloc and cleared at each free (`allocated_slots_free`): the cost of the alloc's size, not of the rows' length; the
rows are read only to name a finding's holder.

That is tensor work on the device the tensors live on. What needs the host is the answer, one bool.
`SPECFLIP_GUARD_SLOT_VALUES` (shim/settings.py) says when it is read:
* auto (default): host tensors (a CPU server, the tests) are judged at the hook, before the call returns; on a device
  the check is off. Measured on one H100 (2026-12-06, the GPU line of docs/releases.md, the 8B-class pair, code
  8c6c165, one round per trace, bench/gpu/results/2026-12-06_59347e0/workload_d/): the guard in assert mode with
  the device path on (then auto's device path, now `late`) ran at 0.80-0.92x of `auto` alone, where the guard
  without slot values had measured 0.994-1.019x (code b3a9830). The row scan's `torch.isin` sorts with `unique`, a
  host-device sync on CUDA, at every free of a copy; which part costs what on the device was not measured apart.
  Opt in with late or sync.
* sync: judged at the hook on every device (a host-device sync per alloc and per free of a copy).
* late: judged one allocator call later on every device: the bool is copied into pinned host memory without
  blocking, an event recorded behind it, and read once the event has completed (the finding comes at the next
  allocator hook, after the forward that followed the fault); on host tensors too, which is how the CPU tests reach it.
* off: not checked.
The rows' numbers (which row, its allocation) are python ints the adapter reads off the live requests; only the
answer and, at a finding, the positions that hit are read back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from statemodel.identity import SlotHeld, allocated_slots_free, freed_slots_unowned
from statemodel.invariants import Violation

MODES = ("auto", "sync", "late", "off")
FREE, ALLOC = "free", "alloc"


class LiveRow(NamedTuple):
    """Positions [lo, hi) of a live request's req_to_token row whose slots nobody else may free or allocate."""

    row: int
    lo: int
    hi: int
    rid: int  # the model's request index (-1: not tracked)


class _Pending(NamedTuple):
    """A device check waiting for its answer."""

    answer: Any  # a 0-d bool tensor in (pinned) host memory
    event: Any  # a CUDA event recorded after the copy (None: the copy is done)
    describe: Callable[[bool], list[Violation]]  # the violations, once the answer says it hit
    action: str


class SlotValueCheck:
    """Judges frees of copies and allocs by slot value; holds the device checks not answered yet."""

    def __init__(self, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"slot-value mode {mode!r} (expected one of {', '.join(MODES)})")
        self.mode = mode
        self.pending: list[_Pending] = []
        self.deferred: list[Any] = []  # copies freed since the last alloc, judged again there
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
        return self.mode != "off"

    def track(self, allocator: Any) -> None:
        """The allocator whose slots `in_use` follows (a new one starts it afresh: its slots in use before are not
        known, and not judged). In auto mode an allocator on a device turns the check off (the module's docstring
        says why); the hooks ask `on` after this."""
        if allocator is not self._allocator:
            import torch

            self._allocator = allocator
            if self.mode == "auto" and torch.device(allocator.device).type != "cpu":
                self.mode = "off"
                self.in_use = self._marks = None
                return
            self.in_use = torch.zeros(int(allocator.size) + 2, dtype=torch.bool, device=allocator.device)
            self._marks = torch.zeros(int(allocator.size) + 4, dtype=torch.bool, device=allocator.device)

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

        hit = self.in_use[slots]
        self.in_use.index_fill_(0, slots.to(torch.int64), True)
        self.allocs += 1
        self.allocated_slots += int(slots.numel())
        on_host = slots.device.type == "cpu"
        if self.mode == "sync" or (self.mode == "auto" and on_host):  # judged now: no copy kept
            return self._alloc_found(slots[hit], rows(), req_to_token, action, False) if bool(hit.any()) else []
        taken = slots.clone()
        return self._answer(hit.any(), on_host,
                            lambda late: self._alloc_found(taken[hit], rows(), req_to_token, action, late), action)

    def check(self, slots: Any, req_to_token: Any, rows: list[LiveRow], kind: str, action: str) -> list[Violation]:
        """`slots` (a 1-D integer tensor) freed, against `rows` of `req_to_token`: the violations found now; a
        device check in auto or late mode is queued for `judge_due` and finds nothing now."""
        if not rows or slots.numel() == 0:
            return []
        block, hit = self._scan(slots, req_to_token, rows)
        self.checked += 1
        frozen = tuple(rows)
        return self._answer(hit.any(), req_to_token.device.type == "cpu",
                            lambda late: self._found(block, hit, frozen, kind, action, late=late), action)

    def _answer(self, any_hit: Any, on_host: bool, describe: Callable[[bool], list[Violation]],
                action: str) -> list[Violation]:
        import torch

        if self.mode == "sync" or (self.mode == "auto" and on_host):
            return describe(False) if bool(any_hit) else []
        answer = torch.empty((), dtype=torch.bool, pin_memory=not on_host)
        answer.copy_(any_hit, non_blocking=not on_host)
        event = None
        if not on_host:
            event = torch.cuda.Event()
            event.record()
        self.pending.append(_Pending(answer, event, describe, action))
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
        size = marks.numel() - 2  # slot values [0, size); `size`: read for the positions outside; `size + 1`: a
        freed = slots.to(torch.int64)  # freed value outside the pool lands there
        freed = torch.where((freed >= 0) & (freed < size), freed, size + 1)
        marks.index_fill_(0, freed, True)
        held = torch.where(inside, block.to(torch.int64), size).clamp_(0, size)
        hit = marks[held]
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
        if not self.deferred:
            return None
        import torch

        taken, self.deferred = self.deferred, []
        return taken[0] if len(taken) == 1 else torch.cat([t.to(taken[0].dtype) for t in taken])

    def judge_due(self) -> list[tuple[str, list[Violation]]]:
        """(action, violations) of each queued device check whose answer has arrived and hit (never waits for one
        that has not arrived)."""
        if not self.pending:
            return []
        found: list[tuple[str, list[Violation]]] = []
        waiting = []
        for p in self.pending:
            if p.event is not None and not p.event.query():
                waiting.append(p)
            elif bool(p.answer):
                found.append((p.action, p.describe(True)))
        self.pending = waiting
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
