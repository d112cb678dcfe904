"""One TP rank in a real two-process torch.distributed gloo group on the CPU, for tests/test_rank_check.py.

Not a test module: `python tests/tp_rank_process.py RANK WORLD INIT_FILE SCENARIOS OUT_JSON [MODEL_DIR]` joins the
group (`init_method=file://INIT_FILE`, a 30 s gloo timeout so that a hang fails instead of blocking), runs the
comma-separated SCENARIOS one after the other (one process start: importing SGLang takes seconds) and writes what
happened in each to OUT_JSON. Scenarios:

* `agree`, `late_flip`, `warn_late_flip`: shim.guard.rank_check.RankChecker alone over fingerprints of a scripted
  schedule of 40 steps; in the late-flip ones, rank 1 flips (spec mode off, one more model transition) one step after
  rank 0, at step 21.
* `driver`, `driver_late_flip`: the guard plugin installed through SGLang's real load_plugins (assert mode) and the
  switch's real plain path over real SGLang 0.5.23 objects (tests/overlap_loop.py's OverlapDriver, which plays the
  Scheduler), with the real adapter hook `after_get_next_batch_to_run` called after each `get_next_batch_to_run` with a
  real `NextBatchPlan`; the driver's `tp_cpu_group` is the gloo group. `driver_late_flip` puts the switch's fault
  injection (shim/switch/faults.py) on rank 1's second flip (the flip back on, with requests decoding).
"""

from __future__ import annotations

import json
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FLIP_AT = 21


def scripted(rank: int, scenario: str, checker: Any) -> dict[str, Any]:
    from shim.guard.rank_check import fingerprint

    transitions = 0
    for step in range(1, 41):
        late = scenario.endswith("late_flip") and rank == 1
        spec_on = step < (FLIP_AT + (1 if late else 0))
        transitions += 3 + (0 if spec_on else 1)
        rids = [f"r{i}" for i in range(step % 5 + 1)]

        def make(s: int, rids: list[str] = rids, spec_on: bool = spec_on, t: int = transitions) -> Any:
            return fingerprint(s, forward_mode=2, rids=rids, out_cache_loc_width=0 if spec_on else len(rids),
                               spec_algorithm_on=spec_on, spec_decode=spec_on, guard_mode_on=spec_on,
                               guard_num_steps=3, guard_transitions=t)
        checker.check(make)
    return {"checks": checker.step, "stopped": checker.stopped, "found": checker.found}


def driver_run(rank: int, scenario: str, group: Any, model_dir: str, out_dir: Path) -> dict[str, Any]:
    sys.path[:0] = [str(TESTS), str(ROOT / "stand_ins" / "cpu")]
    import guard_fixtures as gf
    import overlap_loop as ol
    import sglang_cpu as h
    from sglang.srt.managers.schedule_batch import NextBatchPlan

    from shim.switch.faults import LateFlipFault
    from shim.switch.v2 import SwitchConfig
    from statemodel.designs import get_design

    rt = gf.install_guard_plugin()
    rt.paused = False
    design = get_design("plain_off_retract_catch_up")
    gf.configure_guard(rt, design)
    adapter = rt.adapter

    class RankDriver(ol.OverlapDriver):
        """The driver's get_next_batch_to_run followed by the guard's real AFTER hook, as HookRegistry wraps
        Scheduler.get_next_batch_to_run (the driver is not a Scheduler subclass, so it is called here)."""

        def get_next_batch_to_run(self) -> Any:
            batch = super().get_next_batch_to_run()
            adapter.after_get_next_batch_to_run(NextBatchPlan(batch_to_run=batch, running_batch=self.running), self)
            return batch

    adapter._rank_checker = None  # a fresh checker per scenario (steps counted from 1)
    drv = RankDriver(ol.overlap_pools(Path(model_dir)), design,
                     switch_config=SwitchConfig(t_off=4, t_on=1, draft_while_off="retract"))
    drv.tp_cpu_group = group
    drv.accepts = gf.accept_cycle([4, 1, 3, 2])
    if scenario == "driver_late_flip":
        drv.switch.late_flip = LateFlipFault.from_env({"SPECFLIP_FAULT_LATE_FLIP": "1:2"})
    waves = {0: [6, 9, 14, 20, 50], 30: [5, 8, 12, 17]}
    reqs: list[Any] = []
    try:
        for it in range(60):
            if it in waves:
                wave = [h.make_req(f"w{it}_{i}", gf.SYSTEM_PROMPT + [200 + len(reqs) + i] * (3 + i),
                                   max_new_tokens=m) for i, m in enumerate(waves[it])]
                reqs += wave
                drv.add(wave)
            drv.iteration()
        drv.run_until_idle()
    finally:
        # this rank's switch trace, one file per scheduler process as a server writes it (`specflip ranks`)
        trace_dir = out_dir / f"switch_{scenario}"
        trace_dir.mkdir(exist_ok=True)
        (trace_dir / f"switch-rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n"
                                                                    for e in drv.switch.trace.events))
    checker = adapter.rank_checker(drv)
    return {"checks": checker.step, "flips": [a for _, a in drv.flips],
            "flip_iterations": [it for it, _ in drv.flips], "guard_found": len(rt.guard.found),
            "finished": sum(1 for r in reqs if r.finished()), "requests": len(reqs)}


def main() -> None:
    rank, world, init_file, scenarios, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    sys.path.insert(0, str(ROOT))
    import torch.distributed as dist

    from shim.guard.core import Mode
    from shim.guard.rank_check import RankChecker, RankDisagreement, group_exchange

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    group = dist.new_group(list(range(world)), backend="gloo", timeout=timedelta(seconds=30))
    results = {}
    for scenario in scenarios.split(","):
        result: dict[str, Any] = {"rank": rank}
        try:
            if scenario.startswith("driver"):
                result.update(driver_run(rank, scenario, group, sys.argv[6], Path(out).parent))
            else:
                mode = Mode.WARN if scenario.startswith("warn") else Mode.ASSERT
                checker = RankChecker(group_exchange(group, world), rank=rank, world_size=world, mode=mode)
                result.update(scripted(rank, scenario, checker))
            result["outcome"] = "ok"
        except RankDisagreement as exc:
            result.update(outcome="RankDisagreement", message=str(exc), step=exc.step, invariant=exc.invariant,
                          groups=[[fp.values(), list(ranks)] for fp, ranks in exc.groups])
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            result.update(outcome=type(exc).__name__, message=str(exc), traceback=traceback.format_exc())
            results[scenario] = result
            break  # the ranks may no longer pair their exchanges
        results[scenario] = result
    Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
