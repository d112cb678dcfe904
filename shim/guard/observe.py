"""What an adapter hands the guard: plain host-side facts read off live SGLang objects.

No SGLang import here and no torch: an adapter fills these from python ints, CPU mirrors and tensor
shapes, and the guard (`shim.guard.core`) turns them into `statemodel.state` objects. Request ids are
SGLang's rid strings; the guard numbers them.
"""

from __future__ import annotations

from typing import NamedTuple

from statemodel.state import ForwardMode, SpecInfoKind


class ObservedBatch(NamedTuple):
    """A ScheduleBatch (or the batch a forward launches with) as the model sees it. A NamedTuple (as
    ObservedRequest): several are built per step at any batch size, a tuple at a quarter of an attrs class's cost,
    and the guard compares one with the last it turned into a model Batch (`ObservedStateSync._batch`)."""

    rids: tuple[str, ...]
    forward_mode: ForwardMode
    spec_kind: SpecInfoKind = SpecInfoKind.NONE
    spec_rows: int = 0
    spec_tokens_per_row: int = 0
    spec_algorithm_on: bool = False
    out_cache_loc_width: int = 0
    graph: tuple[int, int] | None = None  # (batch bucket, tokens per request) of the CUDA graph replayed
    extend_tokens: int = 0


class ObservedRequest(NamedTuple):
    """One Req: its KV bookkeeping (`req.kv`) and output count, as python ints.

    A NamedTuple, not an attrs class: the adapter builds one per request several times per decode
    step, and a tuple costs a third as much to build. `_replace` gives a modified copy.
    """

    rid: str
    prompt_len: int
    max_new_tokens: int
    output_len: int
    kv_committed: int  # own committed KV slots (kv_committed_len - cache_protected_len)
    kv_allocated: int  # own allocated KV slots (kv_allocated_len - cache_protected_len)
    kv_committed_len: int  # req kv_committed_len itself: the scheduler's count of tokens in the target KV
    seq_len: int  # the batch's view (its seq_lens_cpu entry); kv_committed_len when the batch has no mirror
    holds_kv: bool = True
    prefilled_len: int = 0  # tokens prefilled so far (chunked prefill: less than the prompt)


class ObservedPool(NamedTuple):
    """The KV pool as the model counts it: slots no request owns are free (the tree cache's included)."""

    free: int
    size: int
