"""The settings table (shim/settings.py, issue 50): every SPECFLIP_* variable declared once; every bad value of any of
them stops start-up with one line, through the plugin's real entry points (found by SGLang's own plugin discovery);
SPECFLIP_ON_BAD_CONFIG=warn turns only that feature off; no module reads a SPECFLIP_* variable but the table; and
`specflip settings --markdown` is docs/settings.md."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shim import plugin
from shim import settings as table
from specflip.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]

# one bad value for every setting the plugin reads (a new setting without one fails test_every_setting_has_a_bad_value)
BAD: dict[str, str] = {
    "SPECFLIP_ON_BAD_CONFIG": "ignore",
    "SPECFLIP_MODE": "asert",
    "SPECFLIP_TRACE": "/proc/specflip-no-such-dir/trace.jsonl",
    "SPECFLIP_DESIGN": "no_such_design",
    "SPECFLIP_SPEC_CAP": "many",
    "SPECFLIP_PLAIN_CAP": "0",
    "SPECFLIP_RANK_CHECK": "maybe",
    "SPECFLIP_COUNT_SYNCS": "sometimes",
    "SPECFLIP_GUARD_SLOT_VALUES": "later",
    "SPECFLIP_GUARD_CLOCK": "-5",
    "SPECFLIP_SWITCH": "abc",
    "SPECFLIP_SWITCH_DRAFT": "later",
    "SPECFLIP_TIERS": "3,x",
    "SPECFLIP_PLAIN_GRAPHS": "full",
    "SPECFLIP_PLAIN_PREFILL": "cached",
    "SPECFLIP_SWITCH_WARMUP": "later",
    "SPECFLIP_SWITCH_RADIX": "never",
    "SPECFLIP_SWITCH_TRACE": "{file}",
    "SPECFLIP_SWITCH_TRACE_EVERY": "0",
    "SPECFLIP_V1_LOOP": "fast",
    "SPECFLIP_FAULT": "no_such_fault",
    "SPECFLIP_FAULT_LATE_FLIP": "-1",
    "SPECFLIP_STEP_TIMER": "{file}",
    "SPECFLIP_STEP_TIMER_EVERY": "often",
    "SPECFLIP_STEP_PROFILE_STEPS": "-3",
}
ANY_TEXT = {"SPECFLIP_STEP_PROFILE"}  # a flag file that may appear later: every text is a good value


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No SPECFLIP_* variable from the caller's environment."""
    for name in list(os.environ):
        if name.startswith(table.PREFIX):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def a_file(tmp_path: Path) -> str:
    path = tmp_path / "notes.txt"
    path.write_text("a user's file\n")
    return str(path)


def entry_point(name: str = "specflip") -> Any:
    """The plugin as SGLang finds it: its own entry-point discovery (`load_plugins` calls what this returns)."""
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    return load_plugins_by_group(GENERAL_PLUGINS_GROUP)[name][0]


def assert_stops(start: Any, *words: str) -> str:
    with pytest.raises(SystemExit) as stop:
        start()
    line = str(stop.value.code)
    assert "\n" not in line and line.startswith("specflip: "), line
    assert "SPECFLIP_ON_BAD_CONFIG=warn" in line, line
    for word in words:
        assert word in line, (word, line)
    return line


def test_every_setting_has_a_bad_value() -> None:
    plugin_settings = {s.name for s in table.settings if set(s.features) & set(table.PLUGIN_FEATURES)}
    assert plugin_settings == set(BAD) | ANY_TEXT


@pytest.mark.parametrize("name", sorted(BAD))
def test_every_bad_value_stops_start_up_with_one_line(name: str, clean_env: pytest.MonkeyPatch, a_file: str) -> None:
    """Through the entry point SGLang loads: SystemExit (SGLang's loader logs and ignores a plugin's Exception) with one
    line naming the variable and what it allows, before anything is installed."""
    from shim.switch import v2 as switch_v2
    from shim.timing import step_timer

    value = BAD[name].format(file=a_file)
    clean_env.setenv(name, value)
    # the tier ladder's own message names the variable and says what it "must be"
    line = assert_stops(entry_point(), *(("SPECFLIP_TIERS must be",) if name == "SPECFLIP_TIERS" else
                                         (f"{name}=", "expected")))
    assert repr(value) in line or value in line
    assert switch_v2.runtime() is None and step_timer._TIMER is None
    assert Path(a_file).read_text() == "a user's file\n"


@pytest.mark.parametrize("value", ["abc", "10:20", "-1:0"])
@pytest.mark.parametrize("start", ["register", "register_v1"])
def test_a_bad_switch_stops_start_up(value: str, start: str, clean_env: pytest.MonkeyPatch) -> None:
    """Issue 50: a bad SPECFLIP_SWITCH logged a line and the server served without the switch."""
    from shim.switch import v1 as switch_v1
    from shim.switch import v2 as switch_v2

    clean_env.setenv("SPECFLIP_SWITCH", value)
    run = entry_point() if start == "register" else plugin.register_v1
    line = assert_stops(run, f"SPECFLIP_SWITCH={value!r}", "t_off:t_on", "serve without the switch")
    assert ("got t_off=" in line) == (":" in value)
    assert switch_v2.runtime() is None and switch_v1._RUNTIME is None


def test_combinations_stop_start_up_too(clean_env: pytest.MonkeyPatch) -> None:
    """Settings good one by one, bad together (checked where the switch's configuration is built)."""
    clean_env.setenv("SPECFLIP_SWITCH", "auto")
    clean_env.setenv("SPECFLIP_SWITCH_DRAFT", "sync")
    assert_stops(entry_point(), "auto runs on SGLang's plain path")
    clean_env.delenv("SPECFLIP_SWITCH")
    clean_env.setenv("SPECFLIP_TIERS", "3,8:4,1")
    assert_stops(entry_point(), "SPECFLIP_TIERS needs SPECFLIP_SWITCH")


def test_every_bad_setting_is_named_in_the_one_line(clean_env: pytest.MonkeyPatch, a_file: str) -> None:
    clean_env.setenv("SPECFLIP_STEP_TIMER", a_file)
    clean_env.setenv("SPECFLIP_MODE", "asert")
    assert_stops(entry_point(), f"SPECFLIP_STEP_TIMER={a_file!r}: names an existing file",
                 "SPECFLIP_MODE='asert': expected one of off, warn, assert, trace", "step timer and guard")


def test_warn_turns_off_the_bad_feature_only(clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from shim.switch import v2 as switch_v2

    clean_env.setenv("SPECFLIP_SWITCH", "10:20")
    clean_env.setenv("SPECFLIP_ON_BAD_CONFIG", "warn")
    assert plugin.check_settings((table.FEATURE_SWITCH, table.FEATURE_GUARD, table.FEATURE_STEP_TIMER)) == {
        "SPECFLIP_SWITCH='10:20': expected 't_off:t_on' with 0 <= t_on < t_off, got t_off=10 t_on=20": ["switch"]}
    entry_point()()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == ["specflip switch off: SPECFLIP_SWITCH='10:20': expected 't_off:t_on' with 0 <= t_on < t_off, "
                      "got t_off=10 t_on=20 (SPECFLIP_ON_BAD_CONFIG=warn: serving without the switch)"]
    assert switch_v2.runtime() is None


# --- through SGLang's load_plugins in a fresh process, as a server starts (one process each: the guard installs
# process-wide)

_LOAD_PLUGINS = ("import sys; sys.path.insert(0, 'stand_ins/cpu'); import sglang.srt.plugins as p; p.load_plugins();"
                 "import shim.guard.runtime as r, shim.switch.v2 as s, shim.timing.step_timer as t;"
                 "print('serving, guard:', r.current() is not None, 'switch:', s.runtime() is not None, "
                 "'step timer:', t._TIMER is not None)")


def _start_with(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-c", _LOAD_PLUGINS], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=300)


def test_a_step_timer_on_a_file_no_longer_leaves_the_server_unguarded(a_file: str) -> None:
    """Issue 50: SPECFLIP_STEP_TIMER naming an existing file raised FileExistsError inside register() before the
    guard's settings were read; SGLang's loader logged it and served, unguarded even with SPECFLIP_MODE=asert."""
    done = _start_with({"SPECFLIP_STEP_TIMER": a_file, "SPECFLIP_MODE": "asert"})
    assert done.returncode != 0 and "serving" not in done.stdout, done.stdout + done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("specflip: SPECFLIP_MODE='asert'") and "SPECFLIP_STEP_TIMER=" in lines[-1]
    assert "Traceback" not in done.stderr and "FileExistsError" not in done.stderr
    assert Path(a_file).read_text() == "a user's file\n"


def test_with_the_opt_out_a_bad_switch_and_timer_serve_guarded(a_file: str) -> None:
    """SPECFLIP_ON_BAD_CONFIG=warn: one error line, the switch and the step timer off, the guard on as asked."""
    done = _start_with({"SPECFLIP_SWITCH": "abc", "SPECFLIP_STEP_TIMER": a_file, "SPECFLIP_MODE": "assert",
                        "SPECFLIP_ON_BAD_CONFIG": "warn"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "serving, guard: True switch: False step timer: False" in done.stdout
    off = [line for line in done.stderr.splitlines() if "off: SPECFLIP_" in line]
    assert len(off) == 1 and "specflip switch and step timer off: SPECFLIP_SWITCH='abc'" in off[0], off
    assert "Traceback" not in done.stderr


# --- one table: declared once, read through it ------------------------------------------------------------------

SOURCES = ("shim", "specflip", "statemodel", "proofs", "bench", "tests", "scripts")


def _python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--", *(f"{d}/*.py" for d in SOURCES)], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    return [REPO / p for p in listed if (REPO / p).exists()] + [REPO / "tests" / "test_settings.py"]


ENVIRONMENT = re.compile(r"(^|\.)(environ|env|environment)$")  # os.environ, or a mapping passed in its place


def _environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Reads of a SPECFLIP_* variable (a literal key, or an ENV_* name holding one): os.getenv(key), and
    environ.get(key) / environ[key] / `key in environ` on os.environ or a mapping named env / environ / environment."""
    found = []
    for node in ast.walk(tree):
        key, where = None, None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name == "getenv":
                key, where = node.args[0], "os.environ"
            elif name == "get" and isinstance(node.func, ast.Attribute):
                key, where = node.args[0], ast.unparse(node.func.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key, where = node.slice, ast.unparse(node.value)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In | ast.NotIn):
            key, where = node.left, ast.unparse(node.comparators[0])
        if key is None or where is None or not ENVIRONMENT.search(where):
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith(table.PREFIX) \
                or isinstance(key, ast.Name) and key.id.startswith("ENV") \
                or isinstance(key, ast.Attribute) and key.attr.startswith("ENV"):
            found.append((node.lineno, ast.unparse(node)[:100]))
    return found


def test_no_module_reads_a_specflip_variable_but_the_table() -> None:
    allowed = {REPO / "shim" / "settings.py", REPO / "tests" / "test_settings.py"}
    reads = {str(path.relative_to(REPO)): found for path in _python_files() if path not in allowed
             for found in [_environment_reads(ast.parse(path.read_text()))] if found}
    assert reads == {}, "read these through shim/settings.py: " + json.dumps(reads, indent=1)


def test_the_read_check_sees_a_read() -> None:
    """The check above finds each form of read it looks for (so that an empty result means something)."""
    code = ("import os\nos.environ.get('SPECFLIP_MODE')\nos.getenv('SPECFLIP_X', '')\nenv['SPECFLIP_Y']\n"
            "env.get(ENV_DIR, '')\n'SPECFLIP_Z' in os.environ\nself.environ.get(r.ENV_MODE)\n"
            "env['SPECFLIP_W'] = '1'\nreport.get('SPECFLIP_SWITCH')\nos.environ.get('SGLANG_X')\n")
    assert [n for n, _ in _environment_reads(ast.parse(code))] == [2, 3, 4, 5, 6, 7]


def test_every_specflip_name_in_the_code_is_declared() -> None:
    """Every SPECFLIP_* name the code, scripts and benchmarks mention is a setting in the table."""
    listed = subprocess.run(["git", "grep", "-h", "-o", "-E", r"SPECFLIP_[A-Z0-9_]*[A-Z0-9]", "--",
                             "shim", "specflip", "statemodel", "proofs/*.py", "bench/*.py", "bench/*.sh", "scripts"],
                            cwd=REPO, capture_output=True, text=True).stdout.split()
    declared = set(table.settings.by_name())
    assert len(set(listed)) >= 25
    assert set(listed) - declared == set()


# --- the table as a command and a page ---------------------------------------------------------------------------


def test_settings_command_lists_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["settings", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [r["name"] for r in table.rows()]
    assert {r["name"] for r in rows} == set(table.settings.by_name())
    mode = next(r for r in rows if r["name"] == "SPECFLIP_MODE")
    assert (mode["type"], mode["default"]) == ("off | warn | assert | trace", "off") and mode["meaning"]
    assert cli_main(["settings"]) == 0
    text = capsys.readouterr().out
    assert all(re.search(rf"^{name}  ", text, re.M) for name in table.settings.by_name())


def test_docs_settings_md_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["settings", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert (REPO / "docs" / "settings.md").read_text() == printed, \
        "docs/settings.md is stale: .venv/bin/python -m specflip.cli settings --markdown > docs/settings.md"
    for name in table.settings.by_name():
        assert f"| `{name}` |" in printed
