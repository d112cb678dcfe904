"""The SGLang 0.5.19 line, as it differs from 0.5.20 (read in the 0.5.19 wheel, 2026-12-06).

* `runtime_context.publish` does not compute the derived parallel widths (the attention TP size, ...):
  `initialize_model_parallel` stamps them when it builds the process groups. Lint stamps them itself
  (`Line.stamp_derived_widths`; read in the 0.5.19 wheel, 2026-12-07).

The first line whose Req keeps its row and every KV length in `req.kv` (ReqKvInfo, always set), whose factory builds
the UnifiedRadixCache for a plain model, whose future map has no lazy sizing flag and whose `retract_all` takes
`offload_kv` only: 0.5.18 differs from it there (shim/releases/v0_5_18.py). CPU install: as 0.5.21.
"""

from __future__ import annotations

from typing import Any

from shim.releases import v0_5_20
from shim.releases.sizing import attention_dp_size
from shim.releases.v0_5_22 import CPU_VERIFIED


class Adapter(v0_5_20.Adapter):
    release = "0.5.19"


class Line(v0_5_20.Line):
    """0.5.19: 0.5.20's behaviour in everything specflip reads."""

    version = "0.5.19"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))

    def stamp_derived_widths(self, server_args: Any) -> None:
        """0.5.19's `publish` leaves the derived parallel widths to `initialize_model_parallel`, which stamps them when
        it builds the process groups (distributed/parallel_state.py), and the graphs' batch-size alignment
        (`get_cuda_graph_batch_size_alignment`) reads the attention TP size from them: lint, which builds no group,
        stamps what that call stamps, SGLang's own `derive_parallel_widths` of the resolved leaves
        (distributed/bootstrap.py's arguments)."""
        from sglang.srt.runtime_context import derive_parallel_widths, get_parallel

        cfg = self.launch_view(server_args)
        dcp = int(cfg.dcp_size or 1)
        get_parallel().stamp_derived_widths(**derive_parallel_widths(
            tp_size=int(cfg.tp_size), attn_cp_size=int(cfg.attn_cp_size or 1), attn_dp_size=attention_dp_size(cfg),
            moe_ep_size=int(cfg.ep_size or 1), moe_dp_size=int(cfg.moe_dp_size or 1), dcp_size=dcp,
            dcp_enabled=dcp > 1))


LINE = Line()
