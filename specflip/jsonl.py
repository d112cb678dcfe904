"""Reading a JSON-lines file of objects for the offline tools (`specflip ranks` reads the switch's traces,
`specflip calibrate` the benchmark's rows): one reader, so each tool's bad input gets the same one-line errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def json_objects(path: str | Path, error: Callable[[str], Exception],
                 what: str = "a JSON object") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of `path`; `error(message)` is raised, naming the file and the
    line, for a file that cannot be read as text, a line that is not JSON, or one that is not an object (`what`
    names what a line must be)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise error(f"cannot read {path}: not a text file") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise error(f"{path}:{number}: {what} must be a JSON object, got {type(record).__name__}")
        yield number, record
