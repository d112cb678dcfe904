"""Part of specflip's torchvision CPU import stand-in (see torchvision/__init__.py): calling raises."""

from __future__ import annotations

from torchvision._stand_in import InterpolationMode, StandInAttribute, module_getattr

__all__ = ["InterpolationMode"]


def __getattr__(attr: str) -> StandInAttribute:
    return module_getattr(__name__, attr)
