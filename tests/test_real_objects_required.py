"""The CI rule of tests/real_objects_required.py, shown firing: a skipped real-object test fails the run under
SPECFLIP_REQUIRE_SGLANG=1 (and CI=true), and passes without it; other skips are left alone. A skipped v1-line
test (marked sglang_v1) fails only the run that requires them (SPECFLIP_REQUIRE_SGLANG_V1=1: the .venv12 run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

MARKED_SKIP = '''
import pytest

pytestmark = pytest.mark.sglang


def test_on_real_objects():
    pytest.skip("sglang is not importable")
'''
MODULE_IMPORTORSKIP = '''
import pytest

pytest.importorskip("specflip_no_such_module")
pytestmark = pytest.mark.sglang


def test_on_real_objects():
    pass
'''
V1_MARKED_SKIP = '''
import pytest

pytestmark = [pytest.mark.sglang_v1, pytest.mark.skipif(True, reason="needs sglang 0.5.12")]


def test_on_v1_objects():
    pass
'''
UNMARKED_SKIP = '''
import pytest


def test_elsewhere():
    pytest.skip("not a real-object test")


def test_runs():
    pass
'''


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    requiring = ("CI", "SPECFLIP_REQUIRE_SGLANG", "SPECFLIP_REQUIRE_SGLANG_V1")
    base = {k: v for k, v in os.environ.items() if k not in requiring}
    # the repository too: the plugin reads its variables through shim/settings.py
    base["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(TESTS.parent), base.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "real_objects_required", "-p",
                           "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning", "."],
                          cwd=tmp_path, env={**base, **env}, capture_output=True, text=True, timeout=300)


def test_a_skipped_real_object_test_fails_the_run_in_ci(tmp_path: Path) -> None:
    (tmp_path / "test_marked_skip.py").write_text(MARKED_SKIP)
    (tmp_path / "test_module_skip.py").write_text(MODULE_IMPORTORSKIP)
    (tmp_path / "test_unmarked_skip.py").write_text(UNMARKED_SKIP)
    local = _run(tmp_path)
    assert local.returncode == 0, local.stdout + local.stderr
    assert "1 passed, 3 skipped" in local.stdout
    for env in ({"SPECFLIP_REQUIRE_SGLANG": "1"}, {"CI": "true"}):
        ci = _run(tmp_path, **env)
        assert ci.returncode == 1, ci.stdout + ci.stderr
        section = ci.stdout.split("real-object tests skipped in CI", 1)[1]
        assert "test_marked_skip.py::test_on_real_objects: sglang is not importable" in section
        assert "test_module_skip.py (module)" in section
        assert "test_unmarked_skip" not in section  # other skips stay skips


def test_a_skipped_v1_test_fails_only_the_v1_run(tmp_path: Path) -> None:
    (tmp_path / "test_v1_marked_skip.py").write_text(V1_MARKED_SKIP)
    (tmp_path / "test_unmarked_skip.py").write_text(UNMARKED_SKIP)
    for env in ({}, {"SPECFLIP_REQUIRE_SGLANG": "1"}, {"CI": "true"}):
        main_suite = _run(tmp_path, **env)  # the main venv holds 0.5.23: the v1 tests skip there, rightly
        assert main_suite.returncode == 0, main_suite.stdout + main_suite.stderr
        assert "1 passed, 2 skipped" in main_suite.stdout
    v1_run = _run(tmp_path, SPECFLIP_REQUIRE_SGLANG_V1="1")
    assert v1_run.returncode == 1, v1_run.stdout + v1_run.stderr
    section = v1_run.stdout.split("real-object tests skipped in CI", 1)[1]
    assert "test_v1_marked_skip.py::test_on_v1_objects: needs sglang 0.5.12" in section
    assert "test_unmarked_skip" not in section
