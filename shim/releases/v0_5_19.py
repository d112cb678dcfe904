"""The SGLang 0.5.19 line, as it differs from 0.5.20 (read in the 0.5.19 wheel, 2026-12-06): nothing specflip reads.

The first line whose Req keeps its row and every KV length in `req.kv` (ReqKvInfo, always set), whose factory builds
the UnifiedRadixCache for a plain model, whose future map has no lazy sizing flag and whose `retract_all` takes
`offload_kv` only: 0.5.18 differs from it there (shim/releases/v0_5_18.py). CPU install: as 0.5.21.
"""

from __future__ import annotations

from shim.releases import v0_5_20
from shim.releases.v0_5_22 import CPU_VERIFIED


class Adapter(v0_5_20.Adapter):
    release = "0.5.19"


class Line(v0_5_20.Line):
    """0.5.19: 0.5.20's behaviour in everything specflip reads."""

    version = "0.5.19"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))


LINE = Line()
