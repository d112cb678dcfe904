"""The launching process of `python -m sglang.launch_server`, on the SGLang line installed in this interpreter, as far
as a CPU goes: run by tests/test_release_conformance.py in a fresh interpreter per launch (load_plugins() and the
hooks it applies are once per process).

`python tests/launch_probe.py MODEL_DIR [FLAG ...]` runs what the line's `sglang/launch_server.py` runs as
`__main__` (load_plugins(), which calls specflip's entry point as the SPECFLIP_* variables of the environment say;
prepare_server_args(argv)), then what the line's `http_server.launch_server` runs first: `Engine._launch_subprocesses`
(the line's resolution, its check_server_args with specflip's hooks, its publication of the config where the line
publishes it), up to `PortArgs.init_new`, the first step that prepares the processes a CPU cannot run. In its place
the probe reads the warm-up list as the line's HTTP server will read it and stops the launch: the expression that
the line's http_server tests with `if <expr>.warmups is not None`, evaluated with `server_args` the launch's and the
other names bound as that module's own imports bind them (its source is read, not imported: the HTTP server's
own packages, uvloop, jsonschema, ..., are not on the CPU image; the launch reaches it only after PortArgs).

It prints one JSON line: {"warmups": the list read, "read_as": the expression} when the launch got there, or
{"exit": SystemExit's message} / {"error": the exception and its last frames}.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
import sys
import traceback
from pathlib import Path
from typing import Any

MARK = "LAUNCH-PROBE "
REPO = Path(__file__).resolve().parents[1]


class _ReachedPortArgs(Exception):
    """The launch got to PortArgs.init_new: everything before it ran."""


def _http_server_reading() -> tuple[str, dict[str, Any]]:
    """(the expression the line's http_server reads the warm-up list through, its names as the module imports them)."""
    spec = importlib.util.find_spec("sglang.srt.entrypoints.http_server")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text()
    found = re.search(r"if ([\w().]+)\.warmups is not None", source)
    if found is None:
        raise AssertionError("the line's http_server reads no `<expr>.warmups`")
    expr = found.group(1)
    root = re.match(r"\w+", expr).group(0)  # type: ignore[union-attr]
    names: dict[str, Any] = {}
    if root != "server_args":
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if (alias.asname or alias.name) == root:
                        names[root] = getattr(importlib.import_module(node.module), alias.name)
        if root not in names:
            raise AssertionError(f"the line's http_server reads `{expr}.warmups`, and imports no `{root}`")
    return expr, names


def _not_reached(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the launch went past PortArgs.init_new")


def main(argv: list[str]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "tests"))
    __import__("line_imports").import_tp_worker_or_stand_ins()
    from sglang.srt.server_args import PortArgs

    reading: dict[str, Any] = {}

    expr, names = _http_server_reading()

    def init_new_probe(server_args: Any, *args: Any, **kwargs: Any) -> Any:
        value = eval(f"{expr}.warmups", {}, {**names, "server_args": server_args})  # noqa: S307 - the line's own
        reading.update(read_as=expr, warmups=value)
        raise _ReachedPortArgs

    PortArgs.init_new = staticmethod(init_new_probe)  # type: ignore[method-assign]
    try:
        from sglang.srt.entrypoints.engine import Engine
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import prepare_server_args

        load_plugins()  # launch_server.py's __main__
        server_args = prepare_server_args(argv)
        Engine._launch_subprocesses(server_args=server_args, init_tokenizer_manager_func=_not_reached,
                                    run_scheduler_process_func=_not_reached, run_detokenizer_process_func=_not_reached)
    except _ReachedPortArgs:
        return reading
    except SystemExit as exc:
        return {"exit": str(exc.code)}
    except BaseException as exc:  # noqa: BLE001 - reported to the test, which fails on it
        return {"error": "".join(traceback.format_exception(exc)[-6:])}
    return {"error": "the launch returned without reaching PortArgs.init_new"}


if __name__ == "__main__":
    model = sys.argv[1]
    launch = ["--model-path", model, "--speculative-draft-model-path", model, "--device", "cuda",
              "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4", "--max-running-requests", "24", *sys.argv[2:]]
    print(MARK + json.dumps(main(launch)), flush=True)
