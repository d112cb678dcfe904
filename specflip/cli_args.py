"""argparse pieces for specflip's commands and its bench scripts: a parser whose usage errors are one line (exit 2),
and value types that refuse a bad value while the flags are parsed, never with a traceback later.

Standard library only: the bench clients import it on the GPU host, beside SGLang's own environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its usage errors as one line (exit 2) instead of the usage text and the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An integer no less than `minimum` (and no more than `maximum`, when given)."""

    def parse(text: str) -> int:
        value = integer(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, got {text}")
        return value

    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_float(text: str) -> float:
    value = number(text)
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def number_between(minimum: float, maximum: float) -> Callable[[str], float]:
    """A number in [minimum, maximum] (nan and the infinities refused)."""

    def parse(text: str) -> float:
        value = number(text)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be from {minimum:g} to {maximum:g}, got {text}")
        return value

    return parse


def fraction_below_1(text: str) -> float:
    """A number in [0, 1): a share that must leave something (a spread of lengths around a mean)."""
    value = non_negative_float(text)
    if not value < 1:
        raise argparse.ArgumentTypeError(f"must be below 1, got {value}")
    return value


def int_list(minimum: int = 1) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, each at least `minimum` ("1,4,16"); "" is none."""
    item = at_least(minimum)

    def parse(text: str) -> tuple[int, ...]:
        return tuple(item(part.strip()) for part in text.split(",") if part.strip())

    return parse


def positive_float_list(text: str) -> tuple[float, ...]:
    """Comma-separated numbers above 0 ("2,40,8"); at least one."""
    values = tuple(positive_float(part.strip()) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one number")
    return values


def http_url(text: str) -> str:
    from urllib.parse import urlsplit  # only where a URL is given: lint's cached run takes ~0.1 s

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r} (e.g. http://127.0.0.1:30000)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r} ({exc})") from None
    return text
