"""Writing into a directory or a file the user named, without losing anything specflip did not write.

`specflip diagram --out DIR` and `specflip check --reports-dir DIR` check the directory before their long work
(rendering, checking), and `specflip replay --out FILE` / `--save-schedules FILE` check the file before theirs
(minutes of requests to a server), so an unwritable path or a file of the user's in the way fails in a second
with one line, and never after minutes. A file counts as specflip's when specflip recorded writing it (a manifest
in the directory) or carries specflip's "generated" mark (in the file's own format: a Markdown line, an SVG
comment, a JSON field); anything else of the same name is the user's and stops the command instead of being
overwritten.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from specflip.errors import UsageError


def writable_dir(path: Path, what: str) -> Path:
    """`path` created if missing (parents too) and writable, or UsageError naming it."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{what} {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write into {what} {path}: permission denied")
    return path


def directory_argument(text: str, flag: str) -> Path:
    """The path a directory flag names; UsageError for an empty one (`Path("")` is the current directory, which
    the user did not name)."""
    if not text.strip():
        raise UsageError(f"{flag} is empty: name a directory")
    return Path(text)


def writable_file(text: str, what: str, is_ours: Callable[[Path], bool], flag: str) -> Path:
    """The path `flag` names (`text`), checked before the work: not empty, not a directory, its directory created if
    missing and writable, and no file there that specflip did not write (`is_ours`). UsageError naming it."""
    if not text.strip():
        raise UsageError(f"{flag} is empty: name a file")
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory: name a file in it")
    writable_dir(path.parent, f"directory of the {what}")
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise UsageError(f"{what} {path} exists and is not a regular file")
        if not is_ours(path):
            raise UsageError(f"{path} already exists and was not written by specflip; {flag} would overwrite it: "
                             "name another file or move that one")
    return path


def write_file(path: Path, text: str, what: str) -> None:
    """Write `text` to `path` through a temporary file beside it and a rename, so a failure (the disk full, a
    permission changed) leaves what was there; UsageError naming the file."""
    tmp = path.with_name(f".{path.name}.specflip-tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UsageError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def cache_dir(*names: str) -> Path:
    """specflip's cache directory ($XDG_CACHE_HOME/specflip, else ~/.cache/specflip), joined with `names`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base, "specflip", *names)


def refuse_foreign(directory: Path, names: Iterable[str], is_ours: Callable[[Path], bool], what: str) -> None:
    """UsageError if any of `names` exists in `directory` and is not specflip's (by `is_ours`)."""
    foreign = sorted(n for n in names if (directory / n).exists() and not is_ours(directory / n))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UsageError(f"{directory} already holds {shown}, not written by specflip; {what} would overwrite "
                         "it: choose an empty directory or move those files")


def has_mark(mark: str, head_bytes: int = 4096) -> Callable[[Path], bool]:
    """A file is specflip's when its first `head_bytes` carry `mark`."""

    def check(path: Path) -> bool:
        try:
            with open(path, "rb") as handle:
                return mark.encode() in handle.read(head_bytes)
        except OSError:
            return False

    return check


def read_manifest(path: Path) -> set[str]:
    """Names listed in a manifest specflip wrote (none when there is none)."""
    try:
        return {line.strip() for line in path.read_text().splitlines()
                if line.strip() and not line.startswith("#") and "/" not in line}
    except (OSError, UnicodeDecodeError):
        return set()


def write_files(directory: Path, files: dict[str, str], what: str) -> None:
    """Write each file, or UsageError with the first that failed (the disk full, a permission changed)."""
    for name, content in files.items():
        try:
            (directory / name).write_text(content)
        except OSError as exc:
            raise UsageError(f"cannot write {what} {directory / name}: {exc.strerror or exc}") from None
