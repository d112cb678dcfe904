"""torchvision CPU import stand-in for specflip's tests. NOT torchvision.

PyPI's torchvision wheel links CUDA libraries and fails to load beside the CPU build of torch
(``operator torchvision::nms does not exist``), yet sglang 0.5.23 imports torchvision at module import
time (``sglang.srt.configs`` -> ``nano_nemotron_vl`` -> ``multimodal/internvl_utils.py``, and the image
processors). This package only lets those imports succeed: every attribute of it and of its submodules
(``transforms``, ``transforms.functional``, ``transforms.v2``, ``transforms.v2.functional``, ``io``) is a
stand-in, and calling or instantiating anything raises ``TorchvisionStandInError``. Only
``transforms.InterpolationMode`` is a real enum (modules use its members as default arguments).

The test harness (``tests/sglang_cpu.py``) puts ``stand_ins/cpu`` at the front of ``sys.path``; this is
never installed into site-packages.
"""

from __future__ import annotations

from torchvision import io, transforms
from torchvision._stand_in import StandInAttribute, TorchvisionStandInError, module_getattr

__version__ = "0.0.0+specflip.cpu.stand.in"
IS_SPECFLIP_STAND_IN = True

__all__ = ["IS_SPECFLIP_STAND_IN", "StandInAttribute", "TorchvisionStandInError", "io", "transforms"]


def __getattr__(attr: str) -> StandInAttribute:
    return module_getattr(__name__, attr)
