"""`specflip lint`'s rules: every runtime state a speculative configuration can switch into, checked against
what SGLang sized for it at start-up. Pure Python: each release line (shim/releases/) reads SGLang's sizing into a
`Sizing`; nothing here imports SGLang.

Each rule carries the name of the model invariant it is a start-up instance of (`statemodel.invariants`), so a
lint finding, a guard violation and a checker counterexample for the same fault read the same.
"""

from __future__ import annotations

import attrs

from shim.releases.sizing import Sizing, SpecflipPolicy, StepSizing
from statemodel.actions import decode_write_slots, reserve_slots
from statemodel.design import KvReserve
from statemodel.invariants import INVARIANT_NAMES
from statemodel.policy import decide_flip

_NAMES = {name: name for name in INVARIANT_NAMES}
KV_RESERVE = _NAMES["kv_reserve_covers_writes"]
SHAPES = _NAMES["shapes_agree"]
RUNNING_CAP = _NAMES["running_within_cap"]
DRAFT_KV = _NAMES["draft_kv_covers_prefix"]
# Not a model invariant: SGLang itself refuses (or silently drops) part of the configuration at start-up.
# Named here, once, and listed in docs/lint.md as the one lint-only rule.
SGLANG_REFUSES = "sglang_refuses"
RULE_NAMES: tuple[str, ...] = (SGLANG_REFUSES, DRAFT_KV, SHAPES, KV_RESERVE, RUNNING_CAP)

# What a finding does to a server given one request (the start-up matrix, bench/gpu/lint_matrix.py, checks these
# against real start-ups): it stops the start-up, it kills the first decode, or the server serves the request and
# the fault waits for load, a flip or a later state (LATER).
STARTUP = "startup"
FIRST_REQUEST = "first-request"
LATER = "later"
EFFECTS: tuple[str, ...] = (STARTUP, FIRST_REQUEST, LATER)
_OUTCOME = {STARTUP: "dies-at-startup", FIRST_REQUEST: "dies-at-first-request", LATER: "serves"}


@attrs.frozen
class Finding:
    rule: str  # a model invariant name (or SGLANG_REFUSES)
    state: str
    needed: str
    sized: str
    fix: str
    message: str
    effect: str = LATER  # STARTUP, FIRST_REQUEST or LATER

    def describe(self) -> str:
        return (f"{self.rule}: {self.state}: {self.message} (needs {self.needed}, sized {self.sized}); "
                f"fix: {self.fix}; {_EFFECT_TEXT[self.effect]}")

    def to_json(self) -> dict[str, str]:
        return attrs.asdict(self)


_EFFECT_TEXT = {STARTUP: "the server dies at start-up", FIRST_REQUEST: "the server dies at the first decode",
                LATER: "the server starts and serves; the fault comes later"}


def predicted_outcome(findings: list[Finding]) -> str:
    """What one request meets: dies-at-startup, dies-at-first-request or serves (the worst finding decides)."""
    for effect in (STARTUP, FIRST_REQUEST):
        if any(f.effect == effect for f in findings):
            return _OUTCOME[effect]
    return "serves"


def tier_batch_ranges(sizing: Sizing) -> dict[int, list[tuple[int, int]]]:
    """Batch-size ranges each adaptive step count can run at, capped by the running-request cap."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    cap = sizing.max_running_requests
    bounds = [bs for bs, _ in sizing.tiers] + [cap + 1]
    for (lo, steps), nxt in zip(sizing.tiers, bounds[1:], strict=True):
        lo = 1 if lo == sizing.tiers[0][0] else lo  # the first tier also takes smaller batches
        hi = min(nxt - 1, cap)
        if lo > hi:
            continue
        for s in steps:
            ranges.setdefault(s, []).append((lo, hi))
    return ranges


def state_label(steps: int, draft_tokens: int, where: str = "") -> str:
    what = "steps=0 (one-token trivial verify)" if steps == 0 else f"steps={steps} draft_tokens={draft_tokens}"
    return f"{what}{' ' + where if where else ''}"


def tier_demand_ranges(flip: SpecflipPolicy) -> list[tuple[int, int, int]]:
    """(steps, lowest demand, highest demand) each of the switch's tiers runs at: from the boundary below it (its
    `down` + 1 once it was left, 0 for the first) to the boundary above it (its `up` - 1, t_off - 1 for the last).
    Under auto every tier may run at any demand speculation runs at: 0 to beyond the cap (it runs the cap then)."""
    if flip.auto:
        return [(s, 0, flip.spec_cap) for s in flip.tiers]
    lows = [0] + [down + 1 for _, down in flip.tier_bounds]
    highs = [up - 1 for up, _ in flip.tier_bounds] + [flip.t_off - 1]
    return [(s, min(lo, hi), hi) for s, lo, hi in zip(flip.tiers, lows, highs, strict=True)]


def missing_tiers(sizing: Sizing) -> list[int]:
    """The switch's tiers the server builds no runtime state for (the switch then turns its tiers off)."""
    flip = sizing.specflip
    if flip is None or not flip.tiers:
        return []
    built = {st.steps for st in sizing.states} if sizing.adaptive else set()
    return [s for s in flip.tiers if s not in built]


def reachable_states(sizing: Sizing) -> list[tuple[StepSizing, str]]:
    """Every speculative runtime state the server can switch into, with where it is reached. Under the switch's
    tiers (SPECFLIP_TIERS) the switch picks the state, by demand, among SGLang's adaptive runtime states."""
    flip = sizing.specflip
    if flip is not None and flip.tiers and not missing_tiers(sizing):
        if flip.auto:
            return [(sizing.state(s), "(specflip auto tier, any demand)") for s in flip.tiers]
        return [(sizing.state(s), f"(specflip tier at demand {lo}-{hi})") for s, lo, hi in tier_demand_ranges(flip)]
    if not sizing.adaptive:
        return [(sizing.state(sizing.launch_steps), "(launch)")]
    ranges = tier_batch_ranges(sizing)
    out = []
    for st in sizing.states:
        spans = ranges.get(st.steps)
        if spans:
            out.append((st, "at batch sizes " + ", ".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in spans)))
    return out


def dead_tiers(sizing: Sizing) -> list[int]:
    """Tiers whose minimum batch size lies above the running-request cap: never reached."""
    return [bs for bs, _ in sizing.tiers if bs > sizing.max_running_requests and bs != sizing.tiers[0][0]]


def check(sizing: Sizing) -> list[Finding]:
    """Every finding for one configuration, in RULE_NAMES order."""
    found: list[Finding] = []
    found += _refusals(sizing)
    found += _draft_kv(sizing)
    states = reachable_states(sizing)
    found += _tier_states(sizing)
    found += _shapes(sizing, states)
    found += _kv_reserve(sizing, states)
    found += _running_cap(sizing)
    order = {name: i for i, name in enumerate(RULE_NAMES)}
    return sorted(found, key=lambda f: order[f.rule])


def _refusals(sizing: Sizing) -> list[Finding]:
    found = [Finding(SGLANG_REFUSES, "launch", "the configuration as given", "refused", _refusal_fix(r), r, STARTUP)
             for r in sizing.fatal_refusals]
    return found + [Finding(SGLANG_REFUSES, "launch", "the configuration as given", "dropped", _refusal_fix(r), r)
                    for r in sizing.refusals]


def _refusal_fix(reason: str) -> str:
    if "topk" in reason:
        return "use --speculative-eagle-topk 1 or drop --speculative-adaptive"
    if "candidate_steps" in reason:
        return "pass a --speculative-num-steps that is one of the adaptive candidate steps"
    return "drop --speculative-adaptive or the flag SGLang names"


def _draft_kv(sizing: Sizing) -> list[Finding]:
    found = []
    steps = {st.steps for st, _ in reachable_states(sizing)}
    if sizing.adaptive and sizing.skip_zero_step_draft_extend and 0 in steps and any(s > 0 for s in steps):
        up = min(s for s in steps if s > 0)
        found.append(Finding(
            DRAFT_KV, f"steps=0 -> steps={up}",
            "draft KV extended over every token of the steps=0 rounds", "draft-extend skipped at steps=0",
            "unset SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND or drop 0 from the candidate steps",
            f"with SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 the first steps={up} draft after a steps=0 round "
            "starts from a draft KV that misses those tokens"))
    flip = sizing.specflip
    if flip is not None and flip.draft_while_off == "none":
        found.append(Finding(
            DRAFT_KV, "spec off -> spec on", "draft KV caught up over the tokens committed while off",
            "no draft work while off", "--specflip-draft retract",
            "with no draft work while speculation is off, the first draft after flip-on runs on a stale draft KV"))
    return found


def _shapes(sizing: Sizing, states: list[tuple[StepSizing, str]]) -> list[Finding]:
    found = []
    for st, where in states:
        label = state_label(st.steps, st.draft_tokens, where)
        fed = st.draft_tokens  # a verify of this state feeds draft_tokens per request (1 at steps=0)
        if st.graph_bs and st.verify_width != fed:
            found.append(Finding(
                SHAPES, label, f"{fed} tokens per request", f"graph captured at {st.verify_width}",
                f"--speculative-num-draft-tokens {fed} or --disable-cuda-graph",
                f"the target-verify graph replayed in this state was captured for {st.verify_width} tokens per "
                f"request; the verify feeds {fed}", FIRST_REQUEST))
        # draft-extend runs over the accepted drafts + the bonus token: at most steps + 1, and never more than
        # the verify's draft tokens (topk > 1 trees)
        extend_fed = min(st.steps + 1, st.draft_tokens)
        if st.draft_extend_width < extend_fed:
            found.append(Finding(
                SHAPES, label, f"{extend_fed} tokens per request", f"{st.draft_extend_width}",
                f"--speculative-num-draft-tokens >= {extend_fed}",
                "the draft-extend after verify is sized for fewer tokens per request than it extends", FIRST_REQUEST))
    # every state's graphs are captured at start-up, reachable under the running cap or not (init_states builds
    # each candidate), and each capture takes its rows of the shared logits buffer (an assert when it is short)
    for st in sizing.states:
        if not st.graph_bs:
            continue
        rows = max(st.graph_bs) * st.verify_width
        if rows > sizing.logits_rows:
            fix = (f"launch with --speculative-num-steps {max(s.steps for s in sizing.states)} (the buffer follows "
                   f"the launch width on this release), drop steps {st.steps} from the adaptive tiers, or "
                   "--disable-cuda-graph")
            found.append(Finding(
                SHAPES, state_label(st.steps, st.draft_tokens, "(graphs captured at start-up)"),
                f"{rows} logits rows ({max(st.graph_bs)} requests x {st.verify_width})",
                f"{sizing.logits_rows} rows", fix,
                "the shared logits buffer the graph runners write into is smaller than this state's largest "
                "captured graph (SGLang asserts during CUDA graph capture)", STARTUP))
    flip = sizing.specflip
    if flip is not None and flip.plain_graphs not in ("decode", "eager"):
        found.append(Finding(
            SHAPES, "spec off (plain DECODE)", "1 token per request", f"plain graphs {flip.plain_graphs!r}",
            "--specflip-plain-graphs decode", "plain steps would replay a target-verify graph"))
    return found


def _tier_states(sizing: Sizing) -> list[Finding]:
    """Each of the switch's tiers needs a runtime state SGLang built at start-up (its graphs, buffers, backends)."""
    missing = missing_tiers(sizing)
    if not missing:
        return []
    built = sorted(st.steps for st in sizing.states) if sizing.adaptive else []
    fix = (f"launch with --speculative-adaptive --speculative-adaptive-config whose candidate_steps hold "
           f"{sorted(sizing.specflip.tiers)} (e.g. bench/gpu/tiers_8b.json)")  # type: ignore[union-attr]
    return [Finding(SHAPES, f"specflip tier steps={s}", "a runtime state (graphs, buffers) for this step count",
                    f"states built for steps {built}" if built else "no adaptive runtime states", fix,
                    "the switch has no graphs to run this tier with; it turns its tiers off at start-up")
            for s in missing]


def _kv_reserve(sizing: Sizing, states: list[tuple[StepSizing, str]]) -> list[Finding]:
    """The reserve is topped up in prepare_for_decode under the state published then; the adaptive switch
    happens after it (inside the worker forward), so every state's writes must fit every state's reserve.
    The reserve is the model's (`statemodel.actions.reserve_slots`, KvReserve.TWICE_LARGEST: SGLang's
    get_alloc_reserve_per_decode); its "largest" is the alloc_len the release computes with that state published
    (0.5.16+: the largest state), so a release that sizes it by the current state shows as a smaller reserve in
    some state. Under the overlap schedule up to one in-flight verify's tokens of it are still uncommitted (the
    documented reason for the 2x)."""
    found = []
    if not states:
        return found
    usable = []
    for st, _ in states:
        lag = st.draft_tokens if sizing.overlap else 0
        usable.append((reserve_slots(KvReserve.TWICE_LARGEST, st.alloc_len, st.alloc_len) - lag, st))
    for (own, own_at), (st, where) in zip(usable, states, strict=True):
        sized, at = min(usable, key=lambda x: x[0]) if sizing.switch_after_reserve else (own, own_at)
        needed = decode_write_slots(st.steps, sizing.topk, st.draft_tokens)
        if needed > sized:
            found.append(Finding(
                KV_RESERVE, state_label(st.steps, st.draft_tokens, where), f"{needed} KV slots per request",
                f"{sized} (reserve topped up while steps={at.steps})",
                f"drop candidate steps above {at.steps} or use a release that sizes the reserve by the largest "
                "state (sglang PR #24055)",
                "the verify/draft writes more slots per request than prepare_for_decode reserved"))
    return found


def _running_cap(sizing: Sizing) -> list[Finding]:
    flip = sizing.specflip
    if flip is None:
        return []
    found = []
    # the policy asked at its own re-enable point: demand t_on, all t_on requests running (auto re-enables only
    # within the cap, statemodel.policy.within_spec_cap: nothing to ask)
    if not flip.auto and decide_flip(False, flip.t_on, flip.t_on, flip.t_off, flip.t_on, flip.spec_cap) is None:
        found.append(Finding(
            RUNNING_CAP, f"spec on, re-enabled at t_on={flip.t_on}", f"{flip.t_on} running requests",
            f"speculation holds {flip.spec_cap}",
            f"--specflip-t-on {flip.spec_cap} (or raise --specflip-spec-cap to {flip.t_on})",
            "the policy re-enables speculation with more requests running than speculation's cap; the switch's "
            "clamp keeps it off there, so the threshold above the cap never fires"))
    if flip.spec_cap > sizing.max_running_requests:
        found.append(Finding(
            RUNNING_CAP, "spec on", f"{flip.spec_cap} running requests", f"{sizing.max_running_requests} (launch cap)",
            f"--max-running-requests {flip.spec_cap} (the plain cap) or --specflip-spec-cap "
            f"{sizing.max_running_requests}",
            "speculation's cap is above the launch running-request cap that SGLang sized its pools and graphs for"))
    return found


def summary(sizing: Sizing) -> str:
    states = reachable_states(sizing)
    steps = sorted({st.steps for st, _ in states})
    extra = ""
    if sizing.specflip is not None:
        extra = (" + specflip off/on (auto)" if sizing.specflip.auto else
                 f" + specflip off/on (t_off={sizing.specflip.t_off}, t_on={sizing.specflip.t_on})")
        if sizing.specflip.tiers:
            extra += f" by tiers {list(sizing.specflip.tiers)}"
    dead = dead_tiers(sizing)
    dead_note = f"; tiers bs>={dead} never reached under the running cap {sizing.max_running_requests}" if dead else ""
    return (f"ok: sglang {sizing.release}, {sizing.algorithm}, {len(states)} speculative state(s) "
            f"(steps {steps}){extra} fit what SGLang sizes at start-up{dead_note}")
