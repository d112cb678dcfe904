"""The preamble of the test modules that drive real SGLang objects on the CPU (one place, not one copy a module):
tests/ and the CPU stand-ins (stand_ins/cpu: torchvision) first on sys.path, and the module skipped where torch or
SGLang's scheduler cannot be imported. A skip in the CI venv fails the run (real_objects_required.py)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
STAND_INS = TESTS.parent / "stand_ins" / "cpu"


def require_sglang_cpu() -> None:
    """Call at a test module's top, before it imports SGLang or the harness modules."""
    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(STAND_INS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang's import-time warnings about CUDA-only kernels
        pytest.importorskip("torch")
        pytest.importorskip("sglang.srt.managers.schedule_batch")
