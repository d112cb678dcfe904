"""The guard follows the radix tree's draft coverage (issue 24): which positions of the live tree hold slots whose
draft KV was never written, and, at a speculative draft step, each running request whose cached prefix has such
positions. The rule is the model's (`statemodel.invariants.prefix_draft_missing`, `tree_prefix_violations`: the
`draft_kv_covers_prefix` of `State.prefix_cache`); this is the bookkeeping that maps the live tree onto it.

The model's tree is one chain with a draft mark per token. The live tree is a trie shared by every prompt, output and
turn. The guard keeps its own record, keyed by token-sequence prefix (a hash of the tree's namespace and the tokens up
to the position): the positions an insert CREATED in the tree without draft KV. Why this is exact without reading the
tree itself:

* a position the tree holds was created by the last insert that added it (an insert's `prefix_len`: the positions
  before it were present, only `[prefix_len, len(key))` are new; a duplicate keeps the tree's first slot), and the
  record is rewritten at every creation, marked by what the inserting request's draft KV covers there (the model's
  `draft_kv_len`; a chunk still prefilling: the chunks that ran with the draft);
* so a record left behind by an eviction is never read wrongly: a request can match only positions the tree holds,
  and a position evicted and created again was rewritten then. Forgetting on eviction (RadixCache: `_delete_leaf`)
  keeps the record as small as the tree; a UnifiedRadixCache's (its core may be Rust) is not pruned: memory only.

What it reads: the inserted key's token ids and namespace (host lists, the RadixKey's own), the insert's
`prefix_len` (a python int), and each request's `cache_protected_len` (its tree prefix) and token ids. Nothing on the
device. A clean run (no position ever created without draft KV) costs a set-emptiness test per hook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from statemodel.actions import draft_written_in_tree
from statemodel.invariants import Violation, prefix_draft_missing, tree_prefix_violations
from statemodel.state import State, Status

_MOD = (1 << 61) - 1  # a Mersenne prime: the prefix hash's modulus
_BASE = 1_000_003

# what a request's tokens look like to the tree: (token ids, namespace, key offset), read only when needed
TokensOf = Callable[[], tuple[Sequence[int], Any]]


def _prefix_hashes(tokens: Sequence[int], namespace: Any, start: int, end: int, offset: int) -> list[int]:
    """The record's key of tree positions `[start, end)`: position p is identified by the namespace and the tokens
    `[0, p + 1 + offset)` (offset 1 for EAGLE's bigram keys, whose position p spans tokens p and p + 1)."""
    h = hash(namespace) % _MOD
    out: list[int] = []
    stop = min(end + offset, len(tokens))
    for i in range(stop):
        h = (h * _BASE + tokens[i] + 1) % _MOD
        if i >= start + offset:
            out.append(h)
    return out


class TreeDraftRecord:
    """The positions the live tree holds without draft KV, by token-sequence prefix (SGLang-free)."""

    __slots__ = ("offset", "without_draft")

    def __init__(self) -> None:
        self.without_draft: set[int] = set()
        self.offset = 0  # 1 once an inserted key is a bigram key (EAGLE)

    def created(self, tokens: Sequence[int], namespace: Any, start: int, end: int, drafted_upto: int | None,
                *, bigram: bool) -> None:
        """An insert created positions `[start, end)` of `tokens`; those below `drafted_upto` have draft KV (None:
        not known, e.g. an insert outside a request's caching: forgotten, never flagged)."""
        self.offset = 1 if bigram else 0
        if end <= start:
            return
        upto = drafted_upto if drafted_upto is not None else end
        if upto >= end and not self.without_draft:
            return  # the common case: a clean insert into a clean record
        for p, key in enumerate(_prefix_hashes(tokens, namespace, start, end, self.offset), start):
            if p < upto:
                self.without_draft.discard(key)
            else:
                self.without_draft.add(key)

    def drafted(self, tokens: Sequence[int], namespace: Any, start: int, end: int) -> None:
        """A draft-extend wrote the draft KV of positions `[start, end)` of the path `tokens` (tree slots a request's
        row points at: `statemodel.actions.draft_written_in_tree`)."""
        if self.without_draft and end > start:
            self.without_draft.difference_update(_prefix_hashes(tokens, namespace, start, end, self.offset))

    def forgotten(self, tokens: Sequence[int], namespace: Any, start: int, end: int) -> None:
        """The tree evicted positions `[start, end)` of the path `tokens`."""
        if self.without_draft and end > start:
            self.without_draft.difference_update(_prefix_hashes(tokens, namespace, start, end, self.offset))

    def marks(self, tokens: Sequence[int], namespace: Any, cached_len: int) -> list[bool]:
        """Per position of a request's tree prefix of `cached_len`, whether its slot's draft KV was written."""
        without = self.without_draft
        return [key not in without for key in _prefix_hashes(tokens, namespace, 0, cached_len, self.offset)]


class TreeDraftChecks:
    """The tree-coverage half of `shim.guard.core.Guard` (a mixin)."""

    index: dict[str, int]
    names: list[str]
    state: State

    def _init_tree_draft(self) -> None:
        self.tree_record = TreeDraftRecord()
        self.tree_inserting: list[str] = []  # the requests whose KV the tree is taking now (nested calls)
        # SGLang rid -> the first position a prefill chunk without the draft computed (requests still prefilling)
        self._undrafted_from: dict[str, int] = {}
        # SGLang rid -> (tree prefix length, positions of it without draft KV), not reported yet
        self.tree_missing: dict[str, tuple[int, int]] = {}
        self._tree_reported: dict[str, int] = {}  # SGLang rid -> the positions missing last reported
        # SGLang rid -> (tree prefix length, its tokens) of each request whose tree prefix has positions without draft
        # KV: what a draft-extend over its row covers (`tree_draft_written`)
        self._tree_prefix: dict[str, tuple[int, TokensOf]] = {}

    def tree_prefill_chunk(self, rid: str, start: int, drafted: bool) -> None:
        """A prefill chunk from position `start` ran (with the draft or not): what an insert of it is marked with."""
        if not drafted:
            self._undrafted_from[rid] = min(self._undrafted_from.get(rid, start), start)

    def drafted_upto(self, rid: str) -> int | None:
        """How far the draft KV of request `rid`'s own positions is written: the model's `draft_kv_len`; a request
        still prefilling, its chunks so far unless one ran without the draft (None: not a request the guard knows)."""
        i = self.index.get(rid)
        if i is None:
            return None
        r = self.state.requests[i]
        if r.status is Status.PREFILLING:
            return self._undrafted_from.get(rid, r.prefilled_len)
        return r.draft_kv_len

    def tree_created(self, tokens: Sequence[int], namespace: Any, start: int, end: int, *, bigram: bool) -> None:
        """An insert into the tree created `[start, end)` (its `prefix_len` to the key's length), for the request
        being cached now (`tree_inserting`)."""
        rid = self.tree_inserting[-1] if self.tree_inserting else None
        self.tree_record.created(tokens, namespace, start, end, None if rid is None else self.drafted_upto(rid),
                                 bigram=bigram)

    def tree_prefix_seen(self, rid: str, cached_len: int, tokens_of: TokensOf) -> None:
        """Request `rid` holds `cached_len` positions of the tree (`cache_protected_len`: matched at admission, or
        repointed at the tree's slots by a checkpoint). Remembers the positions of it without draft KV."""
        if self._prefill_done(rid):
            self._undrafted_from.pop(rid, None)
        if not self.tree_record.without_draft or cached_len <= 0:
            self.tree_missing.pop(rid, None)
            self._tree_prefix.pop(rid, None)
            return
        self._tree_prefix_missing(rid, cached_len, tokens_of)

    def _tree_prefix_missing(self, rid: str, cached_len: int, tokens_of: TokensOf) -> None:
        tokens, namespace = tokens_of()
        missing = prefix_draft_missing(self.tree_record.marks(tokens, namespace, cached_len), cached_len)
        if missing:
            self._tree_prefix[rid] = (cached_len, tokens_of)
        else:
            self._tree_prefix.pop(rid, None)
        if missing > self._tree_reported.get(rid, 0):
            self.tree_missing[rid] = (cached_len, missing)
        else:
            self.tree_missing.pop(rid, None)

    def tree_draft_written(self, before: State, after: State) -> None:
        """A draft-extend step (a round's, a sync, a catch-up) moved the model from `before` to `after`: the tree
        positions it wrote the draft KV of, per request whose tree prefix lacked some (the model's
        `draft_written_in_tree`), now have it; every such request's prefix is looked at again. Costs nothing while no
        running request's tree prefix lacks draft KV."""
        if not self._tree_prefix:
            return
        index, record = self.index, self.tree_record
        wrote = False
        for rid, (cached_len, tokens_of) in self._tree_prefix.items():
            i = index.get(rid)
            if i is None or i >= len(before.requests) or i >= len(after.requests):
                continue
            start, end = draft_written_in_tree(before.requests[i], after.requests[i], cached_len)
            if end > start:
                tokens, namespace = tokens_of()
                record.drafted(tokens, namespace, start, end)
                wrote = True
        if wrote:
            for rid, (cached_len, tokens_of) in list(self._tree_prefix.items()):
                self._tree_prefix_missing(rid, cached_len, tokens_of)

    def _prefill_done(self, rid: str) -> bool:
        i = self.index.get(rid)
        return i is None or self.state.requests[i].status is not Status.PREFILLING

    def tree_draft_violations(self, steps: int, running: Sequence[int]) -> list[Violation]:
        """At a draft step of `steps`: the running requests (model indices) whose tree prefix lacks draft KV, each
        reported once (again only if more positions go missing)."""
        if not self.tree_missing or steps == 0:
            return []
        names = self.names
        missing = {}
        for i in running:
            found = self.tree_missing.pop(names[i], None)
            if found is not None:
                missing[i] = found
                self._tree_reported[names[i]] = found[1]
        return tree_prefix_violations(steps, missing)

    def tree_forget_request(self, rid: str) -> None:
        """A request released: it holds no tree prefix any more (a re-prefill matches afresh)."""
        self.tree_missing.pop(rid, None)
        self._tree_reported.pop(rid, None)
        self._undrafted_from.pop(rid, None)
        self._tree_prefix.pop(rid, None)
