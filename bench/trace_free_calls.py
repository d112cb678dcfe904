"""Which of SGLang 0.5.23's `TokenToKVPoolAllocator.free` calls pass a view of a req_to_token row and which a copy,
counted by call site over clean runs on the CPU objects (tests/guard_fixtures.py; guard on, assert mode): 4 requests to
completion, then 3 more with a flip off and on, radix cache off and on. The figures are in docs/guard.md ("Slot
identity by value"); a copy is what the guard's slot-value check reads by value (shim/guard/slot_values.py).

    .venv/bin/python bench/trace_free_calls.py
"""

from __future__ import annotations

import collections
import importlib
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main() -> None:
    from real_sglang_cpu import require_sglang_cpu

    require_sglang_cpu()
    gf = importlib.import_module("guard_fixtures")
    h = importlib.import_module("sglang_cpu")
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    from shim.releases.guard_reading import row_range
    from statemodel.designs import CATCH_UP

    rt = gf.install_guard_plugin()
    rt.paused = False
    model_dir = h.write_tiny_model_config(Path(tempfile.mkdtemp()))
    original = TokenToKVPoolAllocator.free
    for radix in (False, True):
        gf.configure_guard(rt, CATCH_UP)
        pools = gf.eagle_pools(model_dir, radix_cache=radix)
        rows = pools.req_to_token_pool.req_to_token
        counts: collections.Counter[tuple[str, str]] = collections.Counter()

        def free(self: Any, index: Any, rows: Any = rows, counts: Any = counts) -> Any:
            callers = [f"{f.filename.rsplit('/', 1)[-1]}:{f.name}" for f in traceback.extract_stack(limit=6)[:-1]]
            site = next((c for c in reversed(callers) if not c.startswith(("token.py", "base.py"))), callers[-1])
            site = "free_group_end (flush)" if site.startswith("hook_registry.py") else site
            counts[("view" if row_range(index, rows) is not None else "copy", site)] += 1
            return original(self, index)

        TokenToKVPoolAllocator.free = free  # type: ignore[method-assign]
        try:
            drv = gf.DesignDriver(pools, CATCH_UP)
            drv.admit(gf.make_reqs("r", 4, max_new_tokens=12, shared_prefix=gf.SYSTEM_PROMPT))
            drv.run_to_completion()
            drv.merge(drv.prefill(gf.make_reqs("s", 3, max_new_tokens=9, shared_prefix=gf.SYSTEM_PROMPT)))
            drv.decode()
            drv.flip_off()
            drv.decode()
            drv.flip_on()
            drv.run_to_completion()
        finally:
            TokenToKVPoolAllocator.free = original  # type: ignore[method-assign]
        guard = rt.guard
        print(f"radix {'on' if radix else 'off'}: allocs checked {guard.slot_values.allocs}, frees checked by "
              f"value {guard.slot_values.checked}, findings {len(guard.found)}")
        for (kind, site), n in sorted(counts.items()):
            print(f"  {n:4d}  {kind:5s}  {site}")


if __name__ == "__main__":
    main()
