"""The SGLang 0.5.17 line, as it differs from 0.5.16 (read in the 0.5.17 wheel, 2026-12-06).

* `require_gathered_buffer(server_args)` (whether the decode graphs' sizes are aligned to the attention TP size) reads
  the published config, not its argument: lint publishes first (`Line.gathered_buffer_required`; 2026-12-07).

Its ServerArgs is read-only after resolution always (0.5.16: only under SGLANG_STRICT_CONFIG_MUTATION): a plain
assignment of `server_args.warmups` stopped a SPECFLIP_SWITCH=auto server's start-up (H200, 2026-12-06). The warm-up
goes through `ServerArgs.override`, which 0.5.16 already has (v0_5_16.Line.write_warmups).

0.5.17 publishes its config through `runtime_context.publish` (0.5.16's `get_global_server_args` reads the same
context). Still 0.5.16's: the row and the committed length on the Req, `kv_allocated_len` in `req.kv`; RadixCache with
`cache_unfinished_req` (the factory's tree for a plain model); RadixKey without `cache_salt`; the lazily sized future
map; `retract_all(..., server_args, offload_kv)`; the draft worker's own TP context. Its torch pin is 2.11.0, the GPU
host's: `bench/gpu/line_run.sh` runs it there (the 0.5.16 bundle with 0.5.17's slimmed wheel laid over it; the bundle's
flashinfer-python 0.6.14 and sgl-deep-gemm 0.1.4.post1 serve, 0.5.17 pins 0.6.15.post1 / 0.1.5.post1 for code the
Llama pair does not run). CPU install: transformers 5.12.1, tokenizers 0.22.2, xgrammar.
"""

from __future__ import annotations

from typing import Any

from shim.releases import v0_5_16
from shim.releases.server_args import quiet
from shim.releases.v0_5_22 import CPU_CONFORMANCE, CPU_VERIFIED


class Adapter(v0_5_16.Adapter):
    release = "0.5.17"


class Line(v0_5_16.Line):
    """0.5.17: 0.5.16's behaviour in everything specflip reads."""

    version = "0.5.17"
    adapter_class = Adapter
    # GPU: one NVIDIA H100 80GB HBM3, 2026-12-06, code 8c6c165, `LINE=0.5.17 bash bench/gpu/line_run.sh` (raw files
    # bench/gpu/results/2026-12-06_59347e0/line_0517/); the run before the warm-up fix is line_0517_before_fix/
    _GPU = ("GPU H100, 2026-12-06 (code 8c6c165): the tiny counter pair served plain, with SPECFLIP_SWITCH=auto and "
            "with SPECFLIP_SWITCH=4:2, both with the guard in assert mode: 208/208 outputs greedy-exact on each, "
            "8 and 14 flips under load, the warm-up ran, 0 findings (bench/gpu/line_run.sh; docs/releases.md)")
    verified = (("guard", _GPU), ("switch", _GPU), ("guard", CPU_CONFORMANCE), ("switch", CPU_CONFORMANCE),
                *((feature, CPU_VERIFIED) for feature in ("step_timer", "lint")))

    def gathered_buffer_required(self, server_args: Any, *, republish: bool = True) -> bool:
        """From 0.5.17 `require_gathered_buffer(server_args)` reads the published config (`runtime_context`), not its
        argument: lint publishes the resolved ServerArgs first in its own process (read in the 0.5.17 and 0.5.18
        wheels' utils/common.py, 2026-12-07)."""
        from sglang.srt import runtime_context
        from sglang.srt.utils.common import require_gathered_buffer

        if republish:
            with quiet():
                runtime_context.publish(server_args, role="scheduler")
        return bool(require_gathered_buffer(server_args))


LINE = Line()
