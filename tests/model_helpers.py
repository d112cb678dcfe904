"""Helpers for the model tests: walk a design's model along a chosen path of actions."""

from __future__ import annotations

from collections.abc import Iterable

from proofs.bfs import TraceStep
from statemodel.actions import Action
from statemodel.design import Design, Scope
from statemodel.model import Model
from statemodel.state import State


def walk(model: Model, state: State, names: Iterable[str]) -> State:
    """Take, for each name, the first enabled action with that name; fail loudly if none is enabled."""
    for name in names:
        options = [a for a in model.actions(state) if a.name == name]
        assert options, f"{name} not enabled; enabled: {[a.describe() for a in model.actions(state)]}"
        state = model.next_state(state, options[0])
    return state


def take(model: Model, state: State, action: Action) -> State:
    assert action in model.actions(state), f"{action} not enabled: {model.actions(state)}"
    return model.next_state(state, action)


def replay_trace(model: Model, initial: State, trace: Iterable[TraceStep]) -> State:
    """Replay a checker's counterexample through the model, step by step: each action enabled where it was
    taken, each state the one the model reaches; the last state."""
    state = initial
    for step in trace:
        state = take(model, state, step.action)
        assert state == step.state
    return state


def initial_with(model: Model, t_off: int | None = None, t_on: int | None = None) -> State:
    for s in model.init_states():
        if t_off is None or (s.thresholds and (s.thresholds.t_off, s.thresholds.t_on) == (t_off, t_on)):
            return s
    raise AssertionError(f"no initial state with thresholds {t_off}/{t_on}")


def model_for(design: Design, scope: Scope | None = None) -> Model:
    return Model(design, scope or Scope())
