"""`ServerArgs` as `python -m sglang.launch_server argv` builds it, for `specflip lint`: one flow for every release
line (`build_server_args`), its two exceptions, the parser that raises instead of exiting, silencing SGLang while it
resolves, and one line for SGLang failing. A line says how it resolves (`ReleaseLine.resolve_server_args`), how it
checks an adaptive config and where resolved values live (`launch_view`). SGLang is imported only inside calls."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import logging
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

_STAND_INS = Path(__file__).resolve().parents[2] / "stand_ins" / "cpu"  # the repository's, beside shim/

# algorithms whose draft is a separate model: without --speculative-draft-model-path (which SGLang fills in
# itself only for targets that carry their draft layers, e.g. DeepSeek's MTP) the draft worker has nothing to load
NEEDS_DRAFT_MODEL = ("EAGLE", "EAGLE3", "STANDALONE")
# the launch flags SGLang resolves together: given partly, its resolution fails (an assert, or comparing None
# with an int)
SPEC_TRIPLE = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")


class LintInputError(Exception):
    """Bad launch arguments: one line, exit 2."""


class SGLangRefused(Exception):
    """SGLang's own resolution rejected the configuration (a finding, not an input error)."""


class RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise LintInputError(message)


def ensure_torchvision_importable() -> None:
    # sglang.srt.configs imports torchvision at module level; lint never calls it. Where it is not installed
    # (the CPU CI image), the repo's import-only stand-in satisfies the import.
    if importlib.util.find_spec("torchvision") is None and _STAND_INS.is_dir():
        sys.path.insert(0, str(_STAND_INS))


@contextlib.contextmanager
def quiet(verbose: bool = False) -> Iterator[None]:
    """SGLang's imports and resolution print warnings, deprecation notices and log lines (48-request cap, ...);
    lint prints its own lines only (`verbose`: let them through, on stderr). Python-level output is caught:
    logging off up to WARNING, warnings ignored, and what is printed to stdout/stderr meanwhile dropped."""
    if verbose:
        with contextlib.redirect_stdout(sys.stderr):  # lint's stdout stays lint's own lines
            yield
        return
    sink = io.StringIO()
    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            logging.disable(logging.NOTSET)


def silence_again(verbose: bool) -> None:
    """Inside `quiet`: SGLang's prepare_server_args re-configures logging, which lifts logging.disable."""
    if not verbose:
        logging.disable(logging.WARNING)


def sglang_failure(exc: BaseException, argv: Sequence[str], release: str) -> str:
    """One line for an exception out of SGLang's resolution: its message, and where in SGLang when the message
    alone does not say (a bare assert, a TypeError)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, (ValueError, NotImplementedError)) and text:
        return text
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "sglang" in f.filename]
    where = ""
    if frames:
        last = frames[-1]
        where = f" at sglang/{last.filename.split('/sglang/', 1)[-1]}:{last.lineno} ({last.name})"
    line = f"SGLang {release}'s resolution fails on these arguments: {type(exc).__name__}"
    line += f": {text}" if text else ""
    line += where + "; the server would not start either"
    given = [f for f in SPEC_TRIPLE if any(a == f or a.startswith(f + "=") for a in argv)]
    if given and len(given) < len(SPEC_TRIPLE):
        line += f". Give {', '.join(SPEC_TRIPLE)} together (or none of them); only {', '.join(given)} given"
    return line


def given_flag(argv: Sequence[str], flag: str) -> bool:
    """Whether a store_true launch flag was given (resolution may turn it off without a trace)."""
    return any(a == flag for a in argv)


def build_server_args(line: Any, argv: Sequence[str], *, verbose: bool = False) -> Any:
    """`ServerArgs` exactly as `python -m sglang.launch_server argv` builds it on `line` (a ReleaseLine), resolved.
    `verbose`: SGLang's log lines and warnings are shown (on stderr) instead of silenced."""
    ensure_torchvision_importable()
    with quiet(verbose):
        from sglang.srt.server_args import ServerArgs

        parser = RaisingParser(prog="sglang serve", add_help=False)
        ServerArgs.add_cli_args(parser)
        parsed = parser.parse_args(list(argv))  # unknown flags / bad values: one line, before SGLang exits
        if parsed.speculative_adaptive and parsed.speculative_adaptive_config:
            # a malformed file is bad input even where resolution will drop --speculative-adaptive
            line.check_adaptive_config(parsed.speculative_adaptive_config, parsed.speculative_num_steps or 0)
        try:
            server_args = line.resolve_server_args(list(argv), verbose)
        except (ValueError, NotImplementedError, AssertionError, TypeError, AttributeError, KeyError) as exc:
            # SGLang's own refusal, or its resolution failing on these arguments: the server would not start
            raise SGLangRefused(sglang_failure(exc, argv, line.version)) from None
        except OSError as exc:
            raise LintInputError(f"SGLang could not read the model configuration: {exc}") from None
        silence_again(verbose)
        cfg = line.launch_view(server_args)
        if cfg.speculative_algorithm in NEEDS_DRAFT_MODEL and not cfg.speculative_draft_model_path:
            raise LintInputError(f"--speculative-algorithm {cfg.speculative_algorithm} needs "
                                 "--speculative-draft-model-path (the draft model's directory or id)")
    return server_args


def check_tiered_adaptive_config(path: str) -> None:
    """SGLang's own validation of the adaptive tiers (`_load_adaptive_config`), its refusal as bad input."""
    from sglang.srt.speculative.adaptive_spec_params import _load_adaptive_config

    try:
        _load_adaptive_config(path)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise LintInputError(f"the adaptive config {path}: {str(exc).strip().splitlines()[0]}") from None
