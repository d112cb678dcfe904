"""The guard's identity checks (issue 18): which row positions a step frees, and each request's committed output token
for token. The rules are `statemodel.identity`'s; this is the bookkeeping that applies them to what the adapter
observed (SGLang-free: an adapter hands over row ranges and python token lists).

What each check reads, and where (docs/guard.md, "Identity checks"):
* freed positions: `allocator.free(index)` where `index` is a view of `req_to_token` (`_base`, `storage_offset()`,
  `numel()`: tensor metadata, never values), recorded only inside a window the guard opens around a step that frees
  on purpose (`release_kv_cache`, a switch's flip between `notify_flip_starting` and `notify_flip`); each request's
  row, `cache_protected_len` and `kv_allocated_len` (python ints) before and after. A free of a tensor that is not a
  view of a row (a copy, a cat) is counted here, and judged by its values (next item).
* freed and allocated slots by value (`shim.guard.slot_values`): a free of a tensor that is no row view against the
  live rows' slots, every `alloc` against the slots in use; read at the hook on host tensors; on device tensors one
  allocator call late, or (assert mode) asserted on the device, its finding raised when the process meets the error
  (SPECFLIP_GUARD_SLOT_VALUES).
* committed output: `req.output_ids` (a python list on the host) at `prepare_for_decode`, at each release and at a
  prefill, against the model's `committed` and the length and token the guard saw there last.
"""

from __future__ import annotations

from collections.abc import Sequence

from shim.guard.config import GuardConfig, Mode
from shim.guard.observe import ObservedRequest
from shim.guard.slot_values import SlotValueCheck
from statemodel.actions import Action
from statemodel.design import Design
from statemodel.identity import (
    RowOwner,
    RowRange,
    committed_output_kept,
    output_bound,
    output_not_dropped,
    output_within_bound,
    slots_freed_owned,
    writes_within_allocation,
)
from statemodel.invariants import Violation
from statemodel.state import State


class FreeWindow:
    """The frees recorded while one step that frees on purpose runs (nested: a release inside a flip's drain)."""

    __slots__ = ("frees", "owners_before", "unattributed")

    def __init__(self, owners_before: dict[int, tuple[str, int, int]]) -> None:
        self.frees: list[RowRange] = []
        self.unattributed = 0  # frees of a tensor that is not a view of a req_to_token row
        # row -> (SGLang rid, own start (cache_protected_len), allocated length) before the step
        self.owners_before = owners_before


class IdentityChecks:
    """The identity half of `shim.guard.core.Guard` (a mixin)."""

    index: dict[str, int]
    state: State
    config: GuardConfig

    def _init_identity(self) -> None:
        # frees of copies and every alloc, judged by slot value (shim/guard/slot_values.py)
        self.slot_values = SlotValueCheck(self.config.slot_values, stop=self.config.mode is Mode.ASSERT)
        self.outputs_over_committed: list[tuple[int, int]] = []
        self.free_windows: list[FreeWindow] = []
        self.unattributed_frees = 0
        # SGLang rid -> (output tokens seen, the last of them) at the guard's last look
        self.outputs_seen: dict[str, tuple[int, int]] = {}

    # --- freed positions --------------------------------------------------------------------------------------

    def open_free_window(self, owners_before: dict[int, tuple[str, int, int]]) -> None:
        self.free_windows.append(FreeWindow(owners_before))

    def record_free(self, free: RowRange | None) -> None:
        """An `allocator.free` inside the innermost open window (None: not a view of a row)."""
        if not self.free_windows:
            return
        window = self.free_windows[-1]
        if free is None:
            window.unattributed += 1
            self.unattributed_frees += 1
        else:
            window.frees.append(free)

    def close_free_window(self, allocated_after: dict[int, int | None], action: str) -> list[Violation]:
        """The step ended: `allocated_after` row -> allocated length now (None: the row was released). Returns what
        `statemodel.identity.slots_freed_owned` finds."""
        window = self.free_windows.pop()
        if not window.frees:
            return []
        owners = []
        for row, (rid, own_start, before) in window.owners_before.items():
            index = self.index.get(rid)
            owners.append(RowOwner(rid=-1 if index is None else index, row=row, own_start=own_start,
                                   allocated_before=before, allocated_after=allocated_after.get(row)))
        return slots_freed_owned(window.frees, owners, action)

    def slot_value_findings(self, found: list[Violation], action: str, where: str) -> None:
        """Report what `slot_values` found at an allocator hook (no model step: the counts move with the step that
        frees or allocates; this is the identity the counts cannot see)."""
        if found:
            self._report(Action(action), tuple(found), where=where)

    def report_stopped(self, cause: BaseException) -> None:
        """The process met an error (`cause`): where a slot-value check's device assert stopped the device (its answer,
        copied to host memory before the assert, says it hit), raise its finding from `cause`
        (`SpecFlipViolation`, assert mode), logged first: the scheduler's log then names the fault, not only the CUDA
        error. Else return (not ours: the caller re-raises `cause`)."""
        from shim.guard.report import SpecFlipViolation, logger

        for action, found in self.slot_values.stopped_findings():
            try:
                self.slot_value_findings(found, action.split()[0],
                                         f"TokenToKVPoolAllocator.{action}: its device assert stopped the device; "
                                         f"the answer read when the process met the error ({type(cause).__name__})")
            except SpecFlipViolation as finding:
                logger.error("%s", finding)
                raise finding from cause

    def _report(self, action: Action, found: tuple[Violation, ...], where: str | None = None) -> None:
        raise NotImplementedError

    # --- committed output ---------------------------------------------------------------------------------------

    def output_violations(self, outputs: Sequence[tuple[str, Sequence[int]]], action: str) -> list[Violation]:
        """Each request's output tokens (SGLang rid, `req.output_ids`) against the model's committed count and the
        guard's last look; remembers this look."""
        found: list[Violation] = []
        seen = self.outputs_seen
        requests = self.state.requests
        index = self.index
        for rid, tokens in outputs:
            i = index.get(rid)
            if i is None:
                continue
            n = len(tokens)
            last = seen.get(rid)
            # the common case inline (every running request, every step): no fewer tokens than seen, the last one
            # seen unchanged, no more than committed; the rule itself only where one of these fails
            if last is None:
                ok = n <= requests[i].committed
            else:
                m = last[0]
                ok = m <= n <= requests[i].committed and (not m or tokens[m - 1] == last[1])
            if not ok:
                seen_len, seen_token = last if last is not None else (0, None)
                problems = committed_output_kept(i, output_bound(requests[i], self.design_for_identity()), tokens,
                                                 seen_len, seen_token, action)
                if problems:
                    found.extend(problems)
                    if n < seen_len:
                        continue  # keep the longer look: the drop stays visible
            if last is None or last[0] != n:
                seen[rid] = (n, tokens[-1] if n else -1)
        return found

    def dropped_output_violations(self, reqs: Sequence[ObservedRequest], action: str) -> list[Violation]:
        """In the normal loop, at `prepare_for_decode` (every result processed, the round settled): each observed
        request's output length (`len(req.output_ids)`, read with the request anyway) against the model's `committed`
        (`statemodel.identity.output_not_dropped`): a token committed since the last look and dropped is found before
        the step runs. One comparison per request."""
        found: list[Violation] = []
        requests, index = self.state.requests, self.index
        for obs in reqs:
            i = index.get(obs[0])
            if i is not None and obs[3] < requests[i].committed:  # ObservedRequest.output_len
                found.extend(output_not_dropped(i, obs[3], requests[i].committed, action))
        return found

    def over_committed_violations(self, state: State, action: str) -> list[Violation]:
        """The requests the overlays since the last call saw holding more output tokens than the model's `committed`
        (`ObservedStateSync._overlay` notes them: every observation of a request compares its `len(req.output_ids)`,
        at no other cost): a violation where that is more than `statemodel.identity.output_bound` allows in `state`."""
        noted, self.outputs_over_committed = self.outputs_over_committed, []
        found: list[Violation] = []
        design = self.design_for_identity()
        for i, n in noted:
            if i < len(state.requests):
                found.extend(output_within_bound(i, n, output_bound(state.requests[i], design), action))
        return found

    def write_violations(self, reqs: Sequence[ObservedRequest], width: int, action: str) -> list[Violation]:
        """Each request holding KV writes [seq_len, seq_len + width) inside its allocation (`seq_len`: the launch's
        seq_lens_cpu, on the overlap path SGLang's own copy of the device lengths, `FutureMap.resolve_seq_lens_cpu`)."""
        found: list[Violation] = []
        index = self.index
        # the observation unpacked by position, as the overlay does (ObservedRequest's field order is checked there)
        for rid, _, _, _, committed, own_allocated, committed_len, seq_len, holds_kv, _ in reqs:
            if not holds_kv:
                continue
            # absolute lengths: the observation's own counts lie past cache_protected_len
            allocated = own_allocated + committed_len - committed
            if committed_len <= seq_len and seq_len + width <= allocated:
                continue
            found.extend(writes_within_allocation(index.get(rid, -1), seq_len, width, committed_len, allocated,
                                                  action))
        return found

    def design_for_identity(self) -> Design:
        raise NotImplementedError

    def forget_output(self, rid: str) -> None:
        """A finished request is never seen again."""
        self.outputs_seen.pop(rid, None)
