"""xgrammar CPU import stand-in for running `specflip lint` against SGLang 0.5.16's source on CPU. NOT xgrammar.

SGLang 0.5.16's `server_args` imports `function_call_parser`, which imports `xgrammar.StructuralTag` at module
level and uses it as a pydantic field type. Neither .venv nor .venv12 has xgrammar, and lint never builds a
grammar. `StructuralTag` is a permissive pydantic model so that those model classes can be defined; every other
attribute is a class that raises when instantiated. Only `bench/gpu/lint_matrix.py --cpu-0516` (and whoever
puts `stand_ins/cpu_sglang_0_5_16` on PYTHONPATH) loads it; it is never installed.
"""

from __future__ import annotations

from typing import Any

import pydantic

__version__ = "0.0.0+specflip.cpu.stand.in"


class XgrammarStandInError(RuntimeError):
    """Raised by anything of the stand-in that would need the real xgrammar."""


class StructuralTag(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def _refuse(*_args: Any, **_kwargs: Any) -> None:
        raise XgrammarStandInError(f"xgrammar.{name} is a CPU import stand-in (stand_ins/cpu_sglang_0_5_16)")

    return type(name, (), {"__init__": _refuse})
