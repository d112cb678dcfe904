"""Identity rules: which KV positions a step frees, and which output tokens a request keeps.

The model counts slots (`Request.kv_held`, `kv_reserved`, `State.kv_free`) and output tokens (`Request.committed`);
a bug that keeps the counts balanced (a live slot freed and another leaked; a token dropped and another appended)
passes every count invariant. These rules refine the counts with identities the runtime guard can observe on the
host: the row positions (`req_to_token[row, start:end]`) a free hands the allocator, the slot values a free of a copy
or an alloc hands over (`freed_slots_unowned`, `allocated_slots_free`), and the output token list.
They are the one definition of these rules; the guard (`shim/guard/identity.py`) applies them to what it observed.
The checker does not explore positions or token values (its states carry counts only), so these rules are not in
`statemodel.invariants.INVARIANTS`; each one is stated in terms of the model's own counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from statemodel.design import Design
from statemodel.invariants import Violation
from statemodel.state import Request

SLOTS_FREED_OWNED = "slots_freed_owned"
COMMITTED_OUTPUT_KEPT = "committed_output_kept"
WRITES_WITHIN_ALLOCATION = "writes_within_allocation"
SLOTS_ALLOCATED_FREE = "slots_allocated_free"
IDENTITY_INVARIANT_NAMES: tuple[str, ...] = (SLOTS_FREED_OWNED, COMMITTED_OUTPUT_KEPT, WRITES_WITHIN_ALLOCATION,
                                             SLOTS_ALLOCATED_FREE)


@attrs.frozen
class RowRange:
    """Positions [start, end) of one req_to_token row that a free handed back to the allocator."""

    row: int
    start: int
    end: int


@attrs.frozen
class RowOwner:
    """A request's row in req_to_token and its own positions before and after the step: it owns
    [own_start, allocated_before) before; `allocated_after` None when the step released the whole row."""

    rid: int
    row: int
    own_start: int  # cache_protected_len: positions before it are the radix tree's
    allocated_before: int
    allocated_after: int | None


def slots_freed_owned(frees: Sequence[RowRange], owners: Sequence[RowOwner], action: str) -> list[Violation]:
    """A step frees only positions its requests own, and a request that keeps its row frees exactly the positions
    that left its allocation, [allocated_after, allocated_before): a position freed outside that range is a live slot
    (or another request's, or one already free: a double free); one that left the allocation unfreed is leaked.
    A request released whole frees within [own_start, allocated_before) (the tree may keep some; counted by
    kv_conservation)."""
    by_row = {o.row: o for o in owners}
    ranges: dict[int, list[RowRange]] = {}
    problems: list[Violation] = []
    for f in frees:
        owner = by_row.get(f.row)
        if owner is None:
            problems.append(Violation(
                SLOTS_FREED_OWNED,
                f"{action} freed positions [{f.start}, {f.end}) of req_to_token row {f.row}, which no request of "
                f"the step owns", expected="positions of the step's own requests",
                actual=f"row {f.row} [{f.start}, {f.end})"))
            continue
        ranges.setdefault(f.row, []).append(f)
    for o in owners:
        mine = ranges.get(o.row, [])
        # the rule below reads sets of positions, as long as the request's row; where the ranges alone show it holds
        # (every one inside the own part, or together exactly the part that left the allocation) it cannot find
        # anything: skipped, so a release costs the number of frees, not the context's length
        if _all_within(mine, o.own_start, o.allocated_before) if o.allocated_after is None \
                else _tile(mine, o.allocated_after, o.allocated_before):
            continue
        got = {p for f in mine for p in range(f.start, f.end)}
        if o.allocated_after is None:
            outside = sorted(p for p in got if not o.own_start <= p < o.allocated_before)
            if outside:
                problems.append(Violation(
                    SLOTS_FREED_OWNED,
                    f"{action} of request {o.rid} freed {len(outside)} positions of its row outside its own "
                    f"[{o.own_start}, {o.allocated_before}) (first: {outside[0]})", (o.rid,),
                    expected=f"within [{o.own_start}, {o.allocated_before})", actual=f"{_spans(outside)}"))
            continue
        want = set(range(o.allocated_after, o.allocated_before))
        if got == want:
            continue
        extra, leaked = sorted(got - want), sorted(want - got)
        parts = []
        if extra:
            parts.append(f"freed {_spans(extra)}, which it still holds or never held (a live slot freed, or a "
                         f"double free)")
        if leaked:
            parts.append(f"left {_spans(leaked)} out of its allocation without freeing them (leaked)")
        problems.append(Violation(
            SLOTS_FREED_OWNED,
            f"{action} took request {o.rid}'s allocation from {o.allocated_before} to {o.allocated_after} "
            f"positions but " + "; ".join(parts), (o.rid,),
            expected=f"freed [{o.allocated_after}, {o.allocated_before})",
            actual=f"freed {_spans(sorted(got)) or 'nothing'}"))
    return problems


@attrs.frozen
class SlotHeld:
    """A KV slot (an index into the KV pool, a value of `req_to_token`) that a live request's row holds at `position`,
    inside its allocation [0, kv_allocated_len): its own KV, or the radix tree's prefix it reads."""

    slot: int
    rid: int  # the model's request index (-1: a request the guard does not track)
    row: int  # -1: no live row holds it; HOLDER_UNREAD: not read (the guard's device stopped at the check)
    position: int


HOLDER_UNREAD = -2  # SlotHeld.row of a slot whose holder was not read (shim/guard/slot_values.py, the device assert)


def freed_slots_unowned(held: Sequence[SlotHeld], action: str, *, counted: bool = True) -> list[Violation]:
    """Slot identity by value: a free hands the allocator only slots no other live request holds. `held`: the freed
    slots some other request's row still holds inside its allocation (a copy of its row's values freed, a gather, a
    computed index): after the free the allocator may hand them to a new request while that one still reads and
    writes them. Part of `slots_freed_owned`, which judges a free of a row view by its positions. `counted` False:
    `held` is one of them, their number not known (the guard's device assert reads one)."""
    if not held:
        return []
    return [Violation(
        SLOTS_FREED_OWNED,
        f"{action} freed {_number(held, counted)}slots that other live requests' rows still hold "
        f"({'first' if counted else 'one of them'}: slot {held[0].slot} at position {held[0].position} of row "
        f"{held[0].row})", tuple(dict.fromkeys(h.rid for h in held if h.rid >= 0)),
        expected="freed slots held by no other live request",
        actual=_slots(held))]


def allocated_slots_free(held: Sequence[SlotHeld], action: str, *, counted: bool = True) -> list[Violation]:
    """The allocator hands out only free slots: a slot it returns that it handed out before and that was not freed
    since is still in use (a live request's row holds it, or the radix tree does): it was put back on the free list
    behind free()'s back, and the new owner's KV would overwrite the live one's. `held`: those slots, each with the
    live row holding it where one does (row -1: none; HOLDER_UNREAD: not read). `counted` False: `held` is one of
    them, their number not known."""
    if not held:
        return []
    first = held[0]
    return [Violation(
        SLOTS_ALLOCATED_FREE,
        f"{action} handed out {_number(held, counted)}slots still in use: allocated before and not freed since "
        f"({'first' if counted else 'one of them'}: slot {first.slot}, {_holder(first)})",
        tuple(dict.fromkeys(h.rid for h in held if h.rid >= 0)),
        expected="free slots only", actual=_slots(held))]


def _number(held: Sequence[SlotHeld], counted: bool) -> str:
    return f"{len(held)} " if counted else ""


def _holder(h: SlotHeld) -> str:
    if h.row >= 0:
        return f"at position {h.position} of row {h.row}"
    return "in use, its holder not read" if h.row == HOLDER_UNREAD else "in use, in no live row"


def _slots(held: Sequence[SlotHeld], shown: int = 4) -> str:
    text = ", ".join(f"slot {h.slot} (row {h.row} position {h.position})" if h.row >= 0
                     else f"slot {h.slot} ({_holder(h)})" for h in held[:shown])
    return text + (f" and {len(held) - shown} more" if len(held) > shown else "")


def _all_within(ranges: Sequence[RowRange], start: int, end: int) -> bool:
    """Every position of `ranges` lies in [start, end)."""
    return all(start <= f.start and f.end <= end for f in ranges if f.end > f.start)


def _tile(ranges: Sequence[RowRange], start: int, end: int) -> bool:
    """`ranges` cover [start, end) exactly, each position once."""
    at = start
    for lo, hi in sorted((f.start, f.end) for f in ranges if f.end > f.start):
        if lo != at:
            return False
        at = hi
    return at == end


def writes_within_allocation(rid: int, start: int, width: int, committed_len: int, allocated_len: int,
                             action: str) -> list[Violation]:
    """A forward writes row positions [start, start + width) of a request (start: its seq_len as the forward
    launches with it): never over a committed token (start >= kv_committed_len) and only inside its own allocation
    (start + width <= kv_allocated_len): a position past it holds a stale entry, a slot free in the allocator or
    another request's."""
    if committed_len <= start and start + width <= allocated_len:
        return []
    return [Violation(
        WRITES_WITHIN_ALLOCATION,
        f"{action} writes positions [{start}, {start + width}) of request {rid}'s row; it has {committed_len} "
        f"committed and {allocated_len} allocated", (rid,),
        expected=f"within [{committed_len}, {allocated_len})", actual=f"[{start}, {start + width})")]


def output_bound(r: Request, design: Design) -> int:
    """The most output tokens request `r` may hold: what its steps committed; for a request done, the run a verify
    committed past max_new_tokens too where the design's worker does (`Design.verify_advances_past_finish`: the v2
    worker appends the whole accepted run), which seq_len took whole: every output token but the newest is in KV."""
    if r.done and design.verify_advances_past_finish:
        past = r.seq_len - r.prompt_len + 1
        return past if past > r.committed else r.committed
    return r.committed


def output_within_bound(rid: int, n: int, bound: int, action: str) -> list[Violation]:
    """The length half of `committed_output_kept`: never more output tokens than the steps committed."""
    if n <= bound:
        return []
    return [Violation(
        COMMITTED_OUTPUT_KEPT,
        f"request {rid} holds {n} output tokens at {action}; its steps committed {bound} (a token "
        f"appended twice?)", (rid,), expected=f"<= {bound} tokens", actual=f"{n} tokens")]


def output_not_dropped(rid: int, n: int, committed: int, action: str) -> list[Violation]:
    """Where the host holds every token the steps committed (SGLang's normal loop processes each result before the
    next step is prepared), a request's output holds `committed` tokens, the model's count: fewer is a committed token
    dropped (and the output trimmed by it), also one committed since the guard's last look."""
    if n >= committed:
        return []
    return [Violation(
        COMMITTED_OUTPUT_KEPT,
        f"request {rid} holds {n} output tokens at {action}; its steps committed {committed} (dropped)",
        (rid,), expected=f"{committed} tokens", actual=f"{n} tokens")]


def committed_output_kept(rid: int, bound: int, tokens: Sequence[int], seen_len: int, seen_token: int | None,
                          action: str) -> list[Violation]:
    """A request's output is what its steps committed, token for token: never more tokens than the model's
    `committed` allows (`output_bound`: a token appended twice), never fewer than an earlier look saw (a committed
    token dropped, a retraction included), and the token at the last position seen is still the one seen there.
    (A token committed since the last look and dropped again: `output_not_dropped`.)"""
    n = len(tokens)
    if n > bound:
        return output_within_bound(rid, n, bound, action)
    if n < seen_len:
        return [Violation(
            COMMITTED_OUTPUT_KEPT,
            f"request {rid} holds {n} output tokens at {action}; {seen_len} were committed before (dropped)",
            (rid,), expected=f">= {seen_len} tokens", actual=f"{n} tokens")]
    if seen_len and seen_token is not None and tokens[seen_len - 1] != seen_token:
        return [Violation(
            COMMITTED_OUTPUT_KEPT,
            f"request {rid}'s committed output token {seen_len - 1} changed from {seen_token} to "
            f"{tokens[seen_len - 1]} at {action}", (rid,), expected=str(seen_token), actual=str(tokens[seen_len - 1]))]
    return []


def _spans(positions: Sequence[int]) -> str:
    """Sorted positions as half-open ranges: [3, 5) [9, 10)."""
    out: list[str] = []
    start = prev = None
    for p in positions:
        if start is None:
            start = prev = p
        elif p == prev + 1:  # type: ignore[operator]
            prev = p
        else:
            out.append(f"[{start}, {prev + 1})")  # type: ignore[operator]
            start = prev = p
    if start is not None:
        out.append(f"[{start}, {prev + 1})")  # type: ignore[operator]
    return " ".join(out)
