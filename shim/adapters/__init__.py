"""The guard's per-release adapters. Version dispatch, in one place: the SGLang release installed picks the
adapter module.

The guard reaches SGLang internals only through these modules; the switches (shim/switch/) and the step timer
(shim/timing/) hook SGLang themselves, and `specflip lint` reads ServerArgs through specflip/lint/sglang_*.py.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

from shim.adapters.common import V2Adapter

# release -> adapter module. A release line missing here gets one message and no guard.
ADAPTERS: dict[str, str] = {
    "0.5.23": "shim.adapters.sglang_0_5_23",
    "0.5.16": "shim.adapters.sglang_0_5_16",
    "0.5.12": "shim.adapters.sglang_0_5_12",
}


def installed_release() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def select_adapter(release: str | None = None) -> tuple[V2Adapter | None, str]:
    """(adapter, "") for a supported release, else (None, why not)."""
    release = release or installed_release()
    if release is None:
        return None, "sglang is not installed"
    module_name = ADAPTERS.get(release)
    if module_name is None:
        return None, f"sglang {release} is not a supported release (supported: {', '.join(sorted(ADAPTERS))})"
    module = importlib.import_module(module_name)
    return module.Adapter(), ""
