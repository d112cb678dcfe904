"""The SGLang 0.5.13 line, as it differs from 0.5.14 (read in the 0.5.13 wheel, 2026-12-06).

* EAGLEWorkerV2 has no zero-step path: no `_build_trivial_verify_input` and no `_stub_skipped_draft_extend` (the guard
  hooks neither).
* EAGLEWorkerV2 has no `init_cuda_graphs`, and the scheduler no `init_all_cuda_graphs`: the target's ModelRunner
  captures its graphs in its own `initialize` (`init_device_graphs`), inside TpModelWorker's construction, and the
  scheduler then builds EAGLEWorkerV2 with that worker (`maybe_init_draft_worker`), whose `__init__` builds the
  EagleDraftWorker, which captures the draft's graphs inside its own `__init__` (then the adaptive states, when on).
  So the v2 switch captures its plain decode graph runner AFTER `EAGLEWorkerV2.__init__` (read in the 0.5.13 wheel,
  2026-12-06: scheduler.py init_model_worker, model_runner.py initialize, eagle_worker_v2.py).
* The target's decode graph runner is ModelRunner.graph_runner, a `model_executor.cuda_graph_runner.CudaGraphRunner`
  (0.5.14 moved it to `decode_cuda_graph_runner`, a `runner.decode_cuda_graph_runner.DecodeCudaGraphRunner`).
* No `prefill_cuda_graph_runner`: the target's prefill graphs are the piecewise runner (`piecewise_cuda_graph_runner`,
  `can_run`, off by default), which the plain path's prefill view does not serve; the plain path's prefills run as
  SGLang runs the target's.
* There is no `runtime_context`: the TP rank comes from `distributed.get_tensor_model_parallel_rank` (as on 0.5.12).
* Lint: ServerArgs holds the decode graphs' batch sizes in `cuda_graph_bs` (no `cuda_graph_config` module yet), and
  there is no `SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND` (no zero-step path).

The first line without the v1 EAGLEWorker. CPU install: as 0.5.14.
"""

from __future__ import annotations

from typing import Any

from shim.releases import v0_5_14, v0_5_16
from shim.releases.guard_reading import cuda_graph_runner_replay
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

    def graph_for(self, model_runner: Any, batch_size: int, spec_info: Any) -> tuple[int, int] | None:
        """The CUDA graph a forward of `batch_size` requests replays: the target's `graph_runner`, 0.5.13's
        CudaGraphRunner (whose `can_run` ignores the tokens per request, as 0.5.12's; the plain path swaps in its
        own runner there)."""
        return cuda_graph_runner_replay(getattr(model_runner, "graph_runner", None), batch_size)


class Line(v0_5_14.Line):
    """0.5.13 as it differs from 0.5.14: the v2 switch's plain side hooks EAGLEWorkerV2.__init__ and reads the target's
    `graph_runner`; no prefill graph runner for the plain path."""

    version = "0.5.13"
    adapter_class = Adapter
    plain_capture_target = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.__init__"
    decode_graph_runner_attr = "graph_runner"
    decode_graph_runner_class = "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner"
    prefill_graph_runner_attr = None
    stubs_skipped_draft_extend = False  # no zero-step path: SPECFLIP_SWITCH_DRAFT=none is refused at start-up
    verified = (*((feature, CPU_VERIFIED) for feature in ("guard", "step_timer", "lint")),
                ("switch", "CPU only, real 0.5.13 objects in CI (tests/test_release_conformance.py, 2026-12-06: "
                           "SGLang's real start-up reaches the plain capture hook on EAGLEWorkerV2.__init__ once, "
                           "after it built both workers; the real ModelRunner forward replays the plain runner the "
                           "plain path installs; stand-ins for the target's and the draft's model load and CUDA graph "
                           "capture and for the graph runners). Not on a GPU: 0.5.13 pins sglang-kernel 0.4.3, which "
                           "the GPU bundle (0.5.16's, sglang-kernel 0.4.5) does not carry"))

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
            specflip=specflip, **self.graph_layout(sa, republish=republish))

    def features(self) -> dict[str, str]:
        return {**super().features(),
                "switch": "v2 (shim/switch/v2.py; SPECFLIP_SWITCH=t_off:t_on or auto; its plain decode graphs are "
                          "captured after EAGLEWorkerV2.__init__; SPECFLIP_SWITCH_DRAFT=none is not offered: no "
                          "_stub_skipped_draft_extend)"}


LINE = Line()
