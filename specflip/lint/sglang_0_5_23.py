"""`specflip lint` for SGLang 0.5.23: build the real `ServerArgs` from launch_server arguments and read what
SGLang sizes at start-up for every speculative runtime state, with SGLang's own sizing functions.

Paths are relative to the installed `sglang/srt/`. Per state, the adapter publishes the resolved config and
moves the spec bag to that state exactly as the adaptive switch does (`EAGLEWorkerV2.apply_runtime_state`:
`get_context().override(..., speculative_num_steps=, speculative_num_draft_tokens=)`), then asks:
  - `mem_cache/allocation_sizing.get_alloc_len_per_decode()`  KV reserve per decode (x2: get_alloc_reserve_per_decode)
  - the graph widths `speculative/spec_utils.resolve_num_tokens_per_req(phase="target_verify" | "draft_extend")`
    derives, read from what it reads (`tokens_per_req`: the spec bag's draft tokens, and
    `SpeculativeAlgorithm.get_num_tokens_per_req_for_target_verify`); importing spec_utils itself costs about 1 s
    (grammar backend, OpenAI protocol models) of a cold lint, and tests/test_lint.py checks the two agree
  - `speculative/adaptive_spec_params.AdaptiveSpeculativeParams.cuda_graph_bs_for_step`  graphs captured per state
  - `speculative/adaptive_spec_params.adaptive_unsupported_reason`  SGLang's refusal of adaptive
The logits-buffer size follows `model_executor/model_runner.ModelRunner.max_decode_logits_rows` (max over the
launch draft-token bound and every adaptive tier of max(capture_bs) x width); its capture-bs list follows
`model_executor/runner/base_cuda_graph_runner.get_batch_sizes_to_capture` (decode bs clamped to the request
pool, which is max_running_requests // dp_size; attention-TP alignment is not applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specflip.lint.rules import Sizing, SpecflipPolicy, StepSizing
from specflip.lint.sglang_common import (
    NEEDS_DRAFT_MODEL,
    LintInputError,
    RaisingParser,
    SGLangRefused,
    ensure_torchvision_importable,
    quiet,
    sglang_failure,
    silence_again,
)

__all__ = ["LintInputError", "SGLangRefused", "build_server_args", "launch_value", "read_sizing"]

RELEASE = "0.5.23"


def build_server_args(argv: Sequence[str], *, verbose: bool = False) -> Any:
    """`ServerArgs` exactly as `python -m sglang.launch_server argv` builds it (`prepare_server_args`), resolved.
    `verbose`: SGLang's log lines and warnings are shown (on stderr) instead of silenced."""
    ensure_torchvision_importable()
    with quiet(verbose):
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.server_args import ServerArgs, prepare_server_args

        parser = RaisingParser(prog="sglang serve", add_help=False)
        ServerArgs.add_cli_args(parser)
        parsed = parser.parse_args(list(argv))  # unknown flags / bad values: one line, before SGLang exits
        if parsed.speculative_adaptive and parsed.speculative_adaptive_config:
            _check_adaptive_config(parsed.speculative_adaptive_config)
        server_args = prepare_server_args(list(argv))
        silence_again(verbose)  # prepare_server_args re-configured logging
        try:
            server_args.resolve_once()
        except (ValueError, NotImplementedError, AssertionError, TypeError, AttributeError, KeyError) as exc:
            # SGLang's own refusal, or its resolution failing on these arguments: the server would not start
            raise SGLangRefused(sglang_failure(exc, argv, RELEASE)) from None
        except OSError as exc:
            raise LintInputError(f"SGLang could not read the model configuration: {exc}") from None
        cfg = resolving_view(server_args)
        if cfg.speculative_algorithm in NEEDS_DRAFT_MODEL and not cfg.speculative_draft_model_path:
            raise LintInputError(f"--speculative-algorithm {cfg.speculative_algorithm} needs "
                                 "--speculative-draft-model-path (the draft model's directory or id)")
    return server_args


def _check_adaptive_config(path: str) -> None:
    """SGLang's own validation of the adaptive tiers (`_load_adaptive_config`), its refusal as bad input."""
    from sglang.srt.speculative.adaptive_spec_params import _load_adaptive_config

    try:
        _load_adaptive_config(path)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise LintInputError(f"the adaptive config {path}: {str(exc).strip().splitlines()[0]}") from None


def read_sizing(server_args: Any, specflip: SpecflipPolicy | None = None, *, republish: bool = True) -> Sizing:
    """What SGLang 0.5.23 sizes at start-up for every runtime state of a resolved `ServerArgs`.

    `republish=False` (inside a running server): use the config already published; the spec bag is moved
    through the states and put back as it was.
    """
    from sglang.srt import runtime_context
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode
    from sglang.srt.speculative.adaptive_spec_params import (
        AdaptiveSpeculativeParams,
        _load_adaptive_config,
        adaptive_unsupported_reason,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    cfg = resolving_view(server_args)
    if cfg.speculative_algorithm is None:
        raise LintInputError("no --speculative-algorithm: nothing switches, nothing to lint")
    refusals: list[str] = []
    adaptive = bool(cfg.speculative_adaptive)
    if bool(getattr(server_args, "speculative_adaptive", False)) and not adaptive:
        reason = adaptive_unsupported_reason(server_args)
        refusals.append(f"SGLang drops --speculative-adaptive: {reason or 'disabled during resolution'}; "
                        "the server runs the static launch parameters")
    algo = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)
    topk = int(cfg.speculative_eagle_topk or 1)
    launch_steps = int(cfg.speculative_num_steps)
    launch_draft = int(cfg.speculative_num_draft_tokens)
    max_running = int(cfg.max_running_requests)
    capture_bs = _capture_bs(cfg, max_running)

    tiers: tuple[tuple[int, tuple[int, ...]], ...] = ()
    policy = None
    if adaptive:
        _, entries = _load_adaptive_config(cfg.speculative_adaptive_config)
        tiers = tuple((bs, tuple(sorted(set(e["candidate_steps"])))) for bs, e in sorted(entries.items()))
        with quiet():
            policy = AdaptiveSpeculativeParams(launch_steps, cfg.speculative_adaptive_config)
            policy.set_cuda_graph_bs(capture_bs or None)
        state_steps = sorted({s for _, steps in tiers for s in steps})
    else:
        state_steps = [launch_steps]

    if republish:
        with quiet():  # publish logs the overrides a previous lint left behind
            runtime_context.publish(server_args, role="scheduler")
    ctx = runtime_context.get_context()
    spec = runtime_context.get_spec()
    saved = {"speculative_num_steps": spec.speculative_num_steps,
             "speculative_num_draft_tokens": spec.speculative_num_draft_tokens}
    states = []
    try:
        for steps in state_steps:
            draft = steps + 1 if adaptive else launch_draft  # AdaptiveController.init_states: steps + 1
            ctx.override("specflip.lint", speculative_num_steps=steps, speculative_num_draft_tokens=draft)
            if policy is not None:
                graph_bs = tuple(policy.cuda_graph_bs_for_step(steps) or ())
            else:
                graph_bs = tuple(capture_bs)
            states.append(StepSizing(
                steps=steps, draft_tokens=draft, alloc_len=int(get_alloc_len_per_decode()),
                verify_width=tokens_per_req("target_verify", algo, draft),
                draft_extend_width=tokens_per_req("draft_extend", algo),
                graph_bs=graph_bs))
        logits_rows = _logits_rows(cfg, algo, capture_bs, [s.draft_tokens for s in states] if adaptive else [],
                                   runtime_context.max_speculative_num_draft_tokens())
    finally:
        ctx.override("specflip.lint.restore", **saved)

    return Sizing(
        release=RELEASE, algorithm=cfg.speculative_algorithm, topk=topk, launch_steps=launch_steps,
        launch_draft_tokens=launch_draft, overlap=not bool(cfg.disable_overlap_schedule),
        max_running_requests=max_running, logits_rows=logits_rows, states=tuple(states), adaptive=adaptive,
        tiers=tiers, refusals=tuple(refusals),
        skip_zero_step_draft_extend=bool(envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get()), specflip=specflip)


def _capture_bs(cfg: Any, max_running: int) -> list[int]:
    """Decode graph batch sizes (base_cuda_graph_runner.get_batch_sizes_to_capture); [] when graphs are off."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    graph_cfg = cfg.cuda_graph_config
    if cfg.disable_cuda_graph or graph_cfg is None or graph_cfg.decode.backend == Backend.DISABLED:
        return []
    bs = list(graph_cfg.decode.bs or [])
    if not bs:
        return []
    pool = max(1, max_running // max(1, int(cfg.dp_size or 1)))
    if max(bs) > pool:
        bs.append(pool)
    return sorted({b for b in bs if 0 < b <= pool})


def _logits_rows(cfg: Any, algo: Any, capture_bs: list[int], tier_draft_tokens: list[int],
                 max_draft: int | None) -> int:
    """ModelRunner.max_decode_logits_rows: the launch bound and every adaptive tier, max(capture_bs) x width."""
    if not capture_bs:
        return 0
    counts = [max_draft or 1, *tier_draft_tokens]
    return max(max(capture_bs) * tokens_per_req("target_verify", algo, d) for d in counts)


def tokens_per_req(phase: str, algo: Any, num_draft_tokens: int | None = None) -> int:
    """`speculative/spec_utils.resolve_num_tokens_per_req(phase=...)` for the target's graphs (not a draft
    worker), read from what it reads: the published spec bag and the algorithm's own target-verify hook.
    spec_utils is not imported for it: its module imports (grammar backend, OpenAI protocol models, the
    speculative kernels) cost about 1 s of a cold lint, and its function is these lines.
    tests/test_lint.py::test_tokens_per_req_is_sglangs_resolve_num_tokens_per_req holds the two together."""
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    if phase == "draft_extend":
        return int(spec.speculative_num_draft_tokens)
    if phase == "target_verify":
        draft = spec.speculative_num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        return int(algo.get_num_tokens_per_req_for_target_verify(draft, False))
    raise ValueError(f"lint reads no {phase!r} width")


def launch_value(server_args: Any, attribute: str) -> Any:
    """A launch attribute as resolution left it (the resolved view: 0.5.23 keeps resolved values in its bags)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    return getattr(resolving_view(server_args), attribute)
