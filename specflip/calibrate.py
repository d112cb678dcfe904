"""`specflip calibrate`: the switch's thresholds from a side-by-side throughput measurement.

The operator measures once (bench/gpu/bench_client.py: one JSON row per (cfg, concurrency) with `tok_s`,
plain decoding and always-on speculation on the same host) and the switch's hysteresis thresholds
(SPECFLIP_SWITCH=t_off:t_on, shim/switch/v2.py) come from that measurement, not from a guess.

The rule, over the concurrencies c measured for both configurations:
- speculation *wins* at c when spec_tok_s >= plain_tok_s * (1 + margin); the margin is what speculation must
  gain to be worth a flip (a flip costs a step or a re-prefill, which the measurement does not see);
- it wins nowhere: t_off = 1, t_on = 0 (off as soon as anything runs, back on only when idle, where the flip
  costs nothing);
- it wins at the largest measured concurrency: no switch (speculation always on); the measurement says
  nothing about where it would start to lose;
- otherwise t_off = the smallest measured concurrency above the largest win (where it loses: what lies
  between the two points was not measured, so the switch trusts the last win up to the first measured loss),
  t_on = the largest win, capped at the speculative running cap (speculation only comes back on when the
  running batch fits under that cap anyway);
- wins that are not a prefix of the sorted concurrencies (wins at 1 and 8, loses at 2 and 4): one hysteresis
  band cannot express two disjoint speculative ranges, so the rule above stands (t_on = the largest win);
  speculation then also runs at the losing concurrencies below it, and the report says so.

`--auto` also prints where the auto switch (SPECFLIP_SWITCH=auto, statemodel/auto_policy.py) would settle for this
measurement: its learner run against the measured throughputs (specflip/auto_sim.py), up and back down the
measured concurrencies, and the mode it holds at each (the comparison issue 17 asks for: calibrated thresholds
against what auto learns). `--tiers CFG=STEPS,...` (e.g. `spec=3,spec_steps1=1`, the ladder from low load to high,
each cfg an always-on server at that step count) simulates the tiered learner (SPECFLIP_SWITCH=auto with
SPECFLIP_TIERS) on those rows and prints, per concurrency, the best static setting and the mode it settles on.

The thresholds are checked by the switch's own configuration rule (shim.switch.config.SwitchConfig), through the
same env text the operator sets, so calibrate cannot print a setting the switch would refuse.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shim.switch.config import SwitchConfig
from specflip.auto_sim import TierRow, settled_modes, settled_tiers
from specflip.jsonl import json_objects

# what speculation must gain to be worth a flip, at most. Past 1 it asks speculation for more than twice plain
# decoding's throughput at the same load; with 1e308 every measurement answered "off as soon as anything runs" (1:0)
# as if it had been measured
MAX_MARGIN = 1.0


class CalibrateError(ValueError):
    """Bad input (a file, a row, an option); printed as one line, exit 2."""


@dataclass(frozen=True)
class Measured:
    """One concurrency measured for both configurations."""

    conc: int
    plain_tok_s: float
    spec_tok_s: float
    wins: bool

    @property
    def ratio(self) -> float:
        return self.spec_tok_s / self.plain_tok_s


@dataclass(frozen=True)
class Calibration:
    """The thresholds for one measurement; t_off/t_on are None when the recommendation is no switch."""

    plain_cfg: str
    spec_cfg: str
    files: tuple[str, ...]
    margin: float
    spec_cap: int
    rows: tuple[Measured, ...]
    t_off: int | None
    t_on: int | None
    why: str
    notes: tuple[str, ...] = field(default=())
    auto_modes: tuple[tuple[int, bool], ...] | None = None  # --auto: (c, speculation?) the auto switch settles on
    auto_tiers: tuple[TierRow, ...] | None = None  # --tiers: the tiered learner against every tier's rows

    @property
    def switch_env(self) -> str | None:
        """The value of SPECFLIP_SWITCH, or None: leave it unset (speculation always on)."""
        return None if self.t_off is None else f"{self.t_off}:{self.t_on}"

    def to_json(self) -> dict[str, Any]:
        return {"plain_cfg": self.plain_cfg, "spec_cfg": self.spec_cfg, "files": list(self.files),
                "margin": self.margin, "spec_cap": self.spec_cap,
                "rows": [{"conc": r.conc, "plain_tok_s": r.plain_tok_s, "spec_tok_s": r.spec_tok_s,
                          "spec_over_plain": round(r.ratio, 4), "wins": r.wins} for r in self.rows],
                "t_off": self.t_off, "t_on": self.t_on, "SPECFLIP_SWITCH": self.switch_env,
                "why": self.why, "notes": list(self.notes),
                **({} if self.auto_modes is None else
                   {"auto": [{"conc": c, "mode": "spec" if on else "plain"} for c, on in self.auto_modes]}),
                **({} if self.auto_tiers is None else
                   {"auto_tiers": [{"conc": r.conc, "static": {_mode(s): v for s, v in r.static.items()},
                                    "best": _mode(r.best), "fresh": _mode(r.fresh_steps),
                                    "fresh_over_best": round(r.fresh_ratio, 4), "sweep": _mode(r.sweep_steps)}
                                   for r in self.auto_tiers]})}


def _mode(steps: int) -> str:
    """A simulated mode as the report names it: plain, or steps=N."""
    return "plain" if steps == 0 else f"steps={steps}"


def parse_tiers(text: str) -> dict[str, int]:
    """`CFG=STEPS,...` (the ladder from low load to high) -> {cfg: steps}, in order; CalibrateError on bad text."""
    ladder: dict[str, int] = {}
    for item in text.split(","):
        cfg, sep, steps = item.strip().partition("=")
        if not sep or not cfg or not steps.strip().isdigit() or int(steps) < 1:
            raise CalibrateError(f"--tiers must be CFG=STEPS[,CFG=STEPS...] with steps >= 1 (e.g. "
                                 f"spec=3,spec_steps1=1), got {text!r}")
        ladder[cfg.strip()] = int(steps)
    if len(set(ladder.values())) != len(ladder) or len(ladder) != len(text.split(",")):
        raise CalibrateError(f"--tiers needs distinct cfgs and distinct step counts, got {text!r}")
    return ladder


@dataclass(frozen=True)
class _Row:
    tok_s: float
    where: str  # file:line, for the notes
    errors: int


def read_rows(paths: Sequence[str], cfgs: Sequence[str]) -> tuple[dict[str, dict[int, _Row]], list[str]]:
    """Rows of `cfgs` by concurrency (the last one when a (cfg, c) repeats: files in order, lines in order),
    and notes on what was replaced. Other configurations' rows are read as JSON but otherwise ignored."""
    table: dict[str, dict[int, _Row]] = {cfg: {} for cfg in cfgs}
    seen: dict[tuple[str, int], list[str]] = {}
    found: set[str] = set()
    for path in paths:
        for number, row in json_objects(path, CalibrateError, what="a row"):
            where = f"{path}:{number}"
            cfg = row.get("cfg")
            found.add(str(cfg))
            if cfg not in table:
                continue
            conc, tok_s = row.get("conc"), row.get("tok_s")
            if not isinstance(conc, int) or isinstance(conc, bool) or conc < 1:
                raise CalibrateError(f"{where}: cfg {cfg!r} row needs an integer 'conc' >= 1, got {conc!r}")
            if not isinstance(tok_s, int | float) or isinstance(tok_s, bool) or not math.isfinite(tok_s) \
                    or tok_s <= 0:
                raise CalibrateError(f"{where}: cfg {cfg!r} row needs a positive 'tok_s', got {tok_s!r}")
            errors = row.get("errors")
            table[cfg][conc] = _Row(float(tok_s), where, errors if isinstance(errors, int) else 0)
            seen.setdefault((cfg, conc), []).append(where)
    for cfg in cfgs:
        if not table[cfg]:
            raise CalibrateError(f"no rows with cfg {cfg!r} in {', '.join(paths)} "
                                 f"(cfgs found: {', '.join(sorted(found)) or 'none'})")
    notes = [f"{cfg} c={conc}: {len(wheres)} rows ({', '.join(wheres)}); used the last, {wheres[-1]}"
             for (cfg, conc), wheres in sorted(seen.items()) if len(wheres) > 1]
    return table, notes


def thresholds(rows: Sequence[Measured], spec_cap: int) -> tuple[int | None, int | None, str, list[str]]:
    """(t_off, t_on, why, notes) by the module's rule; rows sorted by concurrency."""
    concs = [r.conc for r in rows]
    wins = [r.conc for r in rows if r.wins]
    notes: list[str] = []
    if not wins:
        best = max(rows, key=lambda r: r.ratio)
        return 1, 0, ("speculation wins at no measured concurrency (best spec/plain "
                      f"{best.ratio:.3f} at c={best.conc}): off as soon as anything runs, back on only when idle, "
                      "where the flip costs nothing"), notes
    largest = wins[-1]
    losses_below = [c for c in concs if c < largest and c not in wins]
    if losses_below:
        notes.append(f"speculation's wins are not a prefix of the measured concurrencies: it loses at c="
                     f"{', '.join(map(str, losses_below))} below its largest win c={largest}; t_on is the largest "
                     "win anyway (one hysteresis band), so speculation also runs there")
    if largest == concs[-1]:
        return None, None, (f"speculation wins up to the largest measured concurrency (c={largest}): no switch, "
                            "leave SPECFLIP_SWITCH unset (speculation always on), or measure higher concurrencies "
                            "to find where it loses"), notes
    t_off = min(c for c in concs if c > largest)
    t_on = min(largest, spec_cap)
    capped = f" (the speculative running cap; it wins up to c={largest})" if t_on < largest else ""
    if t_off > spec_cap:
        notes.append(f"t_off={t_off} is above the speculative running cap {spec_cap}: while speculation is on, "
                     f"demand between {spec_cap} and {t_off} waits in the queue")
    return t_off, t_on, (f"speculation wins up to c={largest} and loses at c={t_off}, the next measured "
                         f"concurrency: off when demand reaches {t_off}, back on when it falls to {t_on}"
                         f"{capped}"), notes


def calibrate(paths: Sequence[str], plain: str = "plain", spec: str = "spec", margin: float = 0.05,
              spec_cap: int = 48, auto: bool = False, tiers: str | None = None) -> Calibration:
    """The thresholds for the measurement in `paths`; raises CalibrateError on bad input."""
    if not paths:
        raise CalibrateError("give at least one bench JSONL file")
    if not 0 <= margin <= MAX_MARGIN:  # also refuses nan and the infinities
        raise CalibrateError(f"--margin must be from 0 to {MAX_MARGIN:g} (what speculation must gain, as a fraction: "
                             f"0.05 is 5 %), got {margin:g}")
    if spec_cap < 1:
        raise CalibrateError(f"--spec-cap must be >= 1, got {spec_cap}")
    if plain == spec:
        raise CalibrateError(f"--plain and --spec name the same cfg {plain!r}")
    table, notes = read_rows(paths, (plain, spec))
    common = sorted(set(table[plain]) & set(table[spec]))
    if not common:
        raise CalibrateError(f"no concurrency measured for both {plain!r} (c={sorted(table[plain])}) and "
                             f"{spec!r} (c={sorted(table[spec])})")
    for cfg in (plain, spec):
        only = sorted(set(table[cfg]) - set(common))
        if only:
            notes.append(f"{cfg} only at c={', '.join(map(str, only))}: ignored")
        notes.extend(f"{cfg} c={c}: {table[cfg][c].errors} request errors in {table[cfg][c].where}"
                     for c in common if table[cfg][c].errors)
    rows = tuple(Measured(c, table[plain][c].tok_s, table[spec][c].tok_s,
                          table[spec][c].tok_s >= table[plain][c].tok_s * (1 + margin)) for c in common)
    t_off, t_on, why, rule_notes = thresholds(rows, spec_cap)
    auto_modes = None
    if auto:
        auto_modes = tuple(settled_modes({r.conc: r.plain_tok_s for r in rows}, {r.conc: r.spec_tok_s for r in rows},
                                         spec_cap=spec_cap))
    auto_tiers = None
    if tiers is not None:
        ladder = parse_tiers(tiers)
        if plain in ladder:
            raise CalibrateError(f"--tiers names the plain cfg {plain!r}")
        tier_table, tier_notes = read_rows(paths, (plain, *ladder))
        concs = sorted(set(tier_table[plain]).intersection(*(set(tier_table[c]) for c in ladder)))
        if not concs:
            raise CalibrateError(f"no concurrency measured for {plain!r} and every tier ({', '.join(ladder)})")
        notes += [n for n in tier_notes if n not in notes]
        auto_tiers = tuple(settled_tiers({c: tier_table[plain][c].tok_s for c in concs},
                                         {s: {c: tier_table[cfg][c].tok_s for c in concs} for cfg, s in ladder.items()},
                                         spec_cap=spec_cap))
    result = Calibration(plain, spec, tuple(paths), margin, spec_cap, rows, t_off, t_on, why,
                         tuple(notes + rule_notes), auto_modes, auto_tiers)
    _check_with_switch(result)
    return result


def _check_with_switch(result: Calibration) -> None:
    """The switch's own rule must accept the thresholds, read back from the env text the operator sets."""

    if result.switch_env is None:
        return
    config = SwitchConfig.from_env({"SPECFLIP_SWITCH": result.switch_env, "SPECFLIP_SPEC_CAP": str(result.spec_cap)})
    if config is None or (config.t_off, config.t_on) != (result.t_off, result.t_on):
        # a bug in this module, not bad input: loud, not a one-line usage error
        raise RuntimeError(f"SPECFLIP_SWITCH={result.switch_env} reads back as {config}")


def format_report(result: Calibration) -> str:
    lines = [f"calibrate: {result.spec_cfg!r} against {result.plain_cfg!r} from {', '.join(result.files)}; "
             f"speculation wins at c when spec >= plain x {1 + result.margin:g}; spec cap {result.spec_cap}",
             f"{'c':>6} {'plain tok/s':>12} {'spec tok/s':>12} {'spec/plain':>11}  wins?"]
    lines += [f"{r.conc:>6} {r.plain_tok_s:>12.1f} {r.spec_tok_s:>12.1f} {r.ratio:>11.3f}  {'yes' if r.wins else 'no'}"
              for r in result.rows]
    lines += [f"note: {n}" for n in result.notes]
    env = result.switch_env
    lines.append(f"SPECFLIP_SWITCH={env}" if env else "SPECFLIP_SWITCH unset (no switch: speculation always on)")
    lines.append(f"why: {result.why}.")
    if result.auto_modes is not None:
        on = [str(c) for c, spec in result.auto_modes if spec]
        off = [str(c) for c, spec in result.auto_modes if not spec]
        lines.append(f"SPECFLIP_SWITCH=auto would settle on: speculation at c={', '.join(on) or 'none'}; "
                     f"plain at c={', '.join(off) or 'none'} (its learner run against these rows)")
    if result.auto_tiers:
        modes = list(result.auto_tiers[0].static)
        lines.append("SPECFLIP_SWITCH=auto with tiers, simulated on these rows (a fresh learner on a steady load of "
                     "1,500 steps, 4 % step noise; and the mode held on the way down a sweep up and down):")
        lines.append(f"{'c':>6} " + " ".join(f"{_mode(m):>10}" for m in modes)
                     + f" {'best':>10} {'auto':>10} {'auto/best':>10} {'sweep':>10}")
        lines += [f"{r.conc:>6} " + " ".join(f"{r.static[m]:>10.1f}" for m in modes)
                  + f" {_mode(r.best):>10} {_mode(r.fresh_steps):>10} {r.fresh_ratio:>10.3f} {_mode(r.sweep_steps):>10}"
                  for r in result.auto_tiers]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """`specflip calibrate`; CalibrateError propagates (the CLI prints it as one line, exit 2)."""
    result = calibrate(args.bench, plain=args.plain, spec=args.spec, margin=args.margin, spec_cap=args.spec_cap,
                       auto=getattr(args, "auto", False), tiers=getattr(args, "tiers", None))
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(format_report(result))
    return 0
