"""A closed loop of requests for the auto learner (statemodel.auto_policy), simulated per request: what
specflip.auto_sim's demand-per-step simulation cannot show, a wave split by speculation's cap.

`clients` clients each keep one request in flight: `prompt` tokens in, `output` tokens out, the next sent `think`
steps after the last finished. Speculation runs at most `spec_cap` requests (first come, first served; the rest
wait), plain decoding all of them. A decode step at batch b in a mode takes the time the mode's tok/s table implies
(specflip.auto_sim.throughput_at) and gives each running request the mode's accept length (plain: 1) of tokens.
Admitting waiting requests costs a prefill (`prefill_s`), and a flip-on with requests running re-prefills them: the
catch-up, `catch_up_fixed_s` plus `catch_up_per_token_s` per prompt and output token, which the learner observes
(`observe_catch_up`). The decisions are the switch's own (shim/switch/auto.py `AutoSwitch.decide`: the catch-up gate
and its hold).
The learner decides at every step and sees the steps in windows of 8, as the switch does; a flip takes effect at
once (the switch puts one off while a prefilled batch waits to merge, then decides again). Deterministic.

Tokens are conserved (every request asks for `output` tokens in every mode), so `tok_s` compares policies fairly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shim.switch.auto import AutoSwitch
from specflip.auto_sim import ACCEPT_LENGTH, _points, throughput_at
from statemodel import auto_policy as ap


@dataclass
class LoopResult:
    state: ap.AutoState
    tokens: int
    seconds: float
    flips: int
    split_steps: int  # speculative steps with requests waiting beyond the cap
    final_steps: int  # the mode at the end: the step count speculation ran at, 0 plain (the next phase's start)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def closed_loop(plain: Mapping[int, float], tiers: Mapping[int, Mapping[int, float]], *, clients: int, requests: int,
                state: ap.AutoState, steps: int, spec_cap: int = 48, prompt: int = 32, output: int = 128,
                think: int = 2, prefill_s: float = 0.012, catch_up_fixed_s: float = 0.018,
                catch_up_per_token_s: float = 2e-6, fixed: bool = False) -> LoopResult:
    """`requests` requests in all through `clients` clients; the server starts at step count `steps` (0: plain).
    `fixed`: no switch, the server stays at `steps` (a static setting to compare with)."""
    plain_pts = _points(plain, None)
    spec_pts = {s: _points(t, spec_cap) for s, t in tiers.items()}
    tier = steps or next(iter(tiers))
    spec_on = steps != 0
    running: list[list[int]] = []  # [request id, output tokens so far]
    waiting: list[int] = []
    arrivals: list[tuple[int, int]] = [(0, rid) for rid in range(clients)]  # (step it arrives, request id)
    sent = clients
    auto = AutoSwitch(spec_cap=spec_cap, state=state, tier=tier)
    pending: list[ap.Observation] = []
    tokens = flips = split = 0
    seconds = 0.0
    step = 0
    while sent < requests or running or waiting or arrivals:
        waiting += [rid for at, rid in arrivals if at <= step]
        arrivals = [(at, rid) for at, rid in arrivals if at > step]
        if fixed:
            d = ap.Decision(None, "fixed", auto.state.incumbent, len(running) + len(waiting), len(running), None,
                            None, auto.state.step)
        else:  # the running requests' work, read only for a flip-on with requests running
            d = auto.decide(spec_on, len(running), len(waiting), steps=tier, batch_work=lambda running=running: (
                sum(output - r[1] for r in running), sum(prompt + r[1] for r in running),
                frozenset(str(r[0]) for r in running)))
        if d.action is not None:
            flips += 1
            spec_on = d.action == ap.FLIP_ON
            if spec_on and running:
                catch_up = sum(prompt + r[1] for r in running)
                catch_up_s = catch_up_fixed_s + catch_up_per_token_s * catch_up
                seconds += catch_up_s
                auto.state = ap.observe_catch_up(auto.state, catch_up, catch_up_s)
        if d.steps is not None and not fixed:
            tier = d.steps
        auto.commit(d)
        room = (spec_cap - len(running)) if spec_on else len(waiting)
        if room > 0 and waiting:
            running += [[rid, 0] for rid in waiting[:room]]
            waiting = waiting[room:]
            seconds += prefill_s
        step += 1
        if not running:
            continue
        batch = len(running)
        split += spec_on and bool(waiting)
        accept = ACCEPT_LENGTH if spec_on else 1.0
        step_s = batch * accept / throughput_at(spec_pts[tier] if spec_on else plain_pts, batch)
        seconds += step_s
        got = 0
        for r in running:
            take = min(int(accept), output - r[1])
            r[1] += take
            got += take
        tokens += got
        pending.append(ap.Observation(spec_on, batch, got, step_s, steps=tier if spec_on else None))
        if len(pending) >= 8:
            for obs in pending:
                auto.state = ap.observe(auto.state, obs)
            pending = []
        for r in [r for r in running if r[1] >= output]:
            running.remove(r)
            if sent < requests:
                arrivals.append((step + think, sent))
                sent += 1
    return LoopResult(auto.state, tokens, seconds, flips, split, tier if spec_on else 0)
