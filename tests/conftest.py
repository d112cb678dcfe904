"""Fixtures shared by the test modules that drive real SGLang objects on the CPU.

Imported lazily inside each fixture: this file loads for every test run, including the v1-line tests in
`.venv12` (SGLang 0.5.12), which use neither fixture.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_objects_required import pytest_configure  # noqa: F401 - the hook: a real-object test skipped in CI fails

TESTS = Path(__file__).resolve().parent


def _helper(name: str) -> Any:
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def runtime() -> Iterator[Any]:
    """The guard plugin installed through SGLang's real HookRegistry, active for this module's tests."""
    rt = _helper("guard_fixtures").install_guard_plugin()
    rt.paused = False
    yield rt
    rt.reset()
    rt.paused = True  # the hooks stay (HookRegistry cannot unpatch); other test files see pass-through


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model config SGLang's real ModelConfig loads (tests/sglang_cpu.py)."""
    return _helper("sglang_cpu").write_tiny_model_config(tmp_path_factory.mktemp("tiny-model"))
