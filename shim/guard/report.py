"""The guard's reporting: the last transitions it keeps, the violation message (invariant, action, TP rank, SGLang
request ids, numbers, last transitions), and what a violation does per mode: raise `SpecFlipViolation` (assert) or
log, rate-limited per invariant (warn, trace).

Warn mode is something an operator can alert on: every finding is counted per invariant (`finding_counts`, and the
Prometheus counter of shim/guard/metrics.py where SGLang's metrics are on); a finding held back by the rate limit is
logged, with its count, once its invariant's interval has passed -- after the next step, or from the runtime's
reporter thread when no step comes (shim/guard/runtime.py) -- and at close, so none is lost when the server stops.

A finding of a state that stays broken until something repairs it is counted once per episode: a finding of such an
invariant (`EPISODE_INVARIANTS`) at the same action over requests that an open finding of it already named (a subset
of them) is the same fault seen again, not a new one, until that action passes a check clean, or the next flip
(`close_open_findings`). It is recorded (the trace's step keeps its violations), counted in `repeat_counts` and named
in the totals line, but not counted, exported or logged as a new finding. Why: under the overlap schedule the step in
flight when the guard judges is processed after the next one launched, so one fault can be looked at twice. SGLang's
adaptive steps-0 draft-extend skip (SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1): at the first draft after the step count
goes back up, the guard sees the draft KV short by the steps-0 results processed so far; the last steps-0 step's
result, still in flight, is processed after that draft launched, and the next draft finds those same requests short
by its position too (H100, 2026-12-06, b3a9830: 8 findings for 4 re-enables; tests/test_guard_warn_mode.py reproduces
the two looks on real objects of the CPU test line in the overlap loop). `requests_in_one_place`: a live request
dropped from every batch stays dropped, and every later step finds it; its episode spans every action and flips
(`ANY_ACTION_EPISODES`), so one dropped request is one finding until a step passes clean
(tests/test_guard_live_requests.py). Assert mode raises at the first look, as before. Every other invariant judges
what a step did, or a state the guard takes from the objects at that step, so each of its findings is a new fault (a
bug that repeats every step is found every step).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter, deque
from typing import Any

from shim.guard.config import GuardConfig, Mode
from shim.guard.trace import rid_name
from statemodel.actions import Action
from statemodel.invariants import Violation

logger = logging.getLogger("specflip.guard")


class SpecFlipViolation(AssertionError):
    """A step the model forbids, raised in assert mode before the forward that would run it.

    `invariant` is the first broken invariant (a `statemodel.invariants.INVARIANT_NAMES` name, a
    `statemodel.identity.IDENTITY_INVARIANT_NAMES` name, or `legal_transition`), `action` the model action, `rank`
    the TP rank, `rids` the SGLang request ids, `violations` all of them.
    """

    def __init__(self, message: str, *, invariant: str, action: str, rank: int, rids: tuple[str, ...],
                 violations: tuple[Violation, ...]) -> None:
        super().__init__(message)
        self.invariant = invariant
        self.action = action
        self.rank = rank
        self.rids = rids
        self.violations = violations


_REQUEST_NUMBER = re.compile(r"\brequest (\d+)")
_NAMED_ACTIONS = ("arrive", "finish", "retract")  # actions on requests, described by their SGLang names
_NAMES_SHOWN = 4  # an arrival of a whole wave names this many
FOUND_KEPT = 256  # findings kept whole in `found` (tests and explain read them); every one is counted beyond that
# invariants that judge the state a step starts from, which stays broken until repaired (module docstring):
# draft_kv_covers_prefix, the draft KV a draft step starts from, short until a draft-extend covers it;
# requests_in_one_place, a live request in no batch, which every later step finds there until it leaves
EPISODE_INVARIANTS = frozenset({"draft_kv_covers_prefix", "requests_in_one_place"})
# of those, the ones whose episode spans every action (and flips): a request dropped from the batches is the same
# fault at whichever step looks, until a step passes clean
ANY_ACTION_EPISODES = frozenset({"requests_in_one_place"})


class GuardReporting:
    """The reporting half of `shim.guard.core.Guard` (a mixin: it reads the guard's names and settings)."""

    config: GuardConfig
    names: list[str]
    step_number: int
    # (step, action, where, request name) per transition, or a note; formatted only when a message is built
    history: deque[tuple[int, Action, str, str | None] | str]
    found: list[tuple[str, tuple[Violation, ...]]]  # (action, violations), warn/trace mode: the first FOUND_KEPT
    finding_counts: Counter[str]  # every finding, by its first invariant, all modes
    metrics: Any  # shim.guard.metrics.GuardMetrics where SGLang's metrics are on, else None
    _last_warned: dict[str, float]
    _suppressed: dict[str, int]
    _latest_suppressed: dict[str, str]  # invariant -> the first line of its latest finding not logged yet
    _report_lock: threading.RLock  # the rate limit's books: the scheduler thread and the reporter thread share them
    _totals_logged: int  # findings_total when the last totals line was logged
    repeat_counts: Counter[str]  # looks at an open finding (the same fault again), by invariant: not findings
    # (invariant, action) -> the SGLang names of the requests an open finding named (module docstring)
    _open: dict[tuple[str, str], frozenset[str]]

    def _init_reporting(self) -> None:
        self.found = []
        self.finding_counts = Counter()
        self.metrics = None
        self._last_warned = {}
        self._suppressed = {}
        self._latest_suppressed = {}
        self._report_lock = threading.RLock()  # re-entrant: the shutdown report can interrupt a step in its thread
        self._totals_logged = 0
        self.repeat_counts = Counter()
        self._open = {}

    @property
    def findings_total(self) -> int:
        return sum(self.finding_counts.values())

    def note(self, text: str) -> None:
        """Something worth seeing in the last transitions that is not a model action."""
        self.history.append(f"({text})")

    def _request_name(self, action: Action) -> str | None:
        """The SGLang names of the requests an arrive/finish/retract acts on, as the step's description shows them
        (None for other actions); an arrival of many names its first few and counts the rest."""
        if action.name not in _NAMED_ACTIONS or not action.args:
            return None
        shown = ", ".join(repr(rid_name(self.names, r)) for r in action.args[:_NAMES_SHOWN])
        more = len(action.args) - _NAMES_SHOWN
        return f"{shown} and {more} more" if more > 0 else shown

    def _describe(self, action: Action, name: str | None = None) -> str:
        """`name`: the requests' names captured when the step was recorded (default: looked up now)."""
        name = name if name is not None else self._request_name(action)
        return f"{action.name}({name})" if name is not None else action.describe()

    def _history_lines(self) -> list[str]:
        lines = []
        for entry in self.history:
            if isinstance(entry, str):
                lines.append(entry)
                continue
            step, action, where, name = entry
            lines.append(f"#{step} {self._describe(action, name)} [{where}]")
        return lines

    def _report(self, action: Action, found: tuple[Violation, ...], where: str | None = None) -> None:
        message = self.format(action, found, where=where)
        first = found[0]
        rids = tuple(dict.fromkeys(rid_name(self.names, r) for v in found for r in v.rids))
        if not rids and action.name in _NAMED_ACTIONS and action.args:
            rids = tuple(rid_name(self.names, r) for r in action.args)  # a pool-wide violation seen at their step
        key = first.invariant
        episode = (key, "" if key in ANY_ACTION_EPISODES else action.name)
        if self.config.mode is not Mode.ASSERT and rids and key in EPISODE_INVARIANTS:
            named = frozenset(rids)
            if named <= self._open.get(episode, frozenset()):  # the same fault seen again (module docstring)
                with self._report_lock:
                    self.repeat_counts[key] += 1
                self.note(f"{key} again over requests an open finding named: not a new finding")
                return
            self._open[episode] = named
        with self._report_lock:
            self.finding_counts[key] += 1
        if self.metrics is not None:
            self.metrics.count(key)
        if self.config.mode is Mode.ASSERT:
            raise SpecFlipViolation(message, invariant=first.invariant, action=action.name, rank=self.config.rank,
                                    rids=rids, violations=found)
        if len(self.found) < FOUND_KEPT:
            self.found.append((action.name, found))
        now = time.monotonic()
        with self._report_lock:
            if now - self._last_warned.get(key, -1e18) >= self.config.warn_interval_s:
                skipped = self._suppressed.pop(key, 0)
                self._latest_suppressed.pop(key, None)
                extra = f" ({skipped} more like it since the last report)" if skipped else ""
                logger.warning("%s%s", message, extra)
                self._last_warned[key] = now
            else:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                self._latest_suppressed[key] = message.split("\n", 1)[0]
        if self._suppressed:
            self._flush_suppressed(now)  # another invariant's held-back findings whose interval has passed

    def close_open_findings(self, action: Action, *, clean: bool = True) -> None:
        """A step of `action` passed its check clean: the findings open at that action, and those open at any action
        (`ANY_ACTION_EPISODES`), are over (a later one is a new fault); a flip, `clean` or not, ends those open at an
        action."""
        flip = action.name in ("flip_on", "flip_off")
        for episode in [e for e in self._open if e[1] == action.name or (flip and e[1]) or (clean and not e[1])]:
            del self._open[episode]

    def _flush_suppressed(self, now: float | None = None, *, force: bool = False) -> None:
        """Warn mode never goes silent after a first report: once an invariant's interval has passed, the findings
        held back since are logged as one line with their count and the latest of them, whether or not a new one
        comes (called after every step while any is held back, from the runtime's reporter thread, and at close)."""
        now = time.monotonic() if now is None else now
        with self._report_lock:
            for key in list(self._suppressed):
                if force or now - self._last_warned.get(key, -1e18) >= self.config.warn_interval_s:
                    count = self._suppressed.pop(key)
                    latest = self._latest_suppressed.pop(key, "")
                    logger.warning("specflip: %d more %s findings since the last report on TP rank %d; latest: %s",
                                   count, key, self.config.rank, latest)
                    self._last_warned[key] = now

    def report_held_back(self, *, force: bool = False) -> None:
        """What the reporter thread calls every interval, and close at shutdown: the held-back findings whose
        interval has passed (all of them with `force`), then the totals line if any finding came since the last."""
        if self._suppressed:
            self._flush_suppressed(force=force)
        with self._report_lock:
            total = sum(self.finding_counts.values())
            if total == self._totals_logged:
                return
            self._totals_logged = total
            counts = ", ".join(f"{name} {n}" for name, n in self.finding_counts.most_common())
            if self.repeat_counts:
                counts += "; the same faults seen again, not counted: " + ", ".join(
                    f"{name} {n}" for name, n in self.repeat_counts.most_common())
        logger.warning("specflip guard: %d findings in all on TP rank %d since start (%s)", total, self.config.rank,
                       counts)

    def format(self, action: Action, found: tuple[Violation, ...], *, where: str | None = None) -> str:
        """The violation message: invariant, action, rank, request ids, numbers, last transitions."""
        lines = []
        for i, v in enumerate(found):
            names = ", ".join(repr(rid_name(self.names, r)) for r in v.rids)
            who = f" requests [{names}]" if names else ""
            text = _REQUEST_NUMBER.sub(lambda m: f"request {rid_name(self.names, int(m.group(1)))!r}", v.message)
            numbers = f" (expected {v.expected}, actual {v.actual})" if v.expected or v.actual else ""
            head = "specflip: " if i == 0 else "  also: "
            lines.append(f"{head}{v.invariant} broken by {self._describe(action)} on TP rank {self.config.rank}"
                         f"{who}: {text}{numbers}")
        if where:
            lines.append(f"  seen at: {where}")
        lines.append("  last transitions: " + "; ".join(self._history_lines()))
        return "\n".join(lines)
