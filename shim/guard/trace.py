"""The guard's trace: JSONL, one record per line, schema version TRACE_VERSION (docs/guard.md).

Record kinds, every one carrying `"v"` (the schema version), `"kind"` and `"rank"`:

* `header`: first line of a file. `release` (SGLang version), `design` (the reference design's name),
  `scope` (the model bounds the checks use), `rids` (request names by model index), `state` (a full
  model State).
* `step`: one model transition. `step` (number, from 1), `action` (an ACTION_CATALOGUE name), `args`,
  `where` (the hooked SGLang function), `new_rids` (names of requests appended by this step), `delta`
  (the fields of the State that changed: see `state_delta`), `violations` (what the guard found).
* `refine`: a second look at the state the last step produced (e.g. the verify batch as it launches);
  `step` repeats that step's number; `delta`, `violations` as above. Only state invariants apply.
* `compact`: finished requests dropped from the State; `keep` lists the old indices kept, in order.

`state_to_json` / `state_from_json` round-trip a `statemodel.state.State` exactly.
"""

from __future__ import annotations

import json
import operator
import os
import threading
from pathlib import Path
from typing import Any

import attrs

from statemodel.design import Scope
from statemodel.invariants import Violation
from statemodel.state import (
    Batch,
    ForwardMode,
    GraphShape,
    Request,
    SpecInfo,
    SpecInfoKind,
    SpecMode,
    Stage,
    State,
    Status,
    Thresholds,
    Unprocessed,
)

TRACE_VERSION = 1
RECORD_KINDS = ("header", "step", "refine", "compact")
# json.dumps(..., separators=(",", ":")) without building an encoder per record; records are trees
# of fresh dicts and lists, so the circular-reference check has nothing to find
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_TOP_FIELDS = ("running", "pending", "launched", "stage", "spec_mode", "num_steps", "kv_free", "kv_pool_size",
               "thresholds", "unprocessed", "prefix_cache")
# fields a trace written before they existed leaves out: their value then
_TOP_DEFAULTS: dict[str, Any] = {"unprocessed": [], "prefix_cache": []}


class TraceFormatError(ValueError):
    """A trace line that is not a valid record: names the file and the line."""

    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


# --- State <-> JSON -----------------------------------------------------------------------------------


def batch_to_json(batch: Batch | None) -> dict[str, Any] | None:
    if batch is None:
        return None
    return {
        "rids": list(batch.rids),
        "forward_mode": batch.forward_mode.value,
        "spec_info": [batch.spec_info.kind.value, batch.spec_info.rows, batch.spec_info.tokens_per_row],
        "spec_algorithm_on": batch.spec_algorithm_on,
        "out_cache_loc_width": batch.out_cache_loc_width,
        "graph": None if batch.graph is None else [batch.graph.batch_bucket, batch.graph.tokens_per_req],
        "extend_tokens": batch.extend_tokens,
    }


def batch_from_json(data: dict[str, Any] | None) -> Batch | None:
    if data is None:
        return None
    kind, rows, per_row = data["spec_info"]
    graph = data["graph"]
    return Batch(
        rids=tuple(int(r) for r in data["rids"]),
        forward_mode=ForwardMode(data["forward_mode"]),
        spec_info=SpecInfo(SpecInfoKind(kind), int(rows), int(per_row)),
        spec_algorithm_on=bool(data["spec_algorithm_on"]),
        out_cache_loc_width=int(data["out_cache_loc_width"]),
        graph=None if graph is None else GraphShape(int(graph[0]), int(graph[1])),
        extend_tokens=int(data["extend_tokens"]),
    )


_REQUEST_NAMES = Request._fields
_request_values = operator.attrgetter(*_REQUEST_NAMES)


def request_to_json(r: Request) -> dict[str, Any]:
    # attrs.asdict's output (the fields are scalars), at a third of its cost: a trace step holds a
    # record for every request the step changed
    data = dict(zip(_REQUEST_NAMES, _request_values(r), strict=True))
    data["status"] = r.status.value
    return data


# request_to_json's JSON text, formatted directly (a third of the cost of building the dict and
# encoding it). Every field is an int except status (an enum value: a plain word) and the one bool.
_REQUEST_JSON = ('{"rid":%d,"prompt_len":%d,"max_new_tokens":%d,"status":"%s","prefilled_len":%d,"seq_len":%d,'
                 '"committed":%d,"kv_held":%d,"kv_reserved":%d,"draft_kv_len":%d,"draft_hidden_ready":%s,'
                 '"cached_len":%d}')
if _REQUEST_NAMES != ("rid", "prompt_len", "max_new_tokens", "status", "prefilled_len", "seq_len", "committed",
                      "kv_held", "kv_reserved", "draft_kv_len", "draft_hidden_ready", "cached_len"):
    raise ImportError("shim.guard.trace: statemodel.state.Request's fields changed; update _REQUEST_JSON")


def request_json_text(r: Request) -> str:
    """The JSON text of `request_to_json(r)`."""
    return _REQUEST_JSON % (r.rid, r.prompt_len, r.max_new_tokens, r.status.value, r.prefilled_len, r.seq_len,
                            r.committed, r.kv_held, r.kv_reserved, r.draft_kv_len,
                            "true" if r.draft_hidden_ready else "false", r.cached_len)


def request_from_json(data: dict[str, Any]) -> Request:
    fields = dict(data)
    fields["status"] = Status(fields["status"])
    return Request(**fields)


def _top_to_json(state: State, name: str) -> Any:
    value = getattr(state, name)
    if name in ("running", "pending", "launched"):
        return batch_to_json(value)
    if name in ("stage", "spec_mode"):
        return value.value
    if name == "thresholds":
        return None if value is None else [value.t_off, value.t_on]
    if name == "unprocessed":  # overlap schedule: [rids, steps (null: plain), draft_extended] per queued result,
        # and true last for a plain step whose slot is the v2 reserve's (Unprocessed.reserve_slot)
        # then the retracted requests it still applies to (Unprocessed.applies_to_retracted), when there are any
        return [[list(u.rids), u.steps, u.draft_extended,
                 *([u.reserve_slot, list(u.applies_to_retracted)] if u.applies_to_retracted
                   else [True] if u.reserve_slot else [])] for u in value]
    if name == "prefix_cache":  # radix cache: per cached token, whether its draft KV was written
        return list(value)
    return value


def _top_from_json(name: str, value: Any) -> Any:
    if name in ("running", "pending", "launched"):
        return batch_from_json(value)
    if name == "stage":
        return Stage(value)
    if name == "spec_mode":
        return SpecMode(value)
    if name == "thresholds":
        return None if value is None else Thresholds(int(value[0]), int(value[1]))
    if name == "unprocessed":
        return tuple(Unprocessed(tuple(int(r) for r in rids), None if steps is None else int(steps), bool(extended),
                                 bool(rest and rest[0]), tuple(int(r) for r in rest[1]) if len(rest) > 1 else ())
                     for rids, steps, extended, *rest in value)
    if name == "prefix_cache":
        return tuple(bool(x) for x in value)
    return int(value)


def state_to_json(state: State) -> dict[str, Any]:
    data: dict[str, Any] = {name: _top_to_json(state, name) for name in _TOP_FIELDS}
    data["requests"] = [request_to_json(r) for r in state.requests]
    return data


def state_from_json(data: dict[str, Any]) -> State:
    fields = {name: _top_from_json(name, data[name] if name in data else _TOP_DEFAULTS[name]) for name in _TOP_FIELDS}
    return State(requests=tuple(request_from_json(r) for r in data["requests"]), **fields)


def _delta_parts(before: State, after: State) -> tuple[dict[str, Any], list[tuple[int, Request]], int | None]:
    """(top-level fields that differ, as JSON values; requests that differ or are new, by index; the
    new request count when it changed)."""
    top: dict[str, Any] = {}
    for name in _TOP_FIELDS:
        if getattr(before, name) != getattr(after, name):
            top[name] = _top_to_json(after, name)
    old = before.requests
    count = len(old)
    # identity first: most requests of a step are the very objects of the state before it
    changed = [(i, r) for i, r in enumerate(after.requests) if i >= count or (old[i] is not r and old[i] != r)]
    return top, changed, len(after.requests) if len(after.requests) != count else None


def state_delta(before: State, after: State) -> dict[str, Any]:
    """What changed: top-level fields that differ, requests (by index) that differ or are new, and
    `n_requests` whenever the request count changed."""
    delta, changed, count = _delta_parts(before, after)
    if changed:
        delta["requests"] = {str(i): request_to_json(r) for i, r in changed}
    if count is not None:
        delta["n_requests"] = count
    return delta


class JsonText(str):
    """JSON already encoded: `TraceWriter.write` puts it into the record as it is."""


def state_delta_json(before: State, after: State) -> JsonText:
    """`state_delta(before, after)` as the JSON text the writer would make of it, built directly: the
    guard's hot path in trace mode (a decode step changes every request of the batch)."""
    top, changed, count = _delta_parts(before, after)
    parts = [f"{_ENCODER.encode(name)}:{_ENCODER.encode(value)}" for name, value in top.items()]
    if changed:
        parts.append('"requests":{' + ",".join([f'"{i}":{request_json_text(r)}' for i, r in changed]) + "}")
    if count is not None:
        parts.append(f'"n_requests":{count}')
    return JsonText("{" + ",".join(parts) + "}")


def apply_delta(state: State, delta: dict[str, Any]) -> State:
    """The State `state_delta(state, after)` was computed against, moved to `after`."""
    fields = {name: _top_from_json(name, delta[name]) for name in _TOP_FIELDS if name in delta}
    requests = list(state.requests)
    count = int(delta.get("n_requests", len(requests)))
    if count < len(requests):
        raise ValueError(f"a step delta may only add requests ({len(requests)} -> {count}); compaction is a record")
    requests.extend([None] * (count - len(requests)))  # type: ignore[list-item]
    for key, value in delta.get("requests", {}).items():
        index = int(key)
        if not 0 <= index < count:
            raise ValueError(f"request index {index} outside 0..{count - 1}")
        requests[index] = request_from_json(value)
    if any(r is None for r in requests):
        raise ValueError("a new request index has no request record")
    return attrs.evolve(state, requests=tuple(requests), **fields)


def compact_state(state: State, keep: list[int]) -> State:
    """Drop every request not in `keep` (old indices, ascending) and renumber the rest from 0."""
    renumber = {old: new for new, old in enumerate(keep)}

    def batch(b: Batch | None) -> Batch | None:
        if b is None:
            return None
        return attrs.evolve(b, rids=tuple(renumber[r] for r in b.rids))

    requests = tuple(state.requests[old]._replace(rid=new) for new, old in enumerate(keep))
    unprocessed = tuple(attrs.evolve(u, rids=tuple(renumber[r] for r in u.rids), applies_to_retracted=tuple(
        renumber[r] for r in u.applies_to_retracted)) for u in state.unprocessed)
    return attrs.evolve(state, requests=requests, running=batch(state.running), pending=batch(state.pending),
                        launched=batch(state.launched), unprocessed=unprocessed)


def scope_to_json(scope: Scope) -> dict[str, Any]:
    return {"kv_pool_size": scope.kv_pool_size, "spec_cap": scope.spec_cap, "plain_cap": scope.plain_cap,
            "chunk_size": scope.chunk_size, "graph_capture_sizes": list(scope.graph_capture_sizes),
            "overlap": scope.overlap}


def scope_from_json(data: dict[str, Any]) -> Scope:
    return Scope(requests=(), kv_pool_size=int(data["kv_pool_size"]), spec_cap=int(data["spec_cap"]),
                 plain_cap=int(data["plain_cap"]), chunk_size=int(data["chunk_size"]),
                 graph_capture_sizes=tuple(int(x) for x in data["graph_capture_sizes"]),
                 overlap=bool(data.get("overlap", False)))


def violation_to_json(v: Violation, names: list[str]) -> dict[str, Any]:
    return {"invariant": v.invariant, "message": v.message, "rids": [rid_name(names, r) for r in v.rids],
            "expected": v.expected, "actual": v.actual}


def rid_name(names: list[str], index: int) -> str:
    return names[index] if 0 <= index < len(names) else f"#{index}"


# --- writing and reading ------------------------------------------------------------------------------


def _encode_record(record: dict[str, Any]) -> str:
    """One record as a JSON line; a `JsonText` value goes in as it is."""
    if not any(isinstance(value, JsonText) for value in record.values()):
        return _ENCODER.encode(record)
    return "{" + ",".join(
        f"{_ENCODER.encode(key)}:{value if isinstance(value, JsonText) else _ENCODER.encode(value)}"
        for key, value in record.items()
    ) + "}"


class TraceWriter:
    """Appends records to one JSONL file, flushed per record so a crash leaves every finished line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the process
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = _encode_record({"v": TRACE_VERSION, **record})
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def trace_path_for(template: str, rank: int) -> str:
    """SPECFLIP_TRACE may name `{rank}` and `{pid}`; without `{rank}` each rank past 0 gets `.rankN`."""
    path = template.replace("{rank}", str(rank)).replace("{pid}", str(os.getpid()))
    if "{rank}" not in template and rank:
        stem, dot, ext = path.rpartition(".")
        path = f"{stem}.rank{rank}.{ext}" if dot else f"{path}.rank{rank}"
    return path
