"""A pytest plugin for scripts/hook_removal.sh, never loaded by the test suite: `H51_DISABLE_HOOK=<adapter method>`
makes that hook of the 0.5.23 adapter a pass-through (a guard that stopped checking there), patched before SGLang's
`load_plugins()` installs the hooks (an AROUND hook still calls the original). Loaded with `-p hook_removal_plugin`."""

from __future__ import annotations

import os
from typing import Any


def pytest_configure(config: Any) -> None:
    name = os.environ.get("H51_DISABLE_HOOK")
    if not name:
        return
    from shim.releases.v0_5_23 import Adapter

    how = {method: kind for _, kind, method in Adapter.TARGETS}.get(name)
    if how is None and not hasattr(Adapter, name):
        raise ValueError(f"no adapter method {name!r}")

    def around(self: Any, original: Any, *args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    def nothing(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    setattr(Adapter, name, around if how == "AROUND" else nothing)
