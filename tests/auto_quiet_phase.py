"""The quiet phase after a burst, as the H100 and H200 replays (tests/test_auto_h100_shifts.py,
tests/test_auto_h200_shifts.py) drive the learner through it."""

from __future__ import annotations

from statemodel import auto_policy as ap


def steps_to_flip_on(state: ap.AutoState, plain_s: float, cap: int, limit: int = 64) -> int | None:
    """The quiet phase's start as the traces have it (idle, one request waiting, then the second while the first is
    admitted), then decode steps of the 2 requests at `plain_s` (plain decoding's measured seconds a step), fed in the
    switch's windows of 8: the plain steps run before the learner flips speculation on (None: none within `limit`)."""
    for running, waiting in ((0, 0), (0, 1), (1, 1)):
        d = ap.decide(state, False, running + waiting, running, cap, context=40.0)
        assert d.action is None, d
        state = ap.commit(state, d)
    pending = []
    for step in range(limit):
        d = ap.decide(state, False, 2, 2, cap, context=40.0 + step)
        state = ap.commit(state, d)
        if d.action == ap.FLIP_ON:
            return step
        pending.append(ap.Observation(False, 2, 2.0, plain_s, context=40.0 + step))
        if len(pending) == 8:
            for obs in pending:
                state = ap.observe(state, obs)
            pending = []
    return None
