"""The release layer (shim/releases/): one registry of SGLang release lines, each line a `Release`; nothing outside
the layer names a release."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shim import releases
from shim.releases import LINES, Release, UnsupportedRelease, base_line, release_line, worker_kind

REPO = Path(__file__).resolve().parents[1]


def test_every_registered_line_is_a_release_of_its_own_version() -> None:
    for line in releases.all_lines():
        assert isinstance(line, Release)
        assert LINES[line.version].endswith(line.version.replace(".", "_"))
        assert line.adapter().release == line.version


@pytest.mark.parametrize(("given", "base"), [("0.5.16", "0.5.16"), ("0.5.16.post1", "0.5.16"),
                                             ("0.5.23.post12", "0.5.23"), ("0.5.12+cu128", "0.5.12"),
                                             ("0.5.16rc1", None), ("abc", None), ("0.5", None)])
def test_a_post_release_uses_its_base_line(given: str, base: str | None) -> None:
    assert base_line(given) == base


def test_an_unsupported_release_is_one_line_naming_the_range() -> None:
    for bad in ("0.4.0", "0.5.16rc1", "0.6.0", "garbage"):
        with pytest.raises(UnsupportedRelease) as caught:
            release_line(bad)
        text = str(caught.value)
        assert "\n" not in text and f"sglang {bad} is not a supported release" in text
        assert re.search(r"SGLang 0\.5\.12 to 0\.5\.\d+", text)
    assert release_line("0.5.16.post3") is release_line("0.5.16")


def test_the_worker_kind() -> None:
    off = {"SGLANG_ENABLE_SPEC_V2": "False"}
    assert worker_kind("0.5.12", off) == "v1" and worker_kind("0.5.12.post1", {"SGLANG_ENABLE_SPEC_V2": "0"}) == "v1"
    assert worker_kind("0.5.12", {}) == "v2"  # the v2 worker is the default where both ship
    assert worker_kind("0.5.16", off) == "v2" and worker_kind("0.5.23", off) == "v2"  # no v1 worker left there
    assert worker_kind("0.5.11", off) == "v1"  # SGLang's fact, also for a line specflip has no module for
    assert worker_kind(None, off) == "v2"


# what only the layer may name: an SGLang release number (comments included)
_RELEASE_NUMBER = re.compile(r"0\.5\.[0-9]+")


def test_no_release_number_outside_the_layer() -> None:
    found = [f"{path.relative_to(REPO)}:{n}" for folder in ("shim/switch", "shim/guard", "shim/timing")
             for path in sorted((REPO / folder).rglob("*.py"))
             for n, text in enumerate(path.read_text().splitlines(), 1) if _RELEASE_NUMBER.search(text)]
    assert found == []


def test_specflip_releases_lists_every_line_with_its_features(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from specflip.cli import main

    assert main(["releases", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [line["release"] for line in data["lines"]] == releases.supported_lines()
    for line in data["lines"]:
        assert set(line["features"]) == {"guard", "switch", "step_timer", "lint"}
        for entry in line["features"].values():
            assert entry["works"] and all(where.startswith(("CPU", "GPU")) for where in entry["verified"])
    by_release = {line["release"]: line for line in data["lines"]}
    gpu = by_release["0.5.16"]["features"]
    assert all(any(w.startswith("GPU H200, 2026-") for w in gpu[f]["verified"]) for f in ("guard", "switch", "lint"))
    assert by_release["0.5.12"]["workers"] == ["v1", "v2"] and by_release["0.5.12"]["features"]["switch"]["works"]\
        .startswith("v1")
    # the switch on all twelve, each verified somewhere; 0.5.13's on the CPU only (its sglang-kernel is not carried)
    assert all(line["features"]["switch"]["works"].startswith(("v1 ", "v2 ")) and line["features"]["switch"]["verified"]
               for line in data["lines"])
    assert [w[:8] for w in by_release["0.5.13"]["features"]["switch"]["verified"]] == ["CPU only"]
    assert data["installed_line"] == release_line().version  # CI's installed sglang is a supported line

    assert main(["releases"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("specflip supports SGLang 0.5.12 to ") and "SGLang 0.5.16 (EAGLE workers: v2)" in text


def test_specflip_releases_bad_usage_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from specflip.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["releases", "--jsn"])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1


@pytest.fixture
def unsupported_sglang(monkeypatch: pytest.MonkeyPatch) -> str:
    """The installed sglang reports a release no line describes (0.5.14 before its line exists: 0.6.0)."""
    import importlib.metadata

    from shim.guard import runtime

    bad = "0.6.0"
    monkeypatch.setattr(importlib.metadata, "version", lambda name: bad if name == "sglang" else "0")
    for name in ("SPECFLIP_MODE", "SPECFLIP_SWITCH", "SPECFLIP_ON_BAD_CONFIG", "SPECFLIP_STEP_TIMER"):
        monkeypatch.delenv(name, raising=False)
    installed = runtime.current()  # another module's guard, installed once per process through load_plugins()
    runtime.install(None)
    yield bad
    runtime.install(installed)


@pytest.mark.parametrize(("variable", "value", "register"), [
    ("SPECFLIP_MODE", "warn", "register_guard"), ("SPECFLIP_SWITCH", "auto", "register_switch"),
    ("SPECFLIP_SWITCH", "8:4", "register_switch_v1"), ("SPECFLIP_MODE", "assert", "register")])
def test_an_unsupported_release_stops_start_up_when_specflip_was_asked_for(
        unsupported_sglang: str, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, register: str) -> None:
    from shim import plugin
    from shim.guard.runtime import current

    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        getattr(plugin, register)()
    line = str(stopped.value.code)
    assert "\n" not in line and f"{variable}={value} asks for specflip" in line
    assert f"sglang {unsupported_sglang} is not a supported release (supported: SGLang 0.5.12 to " in line
    assert current() is None


def test_warn_serves_without_specflip_after_one_line(unsupported_sglang: str, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    from shim import plugin
    from shim.guard.runtime import current
    from shim.switch import v2

    monkeypatch.setenv("SPECFLIP_MODE", "assert")
    monkeypatch.setenv("SPECFLIP_SWITCH", "auto")
    monkeypatch.setenv("SPECFLIP_ON_BAD_CONFIG", "warn")
    with caplog.at_level("ERROR"):
        plugin.register()
    lines = [r.getMessage() for r in caplog.records if "not a supported release" in r.getMessage()]
    assert len(lines) == 2 and all("SGLang 0.5.12 to " in line for line in lines)  # the switch's, the guard's
    assert current() is None and v2._RUNTIME is None


def test_an_unsupported_release_without_specflip_asked_for_is_silent(unsupported_sglang: str) -> None:
    from shim import plugin
    from shim.guard.runtime import current

    plugin.register()
    plugin.register_v1()
    assert current() is None


def test_a_line_without_the_v2_switch_stops_start_up_when_the_switch_was_asked_for(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A line whose v2 worker lacks the switch's hook points (`offers_v2_switch` False; no line since 0.5.13 has its
    own capture target): SPECFLIP_SWITCH there stops start-up (warn: one line, no switch), never a switch installed
    half-working."""
    import importlib.metadata

    from shim import plugin
    from shim.releases import release_line
    from shim.switch import v2

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.14" if name == "sglang" else "0")
    monkeypatch.setattr(type(release_line("0.5.14")), "offers_v2_switch", False)
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG", raising=False)
    monkeypatch.setenv("SPECFLIP_SWITCH", "auto")
    with pytest.raises(SystemExit) as stopped:
        plugin.register_switch()
    assert "SPECFLIP_SWITCH=auto asks for the switch, which sglang 0.5.14 does not offer" in str(stopped.value.code)
    monkeypatch.setenv("SPECFLIP_ON_BAD_CONFIG", "warn")
    with caplog.at_level("ERROR"):
        plugin.register_switch()
    assert v2._RUNTIME is None and any("does not offer" in r.getMessage() for r in caplog.records)


def test_draft_mode_none_stops_start_up_on_0_5_13(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """0.5.13's EAGLEWorkerV2 has no _stub_skipped_draft_extend, which SPECFLIP_SWITCH_DRAFT=none's plain step calls:
    asked for there, start-up stops (warn: one line, no switch); the other draft modes install."""
    import importlib.metadata

    from shim import plugin
    from shim.switch import v2

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.13" if name == "sglang" else "0")
    monkeypatch.delenv("SPECFLIP_ON_BAD_CONFIG", raising=False)
    monkeypatch.setenv("SPECFLIP_SWITCH", "auto")
    monkeypatch.setenv("SPECFLIP_SWITCH_DRAFT", "none")
    with pytest.raises(SystemExit) as stopped:
        plugin.register_switch()
    assert "SPECFLIP_SWITCH_DRAFT=none asks for plain steps" in str(stopped.value.code)
    assert "sglang 0.5.13 cannot" in str(stopped.value.code)
    monkeypatch.setenv("SPECFLIP_ON_BAD_CONFIG", "warn")
    with caplog.at_level("ERROR"):
        plugin.register_switch()
    assert v2._RUNTIME is None and any("_stub_skipped_draft_extend" in r.getMessage() for r in caplog.records)


def _req_of(line: str, *, row: int | None, committed: int, allocated: int) -> object:
    """A request as each line keeps its row and KV lengths (the field layout of that release's Req; the real 0.5.23
    and 0.5.12 Req are exercised by tests/test_switch_retract.py and tests/test_v1_switch.py)."""
    from types import SimpleNamespace

    if line == "0.5.23":
        kv = SimpleNamespace(req_pool_idx=row, kv_committed_len=committed, kv_allocated_len=allocated,
                             cache_protected_len=0)
        return SimpleNamespace(kv=kv if row is not None else None)
    if line == "0.5.16":
        kv = SimpleNamespace(kv_allocated_len=allocated) if row is not None else None
        return SimpleNamespace(kv=kv, req_pool_idx=row, kv_committed_len=committed, cache_protected_len=0)
    return SimpleNamespace(req_pool_idx=row, kv_committed_len=committed, kv_allocated_len=allocated,
                           cache_protected_len=0)


@pytest.mark.parametrize("version", ["0.5.12", "0.5.16", "0.5.23"])
def test_the_switch_and_the_guard_read_a_row_alike(version: str) -> None:
    """The switch's reading of a request (`kv_row`) and the guard's (`req_row`, `req_kv_lens`) agree on each line."""
    line = release_line(version)
    adapter = line.adapter()
    held = _req_of(version, row=5, committed=12, allocated=16)
    assert line.kv_row(held) == (5, 12, 16)
    assert (adapter.req_row(held), *adapter.req_kv_lens(held)[1:3]) == line.kv_row(held)
    free = _req_of(version, row=None, committed=0, allocated=0)
    assert line.kv_row(free)[0] is None and adapter.req_kv_lens(free)[0] is False


def test_where_a_line_was_verified_is_not_inherited() -> None:
    from shim.releases import v0_5_16

    class Later(v0_5_16.Line):
        version = "0.5.99"

    assert Later.verified == () and v0_5_16.Line.verified  # a new line derived from the GPU line starts unverified
    assert Later().kv_row(_req_of("0.5.16", row=2, committed=3, allocated=4)) == (2, 3, 4)  # its reading is inherited


def test_0_5_12_offers_the_v1_switch_only_and_says_how_to_get_it() -> None:
    """0.5.12's EAGLEWorkerV2 lacks what the v2 switch hooks and calls (init_cuda_graphs, activate_step_by_batch, the
    module retract_all): the release layer says so once (`offers_v2_switch` False) with the way to the v1 switch, which
    the stop line of specflip's own entry point carries (tests/test_v1_switch.py runs it through SGLang's
    load_plugins on real 0.5.12); `specflip releases` says it too. Every later line offers the v2 switch."""
    from specflip.releases import render, table

    old = release_line("0.5.12")
    assert not old.offers_v2_switch and "shim.plugin:register_v1" in (old.v1_switch_howto or "")
    assert all(release_line(v).offers_v2_switch and release_line(v).v1_switch_howto is None
               for v in ("0.5.13", "0.5.16", "0.5.23"))
    text = render(table())
    assert "the v2 switch is not offered" in text and "shim.plugin:register_v1" in text


def test_without_sglang_the_release_line_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """No sglang in the environment (`installed_release` finds none: stood in here, the test venv has sglang): one
    line naming what is missing and the lines specflip supports."""
    from shim.releases import registry

    monkeypatch.setattr(registry, "installed_release", lambda: None)
    with pytest.raises(registry.UnsupportedRelease) as err:
        registry.release_line()
    assert str(err.value) == f"sglang is not installed (specflip supports {registry.supported_range()})"
    assert "\n" not in str(err.value)
