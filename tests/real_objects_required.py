"""A pytest plugin: in CI, a test on real SGLang objects that skips fails the run.

The real-object tests (marked `sglang`) skip where `sglang` or `torch` cannot be imported, which is right on a
developer's machine without them and wrong in CI, where a broken install would otherwise pass as green. With
`CI=true` (or `SPECFLIP_REQUIRE_SGLANG=1`, which scripts/test.sh sets) the session fails, naming each test or
module that skipped: a test marked `sglang` that skips, or a module declaring the mark that skipped while
being collected (a module-level `pytest.importorskip`, before its marks exist). tests/conftest.py loads it;
tests/test_real_objects_required.py shows it firing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MARK = "sglang"
ENV = "SPECFLIP_REQUIRE_SGLANG"


def required(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    return env.get(ENV, "") == "1" or env.get("CI", "").strip().lower() in ("true", "1")


def _declares_mark(path: Path) -> bool:
    try:
        return f"pytest.mark.{MARK}" in path.read_text()
    except OSError:
        return False


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr).splitlines()[-1] if longrepr else "skipped"


class RealObjectsRequired:
    """Collects unexpected skips; fails the session when there are any."""

    def __init__(self, rootpath: Path) -> None:
        self.rootpath = rootpath
        self.skipped: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and report.nodeid.endswith(".py") and _declares_mark(self.rootpath / report.nodeid):
            self.skipped.append(f"{report.nodeid} (module): {_reason(report)}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and MARK in report.keywords:
            self.skipped.append(f"{report.nodeid}: {_reason(report)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.skipped:
            terminalreporter.section(f"real-object tests skipped in CI ({ENV} / CI=true): failing the run",
                                     red=True)
            for line in self.skipped:
                terminalreporter.line(line)


def pytest_configure(config: pytest.Config) -> None:
    if required():
        config.pluginmanager.register(RealObjectsRequired(config.rootpath), "specflip-real-objects-required")
