"""The model as plain-data graphs for the diagrams: nodes, edges, labels; no rendering here.

Everything is derived from the model, never written by hand:

- edges come from exploring the transition system (`statemodel.actions.enabled` / `apply`) of the
  shipped designs (candidates included) breadth-first up to a bound, abstracted to (spec_mode, stage), plus
  the transitions
  of the known-bad designs' shortest counterexamples (`proofs.bfs.check`). Where an action of
  ACTION_CATALOGUE was not reached that way, its catalogue entry (stage_from -> stage_to, spec_mode)
  supplies the edge, marked `from_catalogue`;
- edge labels are the catalogue's `action [guard]`;
- the fields a step reads and writes are measured: writes by comparing the state before and after
  each explored transition, reads by changing one field in the state before and seeing whether the
  step's enabledness, its effect on the other fields or the invariants it breaks change;
- invariants attach to the step where a known-bad design's counterexample breaks them.

Exploration is bounded (EXPLORE_STATES per design) so generation takes seconds; the exhaustive
proof is `specflip check`'s job, not this module's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import attrs

from proofs.bfs import Search, check, model_successors
from statemodel.actions import ACTION_CATALOGUE, ACTIONS_BY_NAME, Action, ActionMode
from statemodel.design import AdaptiveTiers, Design, Scope
from statemodel.designs import CANDIDATES, KNOWN_BAD, SHIPPED
from statemodel.invariants import Violation
from statemodel.model import Model
from statemodel.state import Batch, ForwardMode, SpecInfo, SpecInfoKind, SpecMode, Stage, State

EXPLORE_STATES = 5000  # per shipped design: reaches every action the shipped designs take (see tests)
PERTURB_SAMPLES = 40  # transitions per (design, mode, stage, action) measured for reads and writes

ON, OFF = SpecMode.ON.value, SpecMode.OFF.value


# ----------------------------------------------------------------------------------------------
# Plain data


@attrs.frozen
class Node:
    id: str
    title: str
    mode: str  # "on", "off" or "" (neither): the colour the renderers give it
    lines: tuple[str, ...] = ()
    violation: str | None = None  # the broken invariant's name: drawn red
    lane: str = ""  # trace graphs: the mode lane the node sits in


@attrs.frozen
class Edge:
    source: str
    target: str
    action: str | None  # an ACTION_CATALOGUE name; None for a summary edge (a whole step cycle)
    label: str  # "action [guard]", or the summary text
    mode: str
    lines: tuple[str, ...] = ()  # reads / writes / launches / invariants
    from_catalogue: bool = False  # not reached by the exploration: the catalogue's stage_from -> stage_to
    violation: str | None = None


@attrs.frozen
class Graph:
    name: str  # file stem under docs/diagrams/
    title: str
    kind: str  # "machine" or "trace"
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    lanes: tuple[tuple[str, str], ...] = ()  # trace graphs: (mode, lane title), left to right

    def actions(self) -> set[str]:
        return {e.action for e in self.edges if e.action is not None}


# ----------------------------------------------------------------------------------------------
# Exploration


Transition = tuple[State, Action, State]


def explore(model: Model, max_states: int) -> Iterator[Transition]:
    """Every transition out of the first `max_states` states reached breadth-first, in a fixed order
    (the checker's search, `proofs.bfs.Search`, bounded)."""
    search = Search(model.init_states(), model_successors(model), max_nodes=max_states)
    for before, action, after, _, _ in search.edges():
        yield before, action, after


def _fields(state: State) -> dict[str, object]:
    """The batch fields the step diagrams talk about, as comparable values."""
    running = state.running
    return {
        "forward_mode": running.forward_mode,
        "spec_info": (running.spec_info, running.spec_algorithm_on, state.pending.spec_info if state.pending else None),
        "out_cache_loc": running.out_cache_loc_width,
        "seq_lens": tuple(r.seq_len for r in state.requests),
        "KV": (state.kv_free, tuple((r.kv_held, r.kv_reserved) for r in state.requests)),
        "draft KV": tuple((r.draft_kv_len, r.draft_hidden_ready) for r in state.requests),
    }


FIELDS: tuple[str, ...] = ("forward_mode", "spec_info", "out_cache_loc", "seq_lens", "KV", "draft KV")


def _perturbed(state: State, field: str) -> State:
    """`state` with one field changed, everything else (including the KV accounting) consistent."""
    running = state.running
    if field == "forward_mode":
        other = ForwardMode.IDLE if running.forward_mode is not ForwardMode.IDLE else ForwardMode.DECODE
        return attrs.evolve(state, running=attrs.evolve(running, forward_mode=other))
    if field == "spec_info":
        spec = (SpecInfo.none() if running.spec_info.kind is not SpecInfoKind.NONE
                else SpecInfo(SpecInfoKind.DRAFT_INPUT, running.size, 1))
        return attrs.evolve(state, running=attrs.evolve(running, spec_info=spec))
    if field == "out_cache_loc":
        return attrs.evolve(state, running=attrs.evolve(running, out_cache_loc_width=running.out_cache_loc_width + 1))
    if field == "seq_lens":
        return attrs.evolve(state, requests=tuple(r.replace(seq_len=r.seq_len + 1) for r in state.requests))
    if field == "KV":  # one reserved slot of the first running request back to the free list
        held = [r for r in (state.req(rid) for rid in running.rids) if r.kv_reserved]
        if not held:
            return attrs.evolve(state, kv_free=state.kv_free - 1)
        r = held[0]
        changed = {r.rid: r.replace(kv_reserved=r.kv_reserved - 1)}
        return attrs.evolve(state, requests=state.with_requests(changed), kv_free=state.kv_free + 1)
    if field == "draft KV":
        return attrs.evolve(state, requests=tuple(
            r.replace(draft_hidden_ready=not r.draft_hidden_ready) for r in state.requests))
    raise ValueError(field)


def _effect(before: State, after: State) -> dict[str, object]:
    b, a = _fields(before), _fields(after)
    return {name: (a[name] if a[name] != b[name] else None) for name in FIELDS}


def _broken(model: Model, before: State, action: Action, after: State) -> set[str]:
    """Invariants this step breaks that the state before did not already break."""
    return ({v.invariant for v in model.check_step(before, action, after)}
            - {v.invariant for v in model.check_state(before)})


def _reads(model: Model, before: State, action: Action, after: State) -> set[str]:
    effect = _effect(before, after)
    broken = _broken(model, before, action, after)
    found = set()
    for field in FIELDS:
        changed = _perturbed(before, field)
        if action not in model.actions(changed):
            found.add(field)
            continue
        changed_after = model.next_state(changed, action)
        changed_effect = _effect(changed, changed_after)
        if any(changed_effect[f] != effect[f] for f in FIELDS if f != field):
            found.add(field)
        elif _broken(model, changed, action, changed_after) != broken:
            found.add(field)
    return found


def _forward(batch: Batch) -> str:
    return f"{batch.forward_mode.value} · {batch.spec_info.kind.value}"


@attrs.define
class _ActionFacts:
    """What the exploration saw one action do, in one mode."""

    targets: dict[tuple[str, str], None] = attrs.field(factory=dict)  # (mode, stage) after, insertion-ordered
    reads: set[str] = attrs.field(factory=set)
    writes: set[str] = attrs.field(factory=set)
    launches: set[str] = attrs.field(factory=set)
    probed: dict[str, int] = attrs.field(factory=dict)  # design -> transitions probed for reads/writes
    shipped: bool = False  # taken by a shipped design (not only in a known-bad counterexample)


@attrs.define
class Observations:
    """The shipped designs explored, abstracted to (spec_mode, stage); known-bad counterexamples."""

    facts: dict[tuple[str, str, str], _ActionFacts] = attrs.field(factory=dict)  # (mode, stage, action)
    launched: dict[str, set[str]] = attrs.field(factory=dict)  # mode -> forwards launched in it
    resting_spec_info: dict[str, set[str]] = attrs.field(factory=dict)  # mode -> running spec_info at rest
    num_steps: dict[str, set[int]] = attrs.field(factory=dict)  # policy kind -> spec-on step counts seen
    broken_at: dict[str, dict[str, list[str]]] = attrs.field(factory=dict)  # action -> invariant -> designs
    counterexamples: dict[str, tuple[State | None, tuple[tuple[Action, State], ...], tuple[Violation, ...]]] = (
        attrs.field(factory=dict))

    def record(self, model: Model, before: State, action: Action, after: State, shipped: bool) -> None:
        """A shipped design's transition: its edge and what it does; a known-bad one's: its edge only."""
        key = (before.spec_mode.value, before.stage.value, action.name)
        facts = self.facts.setdefault(key, _ActionFacts())
        facts.targets[(after.spec_mode.value, after.stage.value)] = None
        if not shipped:
            return
        facts.shipped = True
        if after.launched is not None and after.launched is not before.launched:
            facts.launches.add(_forward(after.launched))
            self.launched.setdefault(before.spec_mode.value, set()).add(_forward(after.launched))
        if after.stage is Stage.SCHEDULE and after.running.size:
            self.resting_spec_info.setdefault(after.spec_mode.value, set()).add(after.running.spec_info.kind.value)
        # reads and writes from a sample of each action's transitions: the measurement, not the
        # exploration, is what costs time
        name = model.design.name
        if facts.probed.get(name, 0) < PERTURB_SAMPLES:
            facts.probed[name] = facts.probed.get(name, 0) + 1
            facts.writes |= {f for f, v in _effect(before, after).items() if v is not None}
            facts.reads |= _reads(model, before, action, after)


def _policy_kind(design: Design) -> str:
    return "adaptive" if isinstance(design.policy, AdaptiveTiers) else "threshold"


def observe(shipped: Sequence[Design] = SHIPPED + CANDIDATES, known_bad: Sequence[Design] = KNOWN_BAD,
            scope: Scope | None = None, max_states: int = EXPLORE_STATES) -> Observations:
    scope = scope or Scope()
    obs = Observations()
    for design in shipped:
        model = Model(design, scope)
        steps = obs.num_steps.setdefault(_policy_kind(design), set())
        for before, action, after in explore(model, max_states):
            obs.record(model, before, action, after, shipped=True)
            if action.name == "draft":
                steps.add(after.num_steps)
    for design in known_bad:
        model = Model(design, scope)
        result = check(model)
        steps_taken = tuple((s.action, s.state) for s in result.trace)
        obs.counterexamples[design.name] = (result.initial, steps_taken, result.violations)
        before = result.initial
        for action, after in steps_taken:
            assert before is not None
            obs.record(model, before, action, after, shipped=False)
            before = after
        if steps_taken and result.violations:
            last_action = steps_taken[-1][0].name
            for v in {v.invariant: v for v in result.violations}:
                obs.broken_at.setdefault(last_action, {}).setdefault(v, []).append(design.name)
    return obs


# ----------------------------------------------------------------------------------------------
# The machines


def edge_label(action: str) -> str:
    return f"{action} [{ACTIONS_BY_NAME[action].guard}]"


def _modes(spec_mode: ActionMode) -> tuple[str, ...]:
    return tuple(mode.value for mode in spec_mode.modes())


def _action_edges(obs: Observations) -> list[tuple[str, str, str, str, str, bool]]:
    """(mode, stage, action, mode after, stage after, from_catalogue) for every catalogue action."""
    out = []
    for info in ACTION_CATALOGUE:
        if info.overlap_only:
            continue  # the diagrams draw the scope without the overlap schedule
        for mode in _modes(info.spec_mode):
            for stage in info.stage_from:
                facts = obs.facts.get((mode, stage.value, info.name))
                if facts is not None:
                    out += [(mode, stage.value, info.name, m, s, False) for m, s in facts.targets]
                else:
                    out.append((mode, stage.value, info.name, mode, info.stage_to.value, True))
    return out


def _facts_lines(obs: Observations, mode: str, stage: str, action: str) -> tuple[str, ...]:
    facts = obs.facts.get((mode, stage, action))
    if facts is None:
        return ("(not reached within the exploration bound)",)
    lines = [] if facts.shipped else ["(taken only in a known-bad counterexample)"]
    if facts.reads:
        lines.append("reads: " + ", ".join(f for f in FIELDS if f in facts.reads))
    if facts.writes:
        lines.append("writes: " + ", ".join(f for f in FIELDS if f in facts.writes))
    if facts.launches:
        lines.append("launches: " + "; ".join(sorted(facts.launches)))
    broken = obs.broken_at.get(action, {})
    if broken:
        lines.append("known-bad designs break: " + ", ".join(sorted(broken)))
    return tuple(lines)


def _mode_title(mode: str) -> str:
    return f"spec {mode}"


def mode_level(obs: Observations) -> Graph:
    """spec on / spec off, the flips between them, each mode's own scheduler actions, and one
    summary loop per mode standing for its decode step (drawn in detail by `step_level`)."""
    edges = _action_edges(obs)
    steps = obs.num_steps
    on_steps = "; ".join(f"{kind} {', '.join(map(str, sorted(v)))}" for kind, v in sorted(steps.items()))
    nodes = []
    for mode in (ON, OFF):
        lines = []
        if mode == ON:
            lines.append(f"num_steps: {on_steps}")
        lines.append("forwards (forward_mode · spec_info):")
        lines += [f"  {f}" for f in sorted(obs.launched.get(mode, ()))]
        lines.append("ScheduleBatch spec_info at rest: " + " or ".join(sorted(obs.resting_spec_info.get(mode, ()))))
        nodes.append(Node(mode, _mode_title(mode), mode, tuple(lines)))
    out: list[Edge] = []
    for mode, stage, action, mode_to, stage_to, from_cat in edges:
        mode_specific = ACTIONS_BY_NAME[action].spec_mode is not ActionMode.ANY
        if stage == stage_to == Stage.SCHEDULE.value and (mode != mode_to or mode_specific):
            out.append(Edge(mode, mode_to, action, edge_label(action), mode, from_catalogue=from_cat))
    for mode in (ON, OFF):
        out.append(Edge(mode, mode, None, "one decode step (step diagram):", mode, _step_cycles(edges, mode)))
    return Graph("mode-level", "Mode-level machine: speculation on and off, and the flips", "machine",
                 tuple(nodes), tuple(out))


def _step_cycles(edges: list[tuple[str, str, str, str, str, bool]], mode: str) -> tuple[str, ...]:
    """The action chains from a resting state back to one, in this mode, e.g. 'a → b → c / d'."""
    chains: list[list[str]] = []

    def walk(stage: str, path: list[str]) -> None:
        for m, s, action, m_to, s_to, _ in edges:
            if m == mode and s == stage and m_to == mode and s_to != s and action not in path:
                if s_to == Stage.SCHEDULE.value:
                    chains.append(path + [action])
                else:
                    walk(s_to, path + [action])

    walk(Stage.SCHEDULE.value, [])
    merged: dict[tuple[str, ...], list[str]] = {}  # chains differing only in their last action share a line
    for chain in chains:
        merged.setdefault(tuple(chain[:-1]), []).append(chain[-1])
    return tuple(" → ".join([*prefix, " / ".join(lasts)]) for prefix, lasts in merged.items())


def step_level(obs: Observations, mode: str) -> Graph:
    """One decode step in this mode, stage by stage, with what each action reads, writes and launches."""
    edges = [e for e in _action_edges(obs) if e[0] == mode and e[3] == mode]
    stages = [s.value for s in Stage if any(s.value in (e[1], e[4]) for e in edges)]
    nodes = tuple(Node(f"{mode}_{s}", s, mode) for s in stages)
    out = []
    described: set[tuple[str, str]] = set()  # an action with two targets is described on its first edge
    for _, stage, action, _, stage_to, from_cat in edges:
        lines = () if (stage, action) in described else _facts_lines(obs, mode, stage, action)
        described.add((stage, action))
        out.append(Edge(f"{mode}_{stage}", f"{mode}_{stage_to}", action, edge_label(action), mode, lines,
                        from_catalogue=from_cat))
    return Graph(f"step-spec-{mode}", f"One step with speculation {mode}", "machine", nodes, tuple(out))


# ----------------------------------------------------------------------------------------------
# Paths: a shipped design's flip path, a known-bad design's counterexample


def flip_milestones(model: Model) -> tuple[str, ...]:
    """The `sometimes` properties a flip path passes, in order. Threshold designs: off, a plain step
    (and the draft sync, where the design has one), back on (and the draft catch-up, where the design
    has one; the retraction and the re-prefill, where it catches up by retraction), a draft again.
    Adaptive designs: a draft, a zero-step round, a draft again."""
    names = {s.name for s in model.sometimes()}
    if "flip_on" not in names:
        return ("draft_k_steps", "zero_step", "draft_k_steps")
    off = ("plain_decode", "draft_sync") if "draft_sync" in names else ("plain_decode",)
    on = ("flip_on", "draft_catch_up") if "draft_catch_up" in names else ("flip_on",)
    if "flip_on_retracts" in names:
        on = ("flip_on_retracts", "reprefill_with_draft")
    return ("flip_off", *off, *on, "draft_k_steps")


def flip_path(model: Model) -> tuple[State, tuple[tuple[Action, State], ...]]:
    """The shortest path through the design's flip milestones (the checker's search over state x milestone)."""
    holds: dict[str, Callable[[State, Action, State], bool]] = {s.name: s.holds for s in model.sometimes()}
    goals = [holds[name] for name in flip_milestones(model)]
    actions, next_state = model.actions, model.next_state

    def successors(node: tuple[State, int]) -> list[tuple[Action, tuple[State, int]]]:
        state, phase = node
        out = []
        for action in actions(state):
            after = next_state(state, action)
            out.append((action, (after, phase + 1 if goals[phase](state, action, after) else phase)))
        return out

    search = Search([(init, 0) for init in model.init_states()], successors)
    for _, _, node, new, _ in search.edges():
        if new and node[1] == len(goals):  # found, never expanded: no milestone is left to pass
            root, steps = search.path(node)
            return root[0], tuple((action, after) for action, (after, _) in steps)
    raise ValueError(f"{model.design.name}: no path through {flip_milestones(model)}")


def _initial_line(state: State) -> str:
    t = state.thresholds
    where = f"t_off={t.t_off}, t_on={t.t_on}" if t else f"num_steps={state.num_steps}"
    return f"initial state: {where}"


def path_graph(name: str, title: str, initial: State, steps: Sequence[tuple[Action, State]],
               violations: Sequence[Violation] = ()) -> Graph:
    """A path drawn over the mode-level machine: each step in the lane of the mode it ran in, the
    forward it launched, the last step red with the invariant it breaks."""
    nodes = [Node("s0", "0. " + _initial_line(initial), initial.spec_mode.value, lane=initial.spec_mode.value)]
    edges: list[Edge] = []
    before = initial
    broken = violations[0].invariant if violations else None
    for i, (action, after) in enumerate(steps, start=1):
        lines = []
        if after.launched is not None and after.launched is not before.launched:
            lines.append(f"launches {_forward(after.launched)}, out_cache_loc {after.launched.out_cache_loc_width}")
        if before.spec_mode is not after.spec_mode:
            lines.append(f"→ spec {after.spec_mode.value}")
        last = i == len(steps)
        violation = broken if last else None
        if last and violations:
            lines += [_wrap(v.describe()) for v in violations]
        mode = before.spec_mode.value
        nodes.append(Node(f"s{i}", f"{i}. {action.describe()}", mode, tuple(lines), violation, lane=mode))
        edges.append(Edge(f"s{i - 1}", f"s{i}", action.name, "", mode, violation=violation))
        before = after
    lanes = tuple((m, _mode_title(m)) for m in (ON, OFF) if any(n.lane == m for n in nodes))
    return Graph(name, title, "trace", tuple(nodes), tuple(edges), lanes)


def _wrap(text: str, width: int = 56) -> str:
    """Break a long line at spaces; renderers turn the newlines into line breaks."""
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Everything


def all_graphs(shipped: Sequence[Design] = SHIPPED + CANDIDATES, known_bad: Sequence[Design] = KNOWN_BAD,
               scope: Scope | None = None, obs: Observations | None = None) -> tuple[Graph, ...]:
    """Every diagram in docs/diagrams/, in a fixed order (`obs`: observations already made)."""
    scope = scope or Scope()
    obs = obs or observe(shipped, known_bad, scope)
    graphs = [mode_level(obs), step_level(obs, ON), step_level(obs, OFF)]
    for design in shipped:
        initial, steps = flip_path(Model(design, scope))
        graphs.append(path_graph(f"flip-{design.name}", f"{design.name} (shipped): its flip path", initial, steps))
    for design in known_bad:
        initial, steps, violations = obs.counterexamples[design.name]
        if initial is None or not violations:
            raise ValueError(f"{design.name} is not refuted within the scope: no counterexample to draw")
        graphs.append(path_graph(f"counterexample-{design.name}",
                                 f"{design.name} (known-bad): shortest counterexample", initial, steps, violations))
    return tuple(graphs)
