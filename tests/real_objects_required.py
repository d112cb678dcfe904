"""A pytest plugin: in CI, a test on real SGLang objects that skips fails the run.

The real-object tests (marked `sglang`) skip where `sglang` or `torch` cannot be imported, which is right on a
developer's machine without them and wrong in CI, where a broken install would otherwise pass as green. With
`CI=true` (or `SPECFLIP_REQUIRE_SGLANG=1`, which scripts/test.sh sets) the session fails, naming each test or
module that skipped: a test marked `sglang` that skips, or a module declaring the mark that skipped while
being collected (a module-level `pytest.importorskip`, before its marks exist). The v1-line tests (marked
`sglang_v1`: real SGLang 0.5.12, in `.venv12`) skip in the main suite's venv, as they should; the `.venv12` run
requires them with `SPECFLIP_REQUIRE_SGLANG_V1=1` (scripts/test.sh sets it for that run only). tests/conftest.py
loads it; tests/test_real_objects_required.py shows it firing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from shim.settings import settings

MARK = "sglang"
ENV = settings.REQUIRE_SGLANG.name  # both declared in shim/settings.py
V1_MARK = "sglang_v1"
V1_ENV = settings.REQUIRE_SGLANG_V1.name


def required(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    return settings.REQUIRE_SGLANG.get(env) or env.get("CI", "").strip().lower() in ("true", "1")


def required_marks(env: dict[str, str] | None = None) -> tuple[str, ...]:
    """The marks whose tests must not skip in this run."""
    env = dict(os.environ) if env is None else env
    return ((MARK,) if required(env) else ()) + ((V1_MARK,) if settings.REQUIRE_SGLANG_V1.get(env) else ())


def _declares_mark(path: Path, mark: str) -> bool:
    try:
        return re.search(rf"pytest\.mark\.{mark}\b", path.read_text()) is not None
    except OSError:
        return False


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr).splitlines()[-1] if longrepr else "skipped"


class RealObjectsRequired:
    """Collects unexpected skips; fails the session when there are any."""

    def __init__(self, rootpath: Path, marks: tuple[str, ...] = (MARK,)) -> None:
        self.rootpath = rootpath
        self.marks = marks
        self.skipped: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and report.nodeid.endswith(".py") and any(
                _declares_mark(self.rootpath / report.nodeid, mark) for mark in self.marks):
            self.skipped.append(f"{report.nodeid} (module): {_reason(report)}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and any(mark in report.keywords for mark in self.marks):
            self.skipped.append(f"{report.nodeid}: {_reason(report)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.skipped:
            terminalreporter.section(f"real-object tests skipped in CI ({ENV} / CI=true, {V1_ENV}): failing the "
                                     "run", red=True)
            for line in self.skipped:
                terminalreporter.line(line)


def pytest_configure(config: pytest.Config) -> None:
    marks = required_marks()
    if marks:
        config.pluginmanager.register(RealObjectsRequired(config.rootpath, marks), "specflip-real-objects-required")
