"""A design is one way to perform the flip, written as data; the scope bounds what the checker explores.

Every choice a flip implementation makes that the failures in ANCHORS.md turn on is a field here, so
one transition function (`statemodel.actions`) serves every design, shipped or known-bad.
"""

from __future__ import annotations

import enum

import attrs


class DesignKind(enum.Enum):
    SHIPPED = "shipped"  # implemented (specflip's switches, or SGLang's own): must pass
    CANDIDATE = "candidate"  # checked like a shipped design (must pass), not implemented yet
    KNOWN_BAD = "known-bad"  # must be refuted by its expected invariant


class ClearSpecOn(enum.Enum):
    """Where a spec-off step strips the speculative metadata before the plain target forward."""

    # the seeds' fix: only the batch the worker forward sees (the ModelWorkerBatch on 0.5.12; on 0.5.16+
    # the ScheduleBatch inside the scheduler's _forward_isolation snapshot/restore); the ScheduleBatch keeps it
    WORKER_COPY = "worker_copy"
    BATCH_AT_FLIP = "batch_at_flip"  # one-object lines: the flip itself takes spec_info off the batch
    SCHEDULER_BATCH = "scheduler_batch"  # strips the ScheduleBatch (the draft input with it), per step
    NOWHERE = "nowhere"  # the seeds' attempt 1


class OutCacheLocFrom(enum.Enum):
    """Where the plain step's `out_cache_loc` comes from."""

    PREPARE_FOR_DECODE = "prepare_for_decode"  # one fresh slot per request from a plain prepare_for_decode
    # the v2 over-allocation already holds the next slot (req_to_token[seq_lens]); the reserve is kept
    # across the flip and prepare_for_decode keeps its speculative path while off
    V2_RESERVE = "v2_reserve"
    TUPLE_UNPACK = "tuple_unpack"  # the seeds' attempt 2: `out_cache_loc, _ = alloc_token_slots(...)`


class DraftWhileOff(enum.Enum):
    """How the draft model's KV is kept while speculation is off."""

    SYNC_EVERY_STEP = "sync_every_step"  # draft-extend over the one new token after every plain step
    CATCH_UP_ON_ENABLE = "catch_up_on_enable"  # nothing while off; one draft-extend over the gap at flip-on
    # nothing while off; flip-on retracts every running request (ScheduleBatch.release_req, no tree insert) and
    # its re-prefill with speculation on runs the target and the draft over prompt + output: that is the catch-up
    RETRACT_ON_ENABLE = "retract_on_enable"
    NONE = "none"  # nothing at all (vLLM V0 "disabled forever", TRT-LLM #16888)


class KvReserve(enum.Enum):
    """What the speculative KV reserve per request is sized by."""

    LARGEST_STATE = "largest_state"  # the most draft tokens any runtime state can verify
    CURRENT_STATE = "current_state"  # the current step count (SGLang PR #24055)
    # twice the largest (steps + 1), from the host's committed length: eagle_prepare_for_decode's
    # `committed + 2A` (0.5.16+, both loops); under overlap the host's committed lags one step behind
    TWICE_LARGEST = "twice_largest"


class PlainStepGraphs(enum.Enum):
    """Which CUDA graphs a plain DECODE step replays on a speculative server. Its target graphs are
    captured for TARGET_VERIFY shapes only, and the runner's can_run does not look at forward_mode."""

    DECODE_RUNNER = "decode_runner"  # a decode graph runner (1 token per request) captured beside them
    VERIFY_RUNNER = "verify_runner"  # nothing done: the verify graphs (draft tokens per request) replay
    EAGER = "eager"  # graphs disabled for plain steps


class TreeDraft(enum.Enum):
    """What SGLang's radix cache does about the draft KV at the slots it caches (`Design.radix_cache` only). The
    draft pool shares the target's slot indices, so a prefix hit reuses whatever the draft pool holds there."""

    IGNORED = "ignored"  # SGLang: the tree knows nothing of the draft; tokens computed while off are cached as any
    # each cached token carries whether its draft KV was written; a match that the draft will extend (speculation
    # on) stops at the first token without, so the prefill recomputes target and draft from there
    MATCH_STOPS_AT_MISSING = "match_stops_at_missing"
    # tokens whose prefill ran without the draft are never inserted (req.skip_radix_cache_insert while off)
    NOT_INSERTED_WITHOUT_DRAFT = "not_inserted_without_draft"
    # each cached token carries the mark; flip-on evicts every unlocked token from the first unmarked one on
    EVICT_AT_FLIP_ON = "evict_at_flip_on"


class MergeSpecInfo(enum.Enum):
    CHECKED = "checked"  # rows for every request, a draft catch-up for rows that had none
    CONCAT_UNCHECKED = "concat_unchecked"  # concatenates whatever the two batches hold (PR #10090)


@attrs.frozen
class ThresholdPolicy:
    """Speculation off when demand reaches `t_off`, back on when it falls to `t_on` (hysteresis).

    The checker explores every pair in `t_off_range` x `t_on_range` with `t_on < t_off` as separate
    initial states. `clamp_to_spec_cap`: never re-enable while more requests run than speculation
    can hold.
    """

    t_off_range: tuple[int, ...]
    t_on_range: tuple[int, ...]
    clamp_to_spec_cap: bool = True

    def pairs(self) -> list[tuple[int, int]]:
        return [(off, on) for off in self.t_off_range for on in self.t_on_range if on < off]

    def describe(self) -> str:
        clamp = ", on only within the spec cap" if self.clamp_to_spec_cap else ""
        return f"threshold off>={list(self.t_off_range)} on<={list(self.t_on_range)}{clamp}"


@attrs.frozen
class AdaptiveTiers:
    """SGLang's `--speculative-adaptive`: per batch-size tier, the step counts the controller may pick.

    `tiers` is ((min_batch_size, candidate_steps), ...), ascending; steps 0 means "no drafting": a
    one-token trivial verify. The checker lets the controller pick any candidate, so every
    decision SGLang's accept-rate controller can make is covered.
    """

    tiers: tuple[tuple[int, tuple[int, ...]], ...]

    def candidates(self, batch_size: int) -> tuple[int, ...]:
        chosen = self.tiers[0][1]
        for min_bs, steps in self.tiers:
            if batch_size >= min_bs:
                chosen = steps
        return chosen

    def all_steps(self) -> tuple[int, ...]:
        return tuple(sorted({s for _, steps in self.tiers for s in steps}))

    def describe(self) -> str:
        return "adaptive tiers " + ", ".join(f"bs>={bs}: steps {list(s)}" for bs, s in self.tiers)


@attrs.frozen
class FreeFlips:
    """The flip may come at any scheduling point, in either direction, whatever the demand: at every state where
    a threshold policy could flip, the checker explores both flipping and going on without it. This
    over-approximates every policy that flips only where the model lets a flip happen and, when
    `clamp_to_spec_cap`, never re-enables speculation with more requests in flight than its cap holds: a decision
    made from measurements (SPECFLIP_SWITCH=auto, statemodel.auto_policy), a probe (a flip off and back on a few
    steps later), any threshold pair. What the checker proves for it holds for each of them."""

    clamp_to_spec_cap: bool = True

    def describe(self) -> str:
        clamp = ", on only within the spec cap" if self.clamp_to_spec_cap else ""
        return f"free flips (off and on at any demand{clamp})"


@attrs.frozen
class TierFlips(FreeFlips):
    """Free flips between plain decoding and speculation, and while speculation is on any of the tiers' step counts
    at each decode step (the worker applies the tier at the top of its forward, after prepare_for_decode topped the
    reserve up). This over-approximates every tier ladder (SPECFLIP_TIERS, statemodel.policy.decide_tier: any
    boundaries, any hysteresis) with any t_off / t_on, and a learner that picks among them."""

    steps: tuple[int, ...] = (1, 2)

    def describe(self) -> str:
        return f"tiers: steps {list(self.steps)} at any decode, " + super().describe()


Policy = ThresholdPolicy | AdaptiveTiers | FreeFlips


@attrs.frozen
class Design:
    """One way to perform the flip, checked against the same invariants as every other."""

    name: str
    kind: DesignKind
    summary: str
    source: str
    sglang_line: str
    policy: Policy
    num_steps: int = 2  # spec-on step count for threshold policies
    clear_spec_on: ClearSpecOn = ClearSpecOn.BATCH_AT_FLIP
    out_cache_loc_from: OutCacheLocFrom = OutCacheLocFrom.PREPARE_FOR_DECODE
    plain_step_graphs: PlainStepGraphs = PlainStepGraphs.DECODE_RUNNER
    draft_while_off: DraftWhileOff = DraftWhileOff.CATCH_UP_ON_ENABLE
    zero_step_draft_extend: bool = True
    kv_reserve: KvReserve = KvReserve.LARGEST_STATE
    merge_spec_info: MergeSpecInfo = MergeSpecInfo.CHECKED
    free_reserved_on_finish: bool = True
    release_reserve_at_flip_off: bool = True
    plain_step_advances_seq_lens_twice: bool = False
    # the prefilled batch leaves out, as it joins the running batch, a request whose prefill took more than one chunk
    # (a stale reference to the scheduler's chunked request after its last chunk ran): no design does; the
    # `merge_drops_last_chunked` known-bad design of `requests_in_one_place`
    merge_drops_last_chunked: bool = False
    # a retraction (ScheduleBatch.release_req, and flip-on by retraction) keeps the request's output: Req.output_ids
    # survives reset_for_retract and the re-prefill runs over prompt + output
    retract_keeps_output: bool = True
    # the worker's verify, not the flip's choice: the v2 worker (0.5.16+) moves seq_lens and kv_committed_len by
    # the whole accepted run (accepted + 1), past max_new_tokens, and the output is cut at the finish afterwards;
    # the v1 worker (0.5.12) cuts the accepted run at the finish inside the verify
    verify_advances_past_finish: bool = True
    # overlap schedule only: the policy flips only when no launched step's result is unprocessed (a flip that
    # releases the reserve while a verify is in flight frees the slots that verify writes)
    flip_waits_for_results: bool = False
    # overlap schedule only: False when a speculative step's result is processed before the next step is prepared
    # (the v1 worker runs every speculative iteration without overlap; shim/switch/v1_loop.py overlaps plain ones)
    overlap_spec_steps: bool = True
    # the server runs with SGLang's radix cache (its default; off with --disable-radix-cache): every prompt of the
    # scope is read as a prefix of one token sequence, so requests share cached prefixes and a re-prefill after a
    # release hits its own prompt; tree_draft is what the cache does about the draft KV at its slots
    radix_cache: bool = False
    tree_draft: TreeDraft = TreeDraft.IGNORED
    expected_invariant: str | None = None  # known-bad: the invariant its shortest counterexample breaks

    @property
    def is_adaptive(self) -> bool:
        return isinstance(self.policy, AdaptiveTiers)

    def steps_choices(self, batch_size: int) -> tuple[int, ...]:
        """Step counts a spec-on worker forward may run with for this batch size."""
        if isinstance(self.policy, AdaptiveTiers):
            return self.policy.candidates(batch_size)
        if isinstance(self.policy, TierFlips):
            return self.policy.steps
        return (self.num_steps,)

    def largest_steps(self) -> int:
        if isinstance(self.policy, AdaptiveTiers):
            return max(self.policy.all_steps())
        if isinstance(self.policy, TierFlips):
            return max(self.policy.steps)
        return self.num_steps


@attrs.frozen
class RequestSpec:
    prompt_len: int
    max_new_tokens: int


@attrs.frozen
class Scope:
    """The bounds the checker exhausts. Small on purpose: every interleaving within them is explored."""

    requests: tuple[RequestSpec, ...] = (
        RequestSpec(3, 3), RequestSpec(1, 3), RequestSpec(2, 2), RequestSpec(1, 2))
    kv_pool_size: int = 11
    spec_cap: int = 2  # max running requests with speculation (48 on the GPU host)
    plain_cap: int = 4  # max running requests without (128 on the GPU host)
    chunk_size: int = 2  # chunked prefill: tokens one prefill batch extends at most
    graph_capture_sizes: tuple[int, ...] = (1, 2)  # batch sizes with captured CUDA graphs
    # the overlap schedule (event_loop_overlap): a step's result is processed after the next step launched
    overlap: bool = False

    def describe(self) -> str:
        reqs = ", ".join(f"prompt {r.prompt_len}/max_new {r.max_new_tokens}" for r in self.requests)
        return (
            f"{len(self.requests)} requests ({reqs}); KV pool {self.kv_pool_size} slots; running cap "
            f"{self.spec_cap} with speculation, {self.plain_cap} without; chunked prefill {self.chunk_size} "
            f"tokens; CUDA graphs for batch sizes {list(self.graph_capture_sizes)}"
            + ("; overlap schedule (results processed one step late)" if self.overlap else "")
        )

    def graph_bucket(self, batch_size: int) -> int | None:
        for size in self.graph_capture_sizes:
            if batch_size <= size:
                return size
        return None
