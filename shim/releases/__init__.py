"""The release layer: everything specflip knows about one SGLang release line, in one place.

One module per release line (`v0_5_12.py`, `v0_5_16.py`, `v0_5_23.py`) and one registry (`registry.LINES`); the guard
(shim/plugin.py), both switches (shim/switch/), the step timer (shim/timing/), lint (specflip/lint/) and
`specflip releases` read it. No SGLang version number, and no sniffing of SGLang objects to guess the release, outside
this package. A `.postN` release uses its base line (`registry.base_line`).

A line module holds `LINE`, an instance of its `Line` class (a `base.ReleaseLine`, satisfying `base.Release`), and
the guard's `Adapter` for the line (a `shim.releases.guard_hooks.V2Adapter` subclass: hook targets, reading requests and
KV rows). A line states only how it differs from the line it derives from: `ReleaseLine`'s defaults are the newest
line's behaviour for the switches, and `v0_5_23.Line` holds the newest line's lint reading. Where a line was
verified (`verified`) is never inherited: a new line starts unverified.

The guard's adapter that every line's `Adapter` derives from lives here too, split by concern: `guard_reading.py`
(reading live objects: requests, the pool, batches, graphs; `host_ints`), `guard_hooks.py` (`V2Adapter`: the hook
bodies and installing them) and `guard_ranks.py` (the TP rank-check glue).

To add a line (say 0.5.17):
1. Write `shim/releases/v0_5_17.py`: subclass the nearest line's `Adapter` and `Line` (e.g. `v0_5_16`), override what
   0.5.17's source does otherwise (each difference once, with a docstring line saying what 0.5.17 does), set
   `version = "0.5.17"`, `adapter_class = Adapter`, `verified`, and end with `LINE = Line()`. Lint's
   reading (`resolve_server_args`, `launch_view`, `sizing_from_values`, `read_sizing`) is inherited the same way.
2. Add `"0.5.17": "shim.releases.v0_5_17"` to `registry.LINES`.
3. Run the conformance tests on that line's real objects (tests/test_guard_adapters.py, tests/test_releases.py),
   then add what ran to `verified`; `specflip releases` shows it.
"""

from shim.releases.base import Release, ReleaseLine, WorkerKind
from shim.releases.registry import (
    LINES,
    UnsupportedRelease,
    all_lines,
    base_line,
    installed_release,
    release_line,
    supported_lines,
    supported_range,
    worker_kind,
)

__all__ = ["LINES", "Release", "ReleaseLine", "UnsupportedRelease", "WorkerKind", "all_lines", "base_line",
           "installed_release", "release_line", "supported_lines", "supported_range", "worker_kind"]
