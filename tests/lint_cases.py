"""Issue 21's bad inputs for `specflip lint`, one table for every release line (not a test module: pytest collects
``test_*.py`` only). tests/test_lint_bad_input.py runs it on 0.5.23 (in process) and 0.5.16 (its source under the
CPU import stand-ins, in one subprocess), tests/test_lint_v1.py on 0.5.12 (.venv12).

Each case is the CLI's argv after the model flags, and what it must do on a line: the exit code and words that
its one line holds (on stderr for exit 2, which prints nothing on stdout; on stdout otherwise, with nothing on
stderr). Launch values are given as a whole triple (steps 3, topk 1, draft tokens 4) unless the case is about one
of them, so that every line resolves the rest the same way (0.5.12 would otherwise default topk to 4 and drop
--speculative-adaptive before it reads the adaptive config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRIPLE = {"--speculative-num-steps": "3", "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "4"}
LINES = ("0.5.23", "0.5.16", "0.5.12")

# (flag, value, what SGLang does with it on every line here, as lint's line says)
BAD_VALUES: list[tuple[str, str, str]] = [
    ("--speculative-num-steps", "0", "would run with 0 as given"),
    ("--speculative-num-steps", "-1", "would run with -1 as given"),
    ("--speculative-num-draft-tokens", "0", "would silently run 4"),
    ("--speculative-num-draft-tokens", "-2", "would silently run 4"),
    ("--speculative-eagle-topk", "0", "would run with 0 as given"),
    ("--speculative-eagle-topk", "-1", "would run with -1 as given"),
    ("--max-running-requests", "0", "would run with 0 as given"),
    ("--max-running-requests", "-3", "would run with -3 as given"),
]

# (id, file content: text, bytes, None for a missing file, "DIR" for a directory; {line: (exit, words)}, with
# "*" for every line not named)
TIERS: list[tuple[str, Any, dict[str, tuple[int, tuple[str, ...]]]]] = [
    ("array", "[1, 2]", {"*": (2, ("must be a JSON object of batch-size tiers", "not an array"))}),
    ("tier null", '{"1": null}', {"*": (2, ("tier '1' must be an object with candidate_steps, not null",))}),
    ("second tier null", '{"1": {"candidate_steps": [1, 3]}, "8": null}',
     {"*": (2, ("tier '8' must be an object with candidate_steps, not null",))}),
    ("empty object", "{}", {"*": (2, ("at least one integer-string BS key",)),
                            # 0.5.12 reads one flat object, every key optional: {} is its defaults
                            "0.5.12": (0, ("ok: sglang 0.5.12", "steps [1, 3, 7]"))}),
    ("string", '"x"', {"*": (2, ("not a string",))}),
    ("number", "12", {"*": (2, ("not a number",))}),
    ("json null", "null", {"*": (2, ("not null",))}),
    ("tier without candidate_steps", '{"1": {}}', {"*": (2, ("candidate_steps must be a", "1"))}),
    ("nested garbage", '{"1": {"candidate_steps": [[1], {"a": 2}]}}', {"*": (2, ("candidate_steps must be a",))}),
    ("deeper garbage", '{"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, {"x": [null]}]}}',
     {"*": (2, ("candidate_steps must be a", "8"))}),
    ("booleans", '{"1": {"candidate_steps": [true, 3]}}', {"*": (2, ("must be JSON integers, not booleans",))}),
    ("fractions", '{"1": {"candidate_steps": [1.5, 3]}}', {"*": (2, ("candidate_steps must be a",))}),
    ("not JSON", "not json {", {"*": (2, ("is not JSON",))}),
    ("not text", b"\xff\xfe\x00", {"*": (2, ("is not text",))}),
    ("missing file", None, {"*": (2, ("cannot read the adaptive config", "No such file"))}),
    ("a directory", "DIR", {"*": (2, ("cannot read the adaptive config", "Is a directory"))}),
]


def write_tiers(directory: Path, case_id: str, content: Any) -> str:
    """The path a tiers case names, written under `directory` (nothing for a missing file)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (case_id.replace(" ", "_") + ".json")
    if content == "DIR":
        path.mkdir(parents=True, exist_ok=True)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    return str(path)


def cases(model: str, directory: Path, *, write: bool = True) -> list[tuple[str, list[str],
                                                                           dict[str, tuple[int, tuple[str, ...]]]]]:
    """Every case: (id, the CLI argv, {line: (exit, words)}). `model`: a config.json directory (target and draft);
    `write`: write the tiers files under `directory` (False: the ids and argvs only)."""
    base = ["lint", "--no-cache", "--model-path", model, "--speculative-draft-model-path", model,
            "--speculative-algorithm", "EAGLE"]
    out = []
    for flag, value, what in BAD_VALUES:
        given = {**TRIPLE, flag: value}
        argv = [*base, *(x for kv in given.items() for x in kv)]
        out.append((f"{flag} {value}", argv, {line: (2, (f"{flag} {value}: must be at least 1; SGLang {line} {what}",))
                                               for line in LINES}))
    rewrite = [*base, *(x for kv in {**TRIPLE, "--speculative-num-draft-tokens": "9"}.items() for x in kv)]
    note = "note: --speculative-num-draft-tokens 9 is not what runs: SGLang {} replaces it with 4"
    out.append(("draft tokens 9 rewritten", rewrite, {line: (0, (note.format(line),)) for line in LINES}))
    for algorithm in ("EAGLE", "EAGLE3"):
        argv = ["lint", "--no-cache", "--model-path", model, "--speculative-algorithm", algorithm,
                *(x for kv in TRIPLE.items() for x in kv)]
        out.append((f"{algorithm} without a draft model", argv, {line: (2, (
            f"--speculative-algorithm {algorithm} needs --speculative-draft-model-path",)) for line in LINES}))
    for case_id, content, want in TIERS:
        path = write_tiers(directory, case_id, content) if write else str(directory / case_id)
        argv = [*base, *(x for kv in TRIPLE.items() for x in kv), "--speculative-adaptive",
                "--speculative-adaptive-config", path]
        out.append((f"tiers: {case_id}", argv, {line: want.get(line, want["*"]) for line in LINES}))
    return out


def verdict(line: str, want: dict[str, tuple[int, tuple[str, ...]]], code: Any, out: str, err: str) -> str | None:
    """Why one run does not do what the table says on `line`, or None."""
    code_wanted, words = want[line]
    err_lines = [s for s in err.splitlines() if s.strip()]
    out_lines = [s for s in out.splitlines() if s.strip()]
    if code != code_wanted:
        return f"exit {code}, wanted {code_wanted}: stdout {out_lines}, stderr {err_lines[-5:]}"
    if code == 2:
        if out_lines or len(err_lines) != 1:
            return f"exit 2 must print one line on stderr and nothing on stdout: {out_lines}, {err_lines[-5:]}"
        text = err_lines[0]
        if not text.startswith("specflip lint: "):
            return f"not lint's line: {text}"
    else:
        if err_lines:
            return f"stderr must stay empty: {err_lines[-5:]}"
        text = "\n".join(out_lines)
    missing = [w for w in words if w not in text]
    return f"missing {missing} in {text!r}" if missing else None


# Runs in a subprocess on a release line that cannot be imported into the test's own process (0.5.16's source):
# every case's argv through the CLI's main() in one process, each one's exit code, stdout and stderr (or the
# traceback that escaped) written as JSON to argv[1].
DRIVER = """
import contextlib, io, json, sys, traceback
from specflip.cli import main
results = []
for argv in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except BaseException as exc:
        code = "raised"
        err.write("".join(traceback.format_exception(exc)))
    results.append({"code": code, "out": out.getvalue(), "err": err.getvalue()})
with open(sys.argv[1], "w") as f:
    json.dump(results, f)
"""
