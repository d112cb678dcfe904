"""Reading a guard trace (shim/guard/trace.py writes it; the record format lives there): the offline side, for
`specflip explain` and `specflip ranks`. Every malformed line is a TraceFormatError naming it."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from shim.guard.trace import RECORD_KINDS, TRACE_VERSION, TraceFormatError

_REQUIRED = {
    "header": ("rank", "release", "design", "scope", "rids", "state"),
    "step": ("rank", "step", "action", "args", "delta", "new_rids", "violations"),
    "refine": ("rank", "step", "delta", "violations"),
    "compact": ("rank", "keep"),
}


# the type each record field must have (JSON types); a field of another type is a malformed record
_FIELD_TYPES: dict[str, type] = {
    "rank": int, "step": int, "action": str, "args": list, "delta": dict, "new_rids": list, "violations": list,
    "keep": list, "release": str, "design": str, "scope": dict, "rids": list, "state": dict,
}
_GZIP_MAGIC = b"\x1f\x8b"
SWITCH_TRACE_NOTE = ("this is a switch trace (shim/switch/v2.py, SPECFLIP_SWITCH_TRACE), not a guard trace: "
                     "`specflip replay --recorded REPORT --trace-dir DIR` checks switch traces; explain reads the "
                     "guard's traces (SPECFLIP_MODE=trace)")


def _open_trace(path: str | Path) -> IO[str]:
    """The trace as text; a gzipped trace (by its magic bytes, whatever its name) is read through gzip."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == _GZIP_MAGIC
    if gzipped:
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")  # noqa: SIM115 - closed by the caller's with


def _lines(handle: IO[str], name: str) -> Iterator[tuple[int, str]]:
    """(line number, line); a decoding or decompression failure is a TraceFormatError at the line it hit."""
    number = 0
    iterator = iter(handle)
    while True:
        try:
            line = next(iterator)
        except StopIteration:
            return
        except UnicodeDecodeError:
            raise TraceFormatError(name, number + 1, "not UTF-8 text: not a guard trace (JSONL, or JSONL.gz)") from None
        except (EOFError, OSError, zlib.error) as exc:  # gzip: truncated or corrupt stream
            raise TraceFormatError(name, number + 1, f"the gzip stream breaks here ({exc})") from None
        number += 1
        yield number, line


def _field_type_problem(kind: str, record: dict[str, Any]) -> str | None:
    for field in _REQUIRED[kind]:
        want = _FIELD_TYPES.get(field)
        value = record[field]
        if want is not None and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
            names = {int: "an integer", str: "a string", list: "a list", dict: "an object"}
            shown = json.dumps(value)[:40]
            return f"{kind} record: {field!r} is {type(value).__name__} {shown}, expected {names[want]}"
    return None


def read_records(path: str | Path, *,
                 breaks: list[TraceFormatError] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each line; TraceFormatError naming the line for anything malformed.

    `breaks`: a list to collect the first problem after the header in, instead of raising it; the records
    before it are yielded (a trace cut short by a crash is read up to where it breaks)."""
    name = str(path)
    try:
        handle = _open_trace(path)
    except OSError as exc:
        raise TraceFormatError(name, 0, f"cannot open: {exc.strerror or exc}") from None
    with handle:
        saw_any = False
        try:
            for number, line in _lines(handle, name):
                if not line.strip():
                    continue
                if not line.endswith("\n"):
                    raise TraceFormatError(name, number,
                                           "truncated record (no end of line): the writer stopped mid-line")
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceFormatError(name, number, f"not JSON ({exc.msg} at column {exc.colno})") from None
                if not isinstance(record, dict):
                    raise TraceFormatError(name, number, "a record must be a JSON object")
                version = record.get("v")
                if not saw_any and version is None and "action" in record and "t" in record:
                    raise TraceFormatError(name, number, SWITCH_TRACE_NOTE)
                if version != TRACE_VERSION:
                    raise TraceFormatError(name, number,
                                           f"schema version {version!r}; this reader knows {TRACE_VERSION}")
                kind = record.get("kind")
                if kind not in _REQUIRED:
                    raise TraceFormatError(name, number,
                                           f"unknown record kind {kind!r}; known: {', '.join(RECORD_KINDS)}")
                if not saw_any and kind != "header":
                    raise TraceFormatError(name, number, f"first record is {kind!r}; a trace starts with a header")
                missing = [f for f in _REQUIRED[kind] if f not in record]
                if missing:
                    raise TraceFormatError(name, number, f"{kind} record lacks {', '.join(missing)}")
                problem = _field_type_problem(kind, record)
                if problem is not None:
                    raise TraceFormatError(name, number, problem)
                saw_any = True
                yield number, record
        except TraceFormatError as exc:
            if breaks is None or not saw_any:
                raise
            breaks.append(exc)
            return
        if not saw_any:
            raise TraceFormatError(name, 0, "empty trace (no header)")
