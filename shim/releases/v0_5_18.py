"""The SGLang 0.5.18 line, as it differs from 0.5.17 (read in the 0.5.18 wheel, 2026-12-06).

* A RadixKey and a Req carry `cache_salt` beside `extra_key`: the tree's namespace is both (0.5.23's reading).
* ServerArgs has no `override`; still read-only after `__post_init__`, and the HTTP server reads
  `server_args.warmups`. The launcher-stage writer, before publish (check_server_args runs before it), is
  `ServerArgs._late_resolution(source, **fields)` (arg_groups.overrides.declare_late_resolution: in place, so every
  holder of the record sees it): the switch's warm-up goes there.

The last line with 0.5.16's KV layout, RadixCache as the plain model's tree, the lazily sized future map and
`retract_all(..., server_args, offload_kv)`; 0.5.19 changes all four (shim/releases/v0_5_19.py). Its torch pin is
2.13.0. CPU install: as 0.5.17.
"""

from __future__ import annotations

from typing import Any

from shim.releases import v0_5_17
from shim.releases.guard_hooks import V2Adapter
from shim.releases.v0_5_22 import CPU_VERIFIED


class Adapter(v0_5_17.Adapter):
    release = "0.5.18"

    def req_namespace(self, req: Any) -> Any:
        return V2Adapter.req_namespace(self, req)

    def key_namespace(self, key: Any) -> Any:
        return V2Adapter.key_namespace(self, key)


class Line(v0_5_17.Line):
    """0.5.18: 0.5.17's behaviour for the switches."""

    version = "0.5.18"
    adapter_class = Adapter
    verified = tuple((feature, CPU_VERIFIED) for feature in ("guard", "switch", "step_timer", "lint"))

    def write_warmups(self, server_args: Any, value: str) -> bool:
        server_args._late_resolution("specflip", warmups=value)
        return True


LINE = Line()
