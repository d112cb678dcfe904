"""The one registry: SGLang release -> its line module. The guard, both switches, the step timer, lint and
`specflip releases` all read it; nothing outside shim/releases/ names a release or sniffs one."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from shim.releases.base import Release, WorkerKind, v1_worker_runs

# base line -> the module whose `LINE` describes it. A line missing here gets one line naming the supported ones.
LINES: dict[str, str] = {
    "0.5.12": "shim.releases.v0_5_12",
    "0.5.13": "shim.releases.v0_5_13",
    "0.5.14": "shim.releases.v0_5_14",
    "0.5.15": "shim.releases.v0_5_15",
    "0.5.16": "shim.releases.v0_5_16",
    "0.5.17": "shim.releases.v0_5_17",
    "0.5.18": "shim.releases.v0_5_18",
    "0.5.19": "shim.releases.v0_5_19",
    "0.5.20": "shim.releases.v0_5_20",
    "0.5.21": "shim.releases.v0_5_21",
    "0.5.22": "shim.releases.v0_5_22",
    "0.5.23": "shim.releases.v0_5_23",
}
# lines before this one still ship SGLang's v1 EAGLEWorker (a fact about SGLang, also for lines specflip lacks)
FIRST_LINE_WITHOUT_V1_WORKER = (0, 5, 13)

_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?(?:\+[0-9A-Za-z.]+)?$")


class UnsupportedRelease(ValueError):
    """An SGLang release no line module describes: one line, naming the supported range."""


def base_line(release: str) -> str | None:
    """"0.5.16.post1" -> "0.5.16"; None for what is no final release (rc, dev, garbage)."""
    m = _RELEASE.match(release.strip())
    return None if m is None else ".".join(m.groups())


def _key(line: str) -> tuple[int, ...]:
    return tuple(int(p) for p in line.split("."))


def supported_lines() -> list[str]:
    return sorted(LINES, key=_key)


def supported_range() -> str:
    lines = supported_lines()
    return f"SGLang {lines[0]} to {lines[-1]}: {', '.join(lines)}"


def installed_release() -> str | None:
    """The installed sglang's version string, None where it is not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


@cache
def _load(module: str) -> Release:
    line = importlib.import_module(module).LINE
    assert isinstance(line, Release), f"{module}.LINE is no Release"
    return line


def release_line(release: str | None = None) -> Release:
    """The line of `release` (default: the installed sglang's). UnsupportedRelease (one line) otherwise."""
    if release is None:
        release = installed_release()
        if release is None:
            raise UnsupportedRelease(f"sglang is not installed (specflip supports {supported_range()})")
    line = base_line(release)
    if line is None or line not in LINES:
        raise UnsupportedRelease(f"sglang {release} is not a supported release (supported: {supported_range()})")
    return _load(LINES[line])


def all_lines() -> list[Release]:
    return [_load(LINES[v]) for v in supported_lines()]


def worker_kind(release: str | None, env: Mapping[str, str], server_args: Any = None) -> WorkerKind:
    """The EAGLE worker a server of `release` runs (`Release.worker_kind`; `server_args`: the launch's, resolved, where
    they exist), also for a release no line describes (SGLang's own fact: lines before FIRST_LINE_WITHOUT_V1_WORKER
    ship the v1 worker and run it with the overlap schedule off, `v1_worker_runs`; their ServerArgs hold the
    resolved values themselves)."""
    line = base_line(release) if release else None
    if line is None:
        return "v2"
    if line in LINES:
        return _load(LINES[line]).worker_kind(env, server_args)
    return "v1" if _key(line) < FIRST_LINE_WITHOUT_V1_WORKER and v1_worker_runs(env, server_args) else "v2"


@cache
def installed_line() -> Release:
    """The installed sglang's line (read once per process). UnsupportedRelease otherwise."""
    return release_line()
