"""Writing into a directory the user named, without losing anything specflip did not write.

`specflip diagram --out DIR` and `specflip check --reports-dir DIR` check the directory before their long work
(rendering, checking), so an unwritable path or a file of the user's in the way fails in a second with one
line, and never after minutes. A file counts as specflip's when specflip recorded writing it (a manifest in the
directory) or carries specflip's "generated" mark; anything else of the same name is the user's and stops the
command instead of being overwritten.
"""

from __future__ import annotations

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
