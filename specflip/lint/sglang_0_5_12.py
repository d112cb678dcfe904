"""`specflip lint` for SGLang 0.5.12, the v1 line (`SGLANG_ENABLE_SPEC_V2=0`: the v1 `EAGLEWorker`, no overlap).

Read from the installed 0.5.12 (`.venv12` here; the `.whl12` bundle on the GPU host). Paths are relative to its
`sglang/srt/`. 0.5.12 resolves ServerArgs in `__post_init__` (plain attributes), like 0.5.16, but its adaptive
mode is another design:
  - Adaptive: `speculative/adaptive_spec_params.AdaptiveSpeculativeParams` moves the step count with the EMA of
    the accept length, at any batch size: no batch-size tiers. Its config (`load_adaptive_config`) is one flat
    JSON object; `candidate_steps` (default [1, 3, 7]) plus the launch steps are the states, and fewer than two
    distinct ones is an AssertionError when the worker is built (start-up). Tier keys ("1", "8", ... as 0.5.16
    reads them) are ignored. A candidate steps 0 dies at start-up: `speculative/draft_utils.DraftBackendFactory
    .create_decode_backend` returns no backend for steps == 1 only (0.5.16: steps <= 1).
  - States: `speculative/eagle_worker.EAGLEWorker.build_adaptive_runtime_state` builds every candidate at
    start-up (draft tokens = steps + 1), each with its own target `CudaGraphRunner` and draft runners at the whole
    `cuda_graph_bs` list (`model_executor/cuda_graph_runner.get_batch_sizes_to_capture`: clamped to the request
    pool, which is max_running_requests). There is no shared logits buffer in 0.5.12: each runner sizes its own.
  - KV: `managers/utils.get_alloc_len_per_decode(server_args)` = max(steps * topk, draft tokens) of the CURRENT
    state: `apply_runtime_state` writes the state into server_args. The v1 worker switches at the end of a
    forward, so the next prepare_for_decode already reserves for the state that runs (switch_after_reserve is
    False); under SGLANG_ENABLE_SPEC_V2=1 (overlap) 0.5.12 runs the v2 worker, which switches inside the forward.
  - Refusals: `adaptive_unsupported_reason` (algorithm not EAGLE/EAGLE3, topk != 1, DP attention, multi-layer
    EAGLE, TBO, PD-mux): server_args drops --speculative-adaptive with a warning.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from specflip.lint.rules import Sizing, SpecflipPolicy, StepSizing
from specflip.lint.sglang_common import (
    NEEDS_DRAFT_MODEL,
    LintInputError,
    RaisingParser,
    SGLangRefused,
    ensure_torchvision_importable,
    given_flag,
    quiet,
    sglang_failure,
    silence_again,
)

__all__ = ["LintInputError", "SGLangRefused", "build_server_args", "launch_value", "read_sizing", "sizing_from_values"]

RELEASE = "0.5.12"
DEFAULT_CANDIDATE_STEPS: tuple[int, ...] = (1, 3, 7)


def capture_bs_of(cuda_graph_bs: Sequence[int] | None, max_running_requests: int) -> list[int]:
    """`get_batch_sizes_to_capture` for one rank without TBO/DP: clamped to the request pool, the pool size added
    when the list reaches past it."""
    bs = list(cuda_graph_bs or [])
    if not bs:
        return []
    if max(bs) > max_running_requests:
        bs.append(max_running_requests)
    return sorted({b for b in bs if 0 < b <= max_running_requests})


def adaptive_candidates(config: Any, launch_steps: int) -> tuple[int, ...]:
    """`AdaptiveSpeculativeParams.__init__`: the config's candidate_steps (default [1, 3, 7]) plus the launch
    steps. LintInputError for a config SGLang would fail on when it builds the worker."""
    if not isinstance(config, dict):
        raise LintInputError(f"0.5.12 reads the adaptive config as one JSON object "
                             f"(e.g. {{\"candidate_steps\": [1, 3]}}), not a {type(config).__name__}")
    raw = config.get("candidate_steps", list(DEFAULT_CANDIDATE_STEPS))
    if not isinstance(raw, list) or not all(_is_step(s) for s in raw):
        raise LintInputError(f"candidate_steps must be a list of non-negative integers, got {json.dumps(raw)}")
    return tuple(sorted({*raw, launch_steps}))


def sizing_from_values(*, algorithm: str = "EAGLE3", topk: int = 1, steps: int, draft_tokens: int,
                       adaptive: bool = False, adaptive_config: Any = None, max_running_requests: int = 48,
                       cuda_graph_bs: Sequence[int] | None = None, overlap: bool = False,
                       refusals: Sequence[str] = (), specflip: SpecflipPolicy | None = None) -> Sizing:
    """0.5.12's start-up sizing from resolved values (what its ServerArgs attributes hold)."""
    refusals = list(refusals)
    fatal: list[str] = []
    tiers: tuple[tuple[int, tuple[int, ...]], ...] = ()
    if adaptive:
        config = {} if adaptive_config is None else adaptive_config
        candidates = adaptive_candidates(config, steps)
        ignored = sorted(k for k in config if isinstance(k, str) and k.isdigit())
        if ignored:
            refusals.append(f"SGLang 0.5.12 ignores the tier keys {ignored} of the adaptive config (it reads one "
                            f"flat object); it runs candidate_steps {list(candidates)} at every batch size")
        if 0 in candidates:
            # 0.5.16 skips the multi-step draft backend for steps <= 1 ("nospec"); 0.5.12 only for steps == 1
            fatal.append(f"the adaptive candidate_steps {list(candidates)} include steps 0, which 0.5.12 cannot "
                         "build: DraftBackendFactory.create_decode_backend builds a multi-step draft backend over "
                         "no steps (triton: IndexError in TritonMultiStepDraftBackend; seen on the H200)")
        if len(candidates) < 2:
            fatal.append(f"the adaptive candidate_steps {list(candidates)} (with the launch steps) have fewer than "
                         "2 distinct values: AdaptiveSpeculativeParams asserts when the worker is built")
        tiers = ((1, candidates),)  # one tier: the accept length, not the batch size, picks the state
        state_steps: Sequence[int] = candidates
    else:
        state_steps = [steps]
    capture_bs = capture_bs_of(cuda_graph_bs, max_running_requests)
    states = []
    for s in state_steps:
        d = s + 1 if adaptive else draft_tokens
        states.append(StepSizing(steps=s, draft_tokens=d, alloc_len=max(s * topk if s else topk, d), verify_width=d,
                                 draft_extend_width=d, graph_bs=tuple(capture_bs)))
    # no shared logits buffer: every runner sizes its own rows, so the largest is what is there
    logits_rows = max((max(st.graph_bs) * st.verify_width for st in states if st.graph_bs), default=0)
    return Sizing(release=RELEASE, algorithm=algorithm, topk=topk, launch_steps=steps, launch_draft_tokens=draft_tokens,
                  overlap=overlap, max_running_requests=max_running_requests, logits_rows=logits_rows,
                  states=tuple(states), adaptive=adaptive and not fatal, tiers=tiers if adaptive else (),
                  refusals=tuple(refusals), fatal_refusals=tuple(fatal), specflip=specflip,
                  switch_after_reserve=overlap)


def build_server_args(argv: Sequence[str], *, verbose: bool = False) -> Any:
    """`prepare_server_args(argv)`, as launch_server runs it; 0.5.12 resolves in ServerArgs.__post_init__.
    `verbose`: SGLang's log lines and warnings are shown (on stderr) instead of silenced."""
    ensure_torchvision_importable()
    with quiet(verbose):
        from sglang.srt.server_args import ServerArgs, prepare_server_args

        parser = RaisingParser(prog="sglang serve", add_help=False)
        ServerArgs.add_cli_args(parser)
        parsed = parser.parse_args(list(argv))  # unknown flags / bad values: one line, before SGLang exits
        if parsed.speculative_adaptive and parsed.speculative_adaptive_config:
            # a malformed file is bad input even where resolution will drop --speculative-adaptive (as on 0.5.23)
            _check_adaptive_config(parsed.speculative_adaptive_config, parsed.speculative_num_steps or 0)
        try:
            server_args = prepare_server_args(list(argv))
        except (ValueError, NotImplementedError, AssertionError, TypeError, AttributeError, KeyError) as exc:
            raise SGLangRefused(sglang_failure(exc, argv, RELEASE)) from None
        except OSError as exc:
            raise LintInputError(f"SGLang could not read the model configuration: {exc}") from None
        silence_again(verbose)
        if server_args.speculative_algorithm in NEEDS_DRAFT_MODEL and not server_args.speculative_draft_model_path:
            raise LintInputError(f"--speculative-algorithm {server_args.speculative_algorithm} needs "
                                 "--speculative-draft-model-path (the draft model's directory or id)")
    # resolution turns an unsupported --speculative-adaptive off (with a warning lint silences): keep what was given
    object.__setattr__(server_args, "_specflip_given_adaptive", given_flag(argv, "--speculative-adaptive"))
    return server_args


def read_sizing(server_args: Any, specflip: SpecflipPolicy | None = None, *, republish: bool = True) -> Sizing:
    """What 0.5.12 sizes at start-up for a resolved ServerArgs (`republish`: the adapter interface; 0.5.12 has
    nothing published to move)."""
    sa = server_args
    if sa.speculative_algorithm is None:
        raise LintInputError("no --speculative-algorithm: nothing switches, nothing to lint")
    given_adaptive = bool(getattr(sa, "_specflip_given_adaptive", False))
    config: Any = None
    if sa.speculative_adaptive and sa.speculative_adaptive_config:
        config = _read_adaptive_config(sa.speculative_adaptive_config)
    refusals = []
    if given_adaptive and not sa.speculative_adaptive:
        from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

        reason = adaptive_unsupported_reason(sa)
        refusals.append(f"SGLang drops --speculative-adaptive: {reason or 'disabled during resolution'}; "
                        "the server runs the static launch parameters")
    graphs = [] if sa.disable_cuda_graph else list(sa.cuda_graph_bs or [])
    return sizing_from_values(
        algorithm=sa.speculative_algorithm, topk=sa.speculative_eagle_topk or 1, steps=sa.speculative_num_steps,
        draft_tokens=sa.speculative_num_draft_tokens, adaptive=bool(sa.speculative_adaptive),
        adaptive_config=config, max_running_requests=sa.max_running_requests, cuda_graph_bs=graphs,
        overlap=not sa.disable_overlap_schedule, refusals=refusals, specflip=specflip)


def _check_adaptive_config(path: str, launch_steps: int) -> None:
    """LintInputError for a malformed adaptive config: what 0.5.12 fails on, and tier entries ("1": {...}, the
    0.5.16+ format) that are malformed. 0.5.12 ignores tier keys, but a broken tiers file is bad input on every
    line, as it is where resolution drops --speculative-adaptive."""
    config = _read_adaptive_config(path)
    try:
        adaptive_candidates(config, launch_steps)
        for key, entry in config.items():
            if not key.isdigit():
                continue
            steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
            if not isinstance(steps, list) or not steps or not all(_is_step(s) for s in steps):
                raise LintInputError(f"tier {key!r}: candidate_steps must be a non-empty list of non-negative "
                                     f"integers, got {json.dumps(steps)}")
    except LintInputError as exc:
        raise LintInputError(f"the adaptive config {path}: {exc}") from None


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_adaptive_config(path: str) -> Any:
    """The adaptive config as 0.5.12's `load_adaptive_config` reads it (json.load)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise LintInputError(f"cannot read the adaptive config {path}: {exc}") from None


def launch_value(server_args: Any, attribute: str) -> Any:
    """A launch attribute as resolution left it (0.5.12 resolves into the plain attributes)."""
    return getattr(server_args, attribute)
