"""The switch's flip decision reads no per-rank value (docs/tp.md): under TP every rank runs its own switch, and a flip
is rank-consistent only if every input of the decision is the same on every rank. Checked on the source (AST): the
policy functions read only their arguments and the configuration; the plain path's decision reads only scheduler
state that every rank holds alike (requests broadcast from rank 0 by `recv_requests`, scheduled deterministically);
nothing in the decision reads a clock, a pid, free memory, a random number or the rank. The one rank read in
`plain_path_flip` is the fault injection (shim/switch/faults.py), after the decision and off by default. The check is
shown to fail on a decision that reads the clock."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from shim.switch import auto as auto_switch
from shim.switch import policy as switch_policy
from shim.switch import v2 as switch_v2
from statemodel import policy as model_policy

# names whose value differs per rank (or per process, per call): none may be read where a flip is decided
PER_RANK_NAMES = {"time", "perf_counter", "monotonic", "monotonic_ns", "time_ns", "getpid", "mem_get_info",
                  "get_available_gpu_memory", "memory_allocated", "memory_reserved", "get_rank", "tp_rank",
                  "random", "randint", "uniform", "environ", "getenv", "hash", "id", "gpu_id", "late_flip"}


def names_read(node: ast.AST) -> set[str]:
    """Every bare name and attribute name loaded or called in `node`."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def function_ast(fn: Callable[..., Any]) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def decision_part(fn: Callable[..., Any], decided: str) -> list[ast.stmt]:
    """The statements of `fn` up to and including the first one that assigns `decided` (the decision)."""
    body = function_ast(fn).body
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == decided for t in stmt.targets):
            return body[: i + 1]
    raise AssertionError(f"{fn.__qualname__} assigns no {decided!r}")


def per_rank_reads(nodes: list[ast.stmt] | ast.AST) -> set[str]:
    seen: set[str] = set()
    for node in nodes if isinstance(nodes, list) else [nodes]:
        seen |= names_read(node)
    return seen & PER_RANK_NAMES


def test_decide_flip_reads_only_its_arguments() -> None:
    node = function_ast(model_policy.decide_flip)
    params = {a.arg for a in node.args.args}
    assert params == {"spec_on", "demand", "in_flight", "t_off", "t_on", "spec_cap"}
    body_names = set().union(*(names_read(s) for s in node.body))
    # within_spec_cap: the one cap rule (statemodel/policy.py), a pure function of the arguments passed to it
    assert body_names <= params | {"Flip", "OFF", "ON", "within_spec_cap"}, body_names - params


def test_switch_policy_reads_counts_and_configuration_only() -> None:
    for fn in (switch_policy.SwitchPolicy.wants, switch_policy.SwitchPolicy.decide):
        node = function_ast(fn)
        read = set().union(*(names_read(s) for s in node.body))
        # the auto learner (SPECFLIP_SWITCH=auto): its state is fed only observations agreed across the ranks
        # (shim/switch/auto.py: a MAX all-reduce per 8-step window over tp_cpu_group), and the model's check of
        # its decision (model_free_flips, refused) reads the same counts
        auto = {"auto", "decide", "decision", "commit", "design_name", "model_free_flips", "refused", "performed"}
        # with tiers: the tier in force (every rank's from the same decisions) and the configured ladder
        auto |= {"tier", "tiers", "ladder", "steps"}
        allowed = {a.arg for a in node.args.args} | {"c", "config", "t_off", "t_on", "spec_cap", "spec_on", "clamp",
                                                    "decide_flip", "wants", "action", "Flip", "ON", "None"} | auto
        assert read <= allowed, (fn.__qualname__, read - allowed)


def test_plain_path_decision_reads_shared_scheduler_state_only() -> None:
    """plain_path_flip's inputs to rt.policy.wants: the chunked request, the running batch's and the pending prefill's
    unfinished requests, the waiting queue's length; the fault injection's rank read comes after the decision."""
    part = decision_part(switch_v2.plain_path_flip, "action")
    assert per_rank_reads(part) == set()
    # auto: the running requests' remaining and re-prefill tokens (catch_up_work), python ints every rank holds alike;
    # the context the decision is valued at (next_context): the longest of the running requests and the waiting
    # queue's, from their token lists, which every rank holds alike (each request is broadcast before it is queued);
    # and those requests' rids (request_ids), which the learner stamps with its agreed step (a recheck's turnover)
    allowed = {"scheduler", "chunked_req", "last_batch", "_pending_prefill", "pending", "running_batch", "in_batch",
               "r", "reqs", "finished", "waiting", "waiting_queue", "len", "action", "rt", "policy", "wants", "None",
               "batch_work", "catch_up_work", "auto", "context", "next_context", "rids", "request_ids"}
    read = set().union(*(names_read(s) for s in part))
    assert read <= allowed, read - allowed
    assert per_rank_reads(function_ast(switch_v2._pending_prefill)) == set()
    assert per_rank_reads(function_ast(switch_v2.catch_up_work)) == set()
    for fn in (auto_switch.next_context, auto_switch.request_context):  # token lists' lengths only
        read = set().union(*(names_read(s) for s in function_ast(fn).body))
        assert read <= {"max", "map", "chain", "request_context", "running", "waiting", "default", "float", "len",
                        "getattr", "req"}, (fn.__qualname__, read)
    read = set().union(*(names_read(s) for s in function_ast(auto_switch.request_ids).body))
    assert read <= {"str", "req", "rid", "chain", "running", "waiting"}, read  # the requests' ids only
    whole = function_ast(switch_v2.plain_path_flip)
    assert "late_flip" in names_read(whole)  # the fault injection, after the decision (shim/switch/faults.py)
    # the normal-loop switch (draft modes sync and none) decides in flip() on the same kind of counts
    assert per_rank_reads(decision_part(switch_v2.flip, "action")) == set()


def test_the_check_fails_on_a_clock_in_the_decision() -> None:
    """A checker that passes must be shown to fail: a decision that reads the wall clock is flagged."""
    def timed_flip(rt: Any, scheduler: Any) -> Any:
        import time

        waiting = len(scheduler.waiting_queue) + int(time.perf_counter() % 2)
        action = rt.policy.wants(0, waiting, 0)
        return action

    assert per_rank_reads(decision_part(timed_flip, "action")) == {"time", "perf_counter"}
    with pytest.raises(AssertionError, match="assigns no"):
        decision_part(timed_flip, "nothing")
