"""Every SPECFLIP_* environment variable, declared once: its type, default and meaning (the way SGLang declares its
SGLANG_* variables in sglang/srt/environ.py). Every reader reads through this table (`settings.MODE.get()`); no other
module reads a SPECFLIP_* variable from the environment (tests/test_settings.py checks the source for it).

A value is parsed when it is read, and a bad one raises `SettingError` with one line naming the variable and what it
allows. `problems()` parses every setting of every feature at once: the plugin's entry points (shim/plugin.py) call
it before they install anything, so a bad value of any of them stops start-up (or, with SPECFLIP_ON_BAD_CONFIG=warn,
turns its feature off with one error line). `specflip settings` prints this table; docs/settings.md is its markdown.

An unset variable and one set to blanks read the same: the default. Standard library only: shim.switch's and
shim.guard's modules import it, and so does the lint, on a host with no SGLang.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

PREFIX = "SPECFLIP_"

# features, in the order `specflip settings` lists them; a setting's feature is what SPECFLIP_ON_BAD_CONFIG=warn turns
# off when its value is bad
FEATURE_GUARD, FEATURE_SWITCH, FEATURE_STEP_TIMER, FEATURE_FAULTS, FEATURE_START_UP, FEATURE_DEVELOPMENT = (
    "guard", "switch", "step timer", "fault injection", "start-up", "development")
FEATURES = (FEATURE_START_UP, FEATURE_GUARD, FEATURE_SWITCH, FEATURE_STEP_TIMER, FEATURE_FAULTS, FEATURE_DEVELOPMENT)
# features read by the SGLang plugin (the development settings are read by tests and benchmarks only)
PLUGIN_FEATURES = (FEATURE_GUARD, FEATURE_SWITCH, FEATURE_STEP_TIMER, FEATURE_FAULTS, FEATURE_START_UP)


class SettingError(ValueError):
    """A SPECFLIP_* variable with a value its reader does not accept; the message is one line that names the
    variable and what it allows."""

    def __init__(self, message: str, names: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.names = names  # the variables at fault (more than one: a combination)


class Setting:
    """One SPECFLIP_* variable. Subclasses say how its text becomes a value (`parse`, which raises ValueError with
    what is allowed) and what `kind` of value it takes."""

    kind = "text"

    def __init__(self, default: Any, meaning: str, *, features: tuple[str, ...],
                 default_text: str | None = None) -> None:
        self.default = default
        self.meaning = meaning
        self.features = features
        self._default_text = default_text
        self.name = ""  # set by __set_name__: SPECFLIP_ + the attribute's name

    def __set_name__(self, owner: type, attr: str) -> None:
        self.name = PREFIX + attr

    @property
    def default_text(self) -> str:
        if self._default_text is not None:
            return self._default_text
        return "unset" if self.default is None else str(self.default)

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's text, stripped; None when unset or blank."""
        text = (os.environ if env is None else env).get(self.name)
        if text is None or not text.strip():
            return None
        return text.strip()

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        return self.raw(env) is not None

    def get(self, env: Mapping[str, str] | None = None) -> Any:
        """The value: the default when unset, else the parsed text (SettingError: a value it does not accept)."""
        text = self.raw(env)
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            message = str(exc)  # a parser of its own may name the variable already (shim.switch.config.TierLadder)
            raise SettingError(message if message.startswith(self.name) else f"{self.name}={text!r}: {message}",
                               (self.name,)) from None

    def parse(self, text: str) -> Any:
        return text


class Text(Setting):
    def __init__(self, default: str | None, meaning: str, *, features: tuple[str, ...], kind: str = "text",
                 default_text: str | None = None) -> None:
        super().__init__(default, meaning, features=features, default_text=default_text)
        self.kind = kind


class Choice(Setting):
    """One of a few words (case-insensitive)."""

    def __init__(self, choices: tuple[str, ...], default: str | None, meaning: str, *, features: tuple[str, ...],
                 default_text: str | None = None) -> None:
        super().__init__(default, meaning, features=features, default_text=default_text)
        self.choices = choices
        self.kind = " | ".join(choices)

    def parse(self, text: str) -> str:
        word = text.lower()
        if word not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}")
        return word


class Flag(Setting):
    """On or off."""

    kind = "on | off"
    ON = ("1", "on", "true", "yes")
    OFF = ("0", "off", "false", "no")

    def parse(self, text: str) -> bool:
        word = text.lower()
        if word in self.ON:
            return True
        if word in self.OFF:
            return False
        raise ValueError("expected on or off (1, on, true, yes / 0, off, false, no)")

    @property
    def default_text(self) -> str:
        return "on" if self.default else "off"


class Int(Setting):
    """An integer at least `least`."""

    def __init__(self, default: int | None, meaning: str, *, features: tuple[str, ...], least: int = 1,
                 default_text: str | None = None) -> None:
        super().__init__(default, meaning, features=features, default_text=default_text)
        self.least = least
        self.kind = f"integer >= {least}"

    def parse(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer >= {self.least}") from None
        if value < self.least:
            raise ValueError(f"expected an integer >= {self.least}")
        return value


class Directory(Setting):
    """A directory specflip writes its files into, created when missing: not an existing file, and creatable."""

    kind = "directory"

    def parse(self, text: str) -> str:
        path = Path(text)
        if path.exists() and not path.is_dir():
            raise ValueError("names an existing file; expected a directory (created when missing)")
        ancestor = path.absolute()
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise ValueError(f"{ancestor} is a file; expected a directory (created when missing)")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ValueError(f"{ancestor} is not writable; expected a directory specflip can write into")
        return text


class Parsed(Setting):
    """A value with a syntax of its own: `parser` raises ValueError saying what is allowed."""

    def __init__(self, parser: Callable[[str], Any], default: Any, meaning: str, *, kind: str,
                 features: tuple[str, ...], default_text: str | None = None) -> None:
        super().__init__(default, meaning, features=features, default_text=default_text)
        self.parser = parser
        self.kind = kind

    def parse(self, text: str) -> Any:
        return self.parser(text)


# --- the parsers of the settings with a syntax of their own ------------------------------------------------------


def parse_switch(text: str) -> str | tuple[int, int]:
    """`auto`, or `t_off:t_on` with 0 <= t_on < t_off."""
    if text.lower() == "auto":
        return "auto"
    try:
        off, on = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError("expected 't_off:t_on' (two integers, 0 <= t_on < t_off) or 'auto'") from None
    if not 0 <= on < off:
        raise ValueError(f"expected 't_off:t_on' with 0 <= t_on < t_off, got t_off={off} t_on={on}")
    return off, on


def parse_tiers(text: str) -> Any:
    from shim.switch.config import TierLadder  # the ladder's syntax lives with the ladder

    return TierLadder.parse(text)


def parse_trace_template(text: str) -> str:
    """A file in an existing directory specflip can write into (the guard opens it at its first step, in the
    scheduler: a mistake found there would come too late)."""
    path = Path(text.replace("{rank}", "0").replace("{pid}", str(os.getpid())))
    if path.is_dir():
        raise ValueError("names a directory; expected a file name in an existing directory")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"{parent} is not a directory; expected a file name in an existing directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{parent} is not writable; expected a file name in a directory specflip can write into")
    return text


def parse_design(text: str) -> str:
    from statemodel.designs import get_design

    try:
        get_design(text)
    except KeyError as exc:
        raise ValueError(f"{exc.args[0]} (expected a design's name)") from None
    return text


def parse_faults(text: str) -> frozenset[str]:
    from shim.switch.faults import FAULTS

    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - FAULTS.keys())
    if unknown:
        raise ValueError(f"unknown fault {', '.join(unknown)}; expected names from {', '.join(FAULTS)}")
    return names


def parse_late_flip(text: str) -> tuple[int, int]:
    rank, _, nth = text.partition(":")
    try:
        value = int(rank), int(nth or 1)
    except ValueError:
        raise ValueError("expected RANK or RANK:N (integers, RANK >= 0, N >= 1)") from None
    if value[0] < 0 or value[1] < 1:
        raise ValueError("expected RANK or RANK:N (integers, RANK >= 0, N >= 1)")
    return value


def parse_guard_clock(text: str) -> float | None:
    """0: off; 1: a line every 30 s; else the seconds between lines."""
    if text == "0":
        return None
    if text == "1":
        return 30.0
    try:
        every = float(text)
    except ValueError:
        every = -1.0
    if not 0 < every < float("inf"):
        raise ValueError("expected 0 (off), 1 (a line every 30 s) or the seconds between lines")
    return every


class Settings:
    """The table. Sections by feature; each entry's name is SPECFLIP_ + its attribute's name."""

    # --- start-up ---
    ON_BAD_CONFIG = Choice(
        ("stop", "warn"), "stop",
        "What a bad value of any SPECFLIP_* setting does at start-up: stop (the server does not start; one line "
        "names the variable and what it allows) or warn (one error line; the feature it belongs to stays off).",
        features=(FEATURE_START_UP,))

    # --- guard (shim/guard; docs/guard.md) ---
    MODE = Choice(
        ("off", "warn", "assert", "trace"), "off",
        "The runtime guard: off (no hook registered), warn (log findings), assert (stop the server at a finding), "
        "trace (record every checked step). A server configuration the guard does not check (page_size > 1, topk > 1, "
        "DP attention, ...) stops start-up in assert mode; in warn and trace mode the server starts without the "
        "guard's checks, with one warning line and specflip_guard_checking 0 in /metrics.", features=(FEATURE_GUARD,))
    TRACE = Parsed(
        parse_trace_template, None,
        "The guard's trace file (JSONL, appended to); `{rank}` and `{pid}` are filled in.", features=(FEATURE_GUARD,),
        kind="file name template", default_text="specflip-trace.rank{rank}.jsonl in trace mode, else none")
    DESIGN = Parsed(
        parse_design, None,
        "The reference design whose transition function moves the guard's ghost state (statemodel/designs.py).",
        kind="design name", features=(FEATURE_GUARD,),
        default_text="the design the installed switch announced, else sglang_adaptive_warm with "
                     "--speculative-adaptive, else plain_off_catch_up")
    SPEC_CAP = Int(
        None, "Running-request cap while speculation is on: the switch admits up to it; the guard checks it.",
        features=(FEATURE_SWITCH, FEATURE_GUARD),
        default_text="switch: 48 (SGLang's speculative default); guard: the switch's cap, else max_running_requests")
    PLAIN_CAP = Int(
        None, "Running-request cap the guard checks while speculation is off.", features=(FEATURE_GUARD,),
        default_text="max_running_requests")
    RANK_CHECK = Flag(
        True, "The guard's per-step rank agreement check under tensor parallelism (docs/tp.md).",
        features=(FEATURE_GUARD,))
    GUARD_SLOT_VALUES = Choice(
        ("auto", "sync", "late", "assert", "off"), "auto",
        "Slot identity by value (a free of a copy of row values, every alloc; docs/guard.md): auto (host tensors: "
        "judged at the hook; a GPU: assert in the guard's assert mode, else late; on an H200 the guard with it cost "
        "0.98-1.04x of auto alone, 2026-12-06), sync (at the hook on every device: a host-device sync per alloc), "
        "late (one allocator call later, no sync), assert (guard assert mode: a device assert behind the answer's "
        "copy stops the GPU before the next forward, no sync; warn mode: late), off.",
        features=(FEATURE_GUARD,))
    COUNT_SYNCS = Flag(
        False, "Measurement: count the guard steps' host-device synchronisations (CUDA).", features=(FEATURE_GUARD,))
    GUARD_CLOCK = Parsed(
        parse_guard_clock, None,
        "Measurement: log the guard steps' thread CPU time per hook every so many seconds (shim/guard/clock.py).",
        kind="0 | 1 (every 30 s) | seconds", features=(FEATURE_GUARD,), default_text="0 (off)")

    # --- switch (shim/switch; docs/auto-switch.md) ---
    SWITCH = Parsed(
        parse_switch, None,
        "specflip's switch: speculation off at t_off running requests or more, on again at t_on or fewer; auto: "
        "no thresholds, the learner decides.", kind="t_off:t_on | auto", features=(FEATURE_SWITCH,),
        default_text="unset (no switch)")
    SWITCH_DRAFT = Choice(
        ("retract", "sync", "none"), "retract",
        "What the draft does while speculation is off: retract (SGLang's plain path; the flip on retracts and "
        "catches up), sync (a draft-extend after every plain step), none (KNOWN BAD, measurement only).",
        features=(FEATURE_SWITCH,))
    TIERS = Parsed(
        parse_tiers, None,
        "Speculative tiers: while on, the EAGLE step count follows the load, e.g. 3,8:4,1 (steps 3 below 8 running "
        "requests, 1 from 8, back at 4); with SPECFLIP_SWITCH=auto the step counts only, e.g. 3,1.",
        kind="steps[,up:down,steps]...", features=(FEATURE_SWITCH,), default_text="unset (one step count)")
    PLAIN_GRAPHS = Choice(
        ("decode", "eager"), "decode", "Plain decoding while off: capture a plain decode CUDA-graph runner, or eager.",
        features=(FEATURE_SWITCH,))
    PLAIN_PREFILL = Choice(
        ("graphs", "eager"), "graphs", "Prefills while off: replay the target's prefill CUDA graphs, or eager.",
        features=(FEATURE_SWITCH,))
    SWITCH_WARMUP = Flag(
        True, "Before the server listens, run every path a flip takes (shim/switch/warmup.py).",
        features=(FEATURE_SWITCH,))
    SWITCH_RADIX = Choice(
        ("keep_out", "insert"), "keep_out",
        "Requests run while off: kept out of the radix tree (no cached token without draft KV), or inserted "
        "(SGLang's own tree; outputs exact, acceptance drops).", features=(FEATURE_SWITCH,))
    SWITCH_TRACE = Directory(
        None, "A directory for the switch's JSONL trace, one switch-<pid>.jsonl per process (`specflip replay`, "
        "`specflip ranks`).", features=(FEATURE_SWITCH,))
    SWITCH_TRACE_EVERY = Int(
        1, "The switch trace times the two decode steps after each flip and every Nth other one.",
        features=(FEATURE_SWITCH,))
    V1_LOOP = Choice(
        ("normal", "overlap"), None,
        "The v1 switch only (SGLang 0.5.12, SGLANG_ENABLE_SPEC_V2=0): SGLang's normal loop, or specflip's loop "
        "that overlaps the plain iterations.", features=(FEATURE_SWITCH,),
        default_text="overlap in draft mode retract, else normal")

    # --- fault injection (shim/switch/faults.py; testing the guard only) ---
    FAULT = Parsed(
        parse_faults, frozenset(),
        "FAULT INJECTION, tests only: switch bugs the guard must catch (reserve_off_by_one, flip_keeps_allocated, "
        "plain_token_twice).", kind="name[,name...]", features=(FEATURE_FAULTS, FEATURE_SWITCH), default_text="none")
    FAULT_LATE_FLIP = Parsed(
        parse_late_flip, None,
        "FAULT INJECTION, tests only: this TP rank performs the switch's Nth flip (default the first) one scheduler "
        "step late.", kind="RANK[:N]", features=(FEATURE_FAULTS, FEATURE_SWITCH), default_text="none")

    # --- step timer (shim/timing/step_timer.py) ---
    STEP_TIMER = Directory(
        None, "A directory for the per-step timer's lines, one steps-<pid>.jsonl per process (any server).",
        features=(FEATURE_STEP_TIMER,), default_text="unset (no timer)")
    STEP_TIMER_EVERY = Int(
        16, "The step timer times every Nth decode step on the device.", features=(FEATURE_STEP_TIMER,))
    STEP_PROFILE = Text(
        None, "A flag file: once it exists, the scheduler runs under cProfile for SPECFLIP_STEP_PROFILE_STEPS "
        "decode steps.", features=(FEATURE_STEP_TIMER,), kind="file name")
    STEP_PROFILE_STEPS = Int(800, "Decode steps in the profile window.", features=(FEATURE_STEP_TIMER,))

    # --- development: read by the tests and benchmarks, not by the plugin ---
    SGLANG_0_5_16_SRC = Text(
        None, "SGLang 0.5.16's source tree (the lint's and the overlap tests' stand-in for the GPU host's release).",
        features=(FEATURE_DEVELOPMENT,), kind="directory", default_text=".cache/sglang-src/0.5.16 (scripts/setup.sh)")
    REQUIRE_SGLANG = Flag(
        False, "The test session fails when a test needing real SGLang objects is skipped (scripts/test.sh sets it).",
        features=(FEATURE_DEVELOPMENT,), default_text="off (on when CI=true)")
    REQUIRE_SGLANG_V1 = Flag(
        False, "The same for SGLang 0.5.12's tests (scripts/test.sh sets it for that run).",
        features=(FEATURE_DEVELOPMENT,))
    LONG_RUN_STEPS = Int(
        2000, "Steps of each long clean guard run (tests/test_guard_long_run.py).", features=(FEATURE_DEVELOPMENT,))
    CONFORMANCE_LINE = Text(
        None, "Set by tests/test_release_conformance.py in the subprocess it runs for one SGLang line: that line's "
        "checks run there (its sglang first on the path).", features=(FEATURE_DEVELOPMENT,), kind="release line")

    def __iter__(self) -> Iterator[Setting]:
        for value in vars(type(self)).values():
            if isinstance(value, Setting):
                yield value

    def by_name(self) -> dict[str, Setting]:
        return {s.name: s for s in self}


settings = Settings()


def problems(env: Mapping[str, str] | None = None,
             features: tuple[str, ...] = PLUGIN_FEATURES) -> list[SettingError]:
    """Every bad value among the settings of `features`, each as its one-line SettingError; the combinations are
    checked where the features' configurations are built (shim.plugin.check_settings)."""
    found = []
    for setting in settings:
        if set(setting.features) & set(features):
            try:
                setting.get(env)
            except SettingError as exc:
                found.append(exc)
    return found


def rows() -> list[dict[str, str]]:
    """The table as data: name, type, default, feature, meaning (`specflip settings --json`)."""
    return [{"name": s.name, "type": s.kind, "default": s.default_text, "feature": ", ".join(s.features),
             "meaning": s.meaning} for s in sorted(settings, key=lambda s: FEATURES.index(s.features[0]))]


def markdown() -> str:
    """docs/settings.md: the table, generated (`specflip settings --markdown`; tests/test_settings.py checks it)."""
    lines = ["# specflip's settings", "",
             "Every `SPECFLIP_*` environment variable, generated from `shim/settings.py` by "
             "`specflip settings --markdown` (do not edit by hand). A bad value of any setting the plugin reads "
             "stops the server's start-up with one line naming the variable and what it allows; with "
             "`SPECFLIP_ON_BAD_CONFIG=warn` the server starts and the setting's feature stays off (one error line). "
             "An unset variable and one set to blanks read the same: the default.", ""]
    for feature in FEATURES:
        group = [row for row in rows() if row["feature"].split(", ")[0] == feature]
        if not group:
            continue
        lines += [f"## {feature}", "", "| name | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{r['name']}` | {_cell(r['type'])} | {_cell(r['default'])} | {_cell(r['meaning'])} |"
                  for r in group]
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
