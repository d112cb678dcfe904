"""Where one server's scheduler spends more host time per decode step than another's.

Reads two cProfile windows written by shim/timing/step_timer.py (`SPECFLIP_STEP_PROFILE`: `profile-<pid>.pstats`, with
the window's decode-step count in the `profile` line of `steps-<pid>.jsonl` beside it) and lists the functions
whose time per decode step differs most, cumulative (the function and what it calls) and own (tottime).

usage: python bench/gpu/profile_diff.py BASE.pstats OTHER.pstats [--top 40]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pstats
import sys

Key = tuple[str, int, str]


def window_steps(pstats_path: str) -> int:
    """The decode steps the window covered, from the `profile` line the step timer wrote beside it."""
    name = os.path.basename(pstats_path)
    for steps_file in glob.glob(os.path.join(os.path.dirname(pstats_path), "steps-*.jsonl")):
        with open(steps_file) as fh:
            for line in fh:
                event = json.loads(line)
                if event.get("action") == "profile" and event.get("path") == name:
                    return int(event["decode_steps"])
    raise SystemExit(f"profile_diff: no 'profile' line for {name} in a steps-*.jsonl beside it")


def per_step(path: str) -> dict[Key, tuple[float, float, float]]:
    """{function: (calls, own ms, cumulative ms)} per decode step."""
    steps = window_steps(path)
    raw = pstats.Stats(path).stats  # type: ignore[attr-defined]
    return {key: (nc / steps, tt * 1e3 / steps, ct * 1e3 / steps) for key, (_cc, nc, tt, ct, _callers) in raw.items()}


def label(key: Key) -> str:
    file, line, func = key
    short = file.split("site-packages/")[-1].split("/site/")[-1]
    return f"{short}:{line}({func})" if line else func


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("other")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args(argv)
    base, other = per_step(a.base), per_step(a.other)
    keys = set(base) | set(other)
    zero = (0.0, 0.0, 0.0)
    total_base = sum(v[1] for v in base.values())
    total_other = sum(v[1] for v in other.values())
    print(f"own time per decode step: base {total_base:.3f} ms, other {total_other:.3f} ms "
          f"(+{total_other - total_base:.3f} ms; cProfile inflates both)")
    for column, title in ((2, "cumulative"), (1, "own")):
        rows = sorted(keys, key=lambda k: other.get(k, zero)[column] - base.get(k, zero)[column], reverse=True)
        print(f"\n== {title} ms per decode step, largest increase first: other - base (base, other, calls/step)")
        for key in rows[:a.top]:
            b, o = base.get(key, zero), other.get(key, zero)
            delta = o[column] - b[column]
            print(f"{delta:+8.4f}  ({b[column]:.4f}, {o[column]:.4f}, {b[0]:.1f}/{o[0]:.1f})  {label(key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
