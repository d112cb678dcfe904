"""The one error every `specflip` command raises for bad usage or input: `specflip.cli.main` prints it as one
line on stderr and exits 2 (README, "Exit codes")."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one clear line, exit 2."""
