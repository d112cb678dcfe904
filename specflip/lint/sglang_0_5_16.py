"""`specflip lint` for SGLang 0.5.16, transcribed from the 0.5.16 wheel's source (read, not installed here).

0.5.16 resolves ServerArgs in `__post_init__` (plain attributes, no published config bags), so the sizing is a
pure function of those attributes. What 0.5.16 sizes (paths relative to `sglang/srt/` of the 0.5.16 wheel):
  - KV reserve: `mem_cache/allocation_sizing.get_alloc_len_per_decode(server_args)` =
    max(steps * topk, server_args.max_speculative_num_draft_tokens) (page 1 or topk 1), where
    `server_args.max_speculative_num_draft_tokens` (server_args.py ~L7523) is max(candidate_steps) + 1 under
    --speculative-adaptive: the largest state, as in 0.5.23. x2 in get_alloc_reserve_per_decode.
  - Logits buffer: `model_executor/model_runner.ModelRunner.max_decode_logits_rows` (~L722) =
    max(capture_bs) x decode_num_tokens_per_req() of the LAUNCH draft-token count only (0.5.23 takes the max
    over every adaptive tier); `model_executor/graph_shared_output.GraphSharedOutput.get_logits_buffer` asserts
    rows <= max_rows (sglang #30549).
  - Graphs per adaptive state: EVERY candidate state is captured at start-up at the whole decode capture list.
    `speculative/adaptive_runtime_state.AdaptiveController.init_states` builds each candidate, passing
    `AdaptiveSpeculativeParams.cuda_graph_bs_for_step(steps)`, but that is None unless `--cuda-graph-bs` was given
    (`eagle_worker_v2` passes `server_args.cuda_graph_bs_decode`, unset by default), and when given,
    `EAGLEWorkerV2._override_worker_state` overrides `cuda_graph_bs_decode` while the runners read
    `cuda_graph_config.decode.bs`, resolved once in `__post_init__` (`model_executor/runner/
    base_cuda_graph_runner.get_batch_sizes_to_capture`). So the tier routing prunes nothing: a candidate wider
    than the launch width asserts in `GraphSharedOutput.get_logits_buffer` during capture (seen on the H200:
    default tiers, launch steps 3, died at start-up; launch steps 7 / 8 draft tokens started). Default tiers
    `DEFAULT_ADAPTIVE_CONFIG` = bs1 [1,3,7], bs8 [0,1,3], bs32 [0,1], bs64 [0]; launch steps
    candidate_steps[len // 2] (`arg_groups/speculative_hook.py` ~L750).
  - Refusals: `adaptive_unsupported_reason` (topk != 1, dp attention, multi-layer EAGLE, TBO, PD-mux).
This module is not exercised against an installed 0.5.16 in CI; `sizing_from_values` is, on CPU.
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
    given_flag,
    quiet,
    sglang_failure,
    silence_again,
)

__all__ = ["LintInputError", "SGLangRefused", "build_server_args", "launch_value", "read_sizing", "sizing_from_values"]

RELEASE = "0.5.16"
DEFAULT_ADAPTIVE_TIERS: tuple[tuple[int, tuple[int, ...]], ...] = (
    (1, (1, 3, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))


def spec_decode_capture_bs(max_bs: int) -> list[int]:
    """`generate_decode_cuda_graph_batch_sizes`, speculative branch (identical in 0.5.16 and 0.5.23)."""
    bs = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
          + list(range(272, max_bs + 1, 16)))
    bs = [b for b in bs if b <= max_bs]
    return bs if max_bs in bs else [*bs, max_bs]


def sizing_from_values(*, algorithm: str = "EAGLE", topk: int = 1, steps: int | None = None,
                       draft_tokens: int | None = None, adaptive: bool = False,
                       tiers: Sequence[tuple[int, Sequence[int]]] = DEFAULT_ADAPTIVE_TIERS,
                       max_running_requests: int = 48, capture_bs: Sequence[int] | None = None,
                       overlap: bool = True, refusals: Sequence[str] = (),
                       skip_zero_step_draft_extend: bool = False,
                       specflip: SpecflipPolicy | None = None) -> Sizing:
    """0.5.16's start-up sizing from resolved values (what its ServerArgs attributes hold)."""
    tiers = tuple((bs, tuple(sorted(set(s)))) for bs, s in sorted(tiers))
    candidates = sorted({s for _, st in tiers for s in st})
    if adaptive:
        steps = candidates[len(candidates) // 2] if steps is None else steps
        draft_tokens = steps + 1
        max_draft = max(candidates) + 1
    else:
        if steps is None or draft_tokens is None:
            raise LintInputError("0.5.16 static speculation needs --speculative-num-steps and -num-draft-tokens")
        max_draft = draft_tokens
    if capture_bs is None:
        capture_bs = spec_decode_capture_bs(max_running_requests)
    capture_bs = sorted({b for b in capture_bs if b <= max_running_requests} | (
        {max_running_requests} if capture_bs and max(capture_bs) > max_running_requests else set()))
    states = []
    for s in (candidates if adaptive else [steps]):
        d = s + 1 if adaptive else draft_tokens
        alloc_len = max(s * topk if s else topk, max_draft)  # `speculative_num_steps or 1`
        graph_bs = tuple(capture_bs)  # every state at the whole list: the tier pruning never reaches the capture
        states.append(StepSizing(steps=s, draft_tokens=d, alloc_len=alloc_len, verify_width=d,
                                 draft_extend_width=d, graph_bs=graph_bs))
    logits_rows = max(capture_bs) * draft_tokens if capture_bs else 0  # launch width only
    return Sizing(release=RELEASE, algorithm=algorithm, topk=topk, launch_steps=steps, launch_draft_tokens=draft_tokens,
                  overlap=overlap, max_running_requests=max_running_requests, logits_rows=logits_rows,
                  states=tuple(states), adaptive=adaptive, tiers=tiers if adaptive else (),
                  refusals=tuple(refusals), skip_zero_step_draft_extend=skip_zero_step_draft_extend,
                  specflip=specflip)


def build_server_args(argv: Sequence[str], *, verbose: bool = False) -> Any:
    """`prepare_server_args(argv)`, as launch_server runs it; 0.5.16 resolves in ServerArgs.__post_init__.
    `verbose`: SGLang's log lines and warnings are shown (on stderr) instead of silenced."""
    ensure_torchvision_importable()
    with quiet(verbose):
        from sglang.srt.server_args import ServerArgs, prepare_server_args

        parser = RaisingParser(prog="sglang serve", add_help=False)
        ServerArgs.add_cli_args(parser)
        parsed = parser.parse_args(list(argv))  # unknown flags / bad values: one line, before SGLang exits
        if parsed.speculative_adaptive and parsed.speculative_adaptive_config:
            _check_adaptive_config(parsed.speculative_adaptive_config)
        try:
            server_args = prepare_server_args(list(argv))
        except (ValueError, NotImplementedError, AssertionError, TypeError, AttributeError, KeyError) as exc:
            # SGLang's own refusal, or its resolution failing on these arguments: the server would not start
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


def _check_adaptive_config(path: str) -> None:
    """SGLang's own validation of the adaptive tiers (`_load_adaptive_config`), its refusal as bad input."""
    from sglang.srt.speculative.adaptive_spec_params import _load_adaptive_config

    try:
        _load_adaptive_config(path)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise LintInputError(f"the adaptive config {path}: {str(exc).strip().splitlines()[0]}") from None


def read_sizing(server_args: Any, specflip: SpecflipPolicy | None = None, *,
                republish: bool = True) -> Sizing:  # pragma: no cover - needs sglang 0.5.16 installed
    from sglang.srt.speculative.adaptive_spec_params import _load_adaptive_config, adaptive_unsupported_reason

    sa = server_args
    if sa.speculative_algorithm is None:
        raise LintInputError("no --speculative-algorithm: nothing switches, nothing to lint")
    refusals = []
    if getattr(sa, "_specflip_given_adaptive", False) and not sa.speculative_adaptive:
        reason = adaptive_unsupported_reason(sa)
        refusals.append(f"SGLang drops --speculative-adaptive: {reason or 'disabled during resolution'}; "
                        "the server runs the static launch parameters")
    _, entries = _load_adaptive_config(sa.speculative_adaptive_config or None)
    tiers = [(bs, entry["candidate_steps"]) for bs, entry in entries.items()]
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend

    decode = sa.cuda_graph_config.decode if getattr(sa, "cuda_graph_config", None) else None
    graphs_off = sa.disable_cuda_graph or decode is None or decode.backend == Backend.DISABLED
    capture_bs = [] if graphs_off else list(decode.bs or [])
    return sizing_from_values(
        algorithm=sa.speculative_algorithm, topk=sa.speculative_eagle_topk or 1, steps=sa.speculative_num_steps,
        draft_tokens=sa.speculative_num_draft_tokens, adaptive=bool(sa.speculative_adaptive), tiers=tiers,
        max_running_requests=sa.max_running_requests, capture_bs=capture_bs,
        overlap=not sa.disable_overlap_schedule, refusals=refusals,
        skip_zero_step_draft_extend=bool(envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get()), specflip=specflip)


def launch_value(server_args: Any, attribute: str) -> Any:
    """A launch attribute as resolution left it (0.5.16 resolves into the plain attributes)."""
    return getattr(server_args, attribute)
