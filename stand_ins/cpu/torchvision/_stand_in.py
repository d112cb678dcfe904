"""Shared pieces of the torchvision CPU import stand-in (see ``torchvision/__init__.py``)."""

from __future__ import annotations

import enum
from typing import Any, NoReturn

__all__ = ["InterpolationMode", "StandInAttribute", "TorchvisionStandInError", "module_getattr"]


class TorchvisionStandInError(RuntimeError):
    """Raised by every callable of the torchvision stand-in."""


def _refuse(name: str) -> NoReturn:
    raise TorchvisionStandInError(
        f"torchvision.{name} was called, but torchvision here is specflip's CPU import-only stand-in "
        "(stand_ins/cpu/torchvision): PyPI's torchvision wheel does not load beside CPU torch. "
        "Nothing of torchvision can run in this environment."
    )


class StandInAttribute:
    """Any torchvision attribute: importable and nestable, raises when called or instantiated."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> StandInAttribute:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandInAttribute(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self._name)

    def __repr__(self) -> str:
        return f"<torchvision CPU stand-in {self._name}>"


class InterpolationMode(enum.Enum):
    """Same members as torchvision.transforms.InterpolationMode (used as default arguments at import)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def module_getattr(module_name: str, attr: str) -> StandInAttribute:
    """Module-level ``__getattr__``: every missing name is a stand-in attribute."""
    if attr.startswith("__"):
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
    return StandInAttribute(f"{module_name.removeprefix('torchvision.')}.{attr}")
