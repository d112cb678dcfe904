"""The SGLang 0.5.13 line, as it differs from 0.5.14 (read in the 0.5.13 wheel, 2026-12-06).

* EAGLEWorkerV2 has no zero-step path: no `_build_trivial_verify_input` and no `_stub_skipped_draft_extend` (the guard
  hooks neither).
* EAGLEWorkerV2 has no `init_cuda_graphs`: the draft worker captures its graphs inside its own `__init__`, before the
  EAGLEWorkerV2 exists. The v2 switch captures its plain path's graphs after EAGLEWorkerV2.init_cuda_graphs, so it
  has no hook point here: the switch is not offered on 0.5.13 (the guard, the step timer and lint are).
* There is no `runtime_context`: the TP rank comes from `distributed.get_tensor_model_parallel_rank` (as on 0.5.12).
* Lint: ServerArgs holds the decode graphs' batch sizes in `cuda_graph_bs` (no `cuda_graph_config` module yet), and
  there is no `SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND` (no zero-step path).

The first line without the v1 EAGLEWorker. CPU install: as 0.5.14.
"""

from __future__ import annotations

from typing import Any

from shim.releases import v0_5_14, v0_5_16
from shim.releases.sizing import Sizing, SpecflipPolicy
from shim.releases.v0_5_22 import CPU_VERIFIED

_WITHOUT = ("before_trivial_verify_input", "before_stub_skipped_draft_extend")


class Adapter(v0_5_14.Adapter):
    release = "0.5.13"
    TARGETS = tuple(t for t in v0_5_14.Adapter.TARGETS if t[2] not in _WITHOUT)

    def tp_rank(self) -> int:
        try:
            from sglang.srt.distributed import get_tensor_model_parallel_rank

            return int(get_tensor_model_parallel_rank())
        except Exception:  # noqa: BLE001 - no TP group in this process (single-process use, tests)
            return 0


class Line(v0_5_14.Line):
    """0.5.13 as it differs from 0.5.14: no v2 switch (EAGLEWorkerV2 has no init_cuda_graphs to hook)."""

    version = "0.5.13"
    adapter_class = Adapter
    offers_v2_switch = False
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "step_timer", "lint"))

    def read_sizing(self, server_args: Any, specflip: SpecflipPolicy | None = None, *,
                    republish: bool = True) -> Sizing:
        """0.5.16's reading (shim/releases/v0_5_16.read_sizing) with the graphs of `cuda_graph_bs` and no zero-step
        skip."""
        sa = server_args
        refusals, tiers = v0_5_16.adaptive_reading(sa)
        return self.sizing_from_values(
            algorithm=sa.speculative_algorithm, topk=sa.speculative_eagle_topk or 1, steps=sa.speculative_num_steps,
            draft_tokens=sa.speculative_num_draft_tokens, adaptive=bool(sa.speculative_adaptive),
            tiers=tiers,
            max_running_requests=sa.max_running_requests,
            capture_bs=[] if sa.disable_cuda_graph else list(sa.cuda_graph_bs or []),
            overlap=not sa.disable_overlap_schedule, refusals=refusals, skip_zero_step_draft_extend=False,
            specflip=specflip)

    def features(self) -> dict[str, str]:
        return {**super().features(),
                "switch": "no: EAGLEWorkerV2 has no init_cuda_graphs, where the v2 switch captures its plain path's "
                          "graphs"}


LINE = Line()
