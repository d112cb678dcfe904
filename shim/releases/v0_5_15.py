"""The SGLang 0.5.15 line, as it differs from 0.5.16 (read in the 0.5.15 wheel, 2026-12-06).

* A Req keeps `req_pool_idx`, `kv_committed_len`, `kv_allocated_len` and `cache_protected_len` on itself: there is
  no ReqKvInfo (`req.kv`) yet.
* `retract_all(..., server_args)` takes no `offload_kv`.
* ServerArgs is a plain dataclass with no `override`, writable after resolution: the switch's warm-up is assigned to
  `server_args.warmups` (`base.assign_warmups`; 0.5.14 and 0.5.13 inherit it).

CPU install: transformers 5.12.1 / tokenizers 0.22.2 (its pins; .venv's transformers 5.19 refuses its `qwen3_asr`
config); no xgrammar (its function-call parsers do not import it).
"""

from __future__ import annotations

from typing import Any

from shim.releases import v0_5_16
from shim.releases.base import assign_warmups
from shim.releases.v0_5_22 import CPU_VERIFIED


class Adapter(v0_5_16.Adapter):
    release = "0.5.15"

    def req_kv_lens(self, req: Any) -> tuple[bool, int, int, int]:
        if req.req_pool_idx is None:
            return False, 0, 0, 0
        return True, int(req.kv_committed_len), int(req.kv_allocated_len), int(req.cache_protected_len)


class Line(v0_5_16.Line):
    """0.5.15 as it differs from 0.5.16: every KV length on the Req; retract_all without offload_kv."""

    version = "0.5.15"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))
    retract_all_takes_offload_kv = False
    write_warmups = assign_warmups

    def kv_row(self, req: Any) -> tuple[int | None, int, int]:
        if req.req_pool_idx is None:
            return None, int(req.kv_committed_len), 0
        return req.req_pool_idx, int(req.kv_committed_len), int(req.kv_allocated_len)


LINE = Line()
