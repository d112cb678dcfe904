"""Save-swap-restore in one object: both switches point SGLang objects at the plain side (a decode graph
runner, an attention backend, spec_algorithm NONE, ...) and later put back exactly what was there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_ABSENT = object()  # the attribute did not exist before the swap: restore deletes it


class AttributeSwap:
    """Attributes set on objects with the values they held, restored in reverse order.

    Used across scheduler iterations (the plain path: `enter_plain_path` swaps, `enter_spec_path` restores) and
    around one call (`with AttributeSwap.around(...)`)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def __bool__(self) -> bool:
        """Whether something is swapped out."""
        return bool(self._saved)

    def set(self, obj: Any, name: str, value: Any) -> None:
        """`obj.name = value`, remembering the value it held (only the first one, if set twice)."""
        if not any(o is obj and n == name for o, n, _ in self._saved):
            self._saved.append((obj, name, getattr(obj, name, _ABSENT)))
        setattr(obj, name, value)

    def saved(self, obj: Any, name: str, default: Any = None) -> Any:
        """The value `obj.name` held before the swap; `default` when it is not swapped out."""
        return next((old for o, n, old in self._saved if o is obj and n == name), default)

    def restore(self, keep: tuple[tuple[Any, str], ...] = ()) -> None:
        """Put every swapped attribute back, except those in `keep` ((obj, name) pairs, left as swapped)."""
        for obj, name, old in reversed(self._saved):
            if any(o is obj and n == name for o, n in keep):
                continue
            if old is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self._saved = []

    @classmethod
    @contextmanager
    def around(cls, *changes: tuple[Any, str, Any]) -> Iterator[AttributeSwap]:
        """Set each (obj, name, value) for the duration of the block; restored on exit, exception or not."""
        swap = cls()
        try:
            for obj, name, value in changes:
                swap.set(obj, name, value)
            yield swap
        finally:
            swap.restore()


def plain_runner_side(rt: Any, model_runner: Any, runner_attr: str, no_speculation: Any) -> list[tuple[Any, str, Any]]:
    """The (obj, name, value) changes that point the target's model runner at the plain side for one step: the
    plain decode graph runner (`runner_attr`: `decode_cuda_graph_runner` on v2, `graph_runner` on v1; None: eager),
    the plain attention backend when one was made, and spec_algorithm NONE (`no_speculation`)."""
    changes = [(model_runner, runner_attr, rt.plain_runner)]
    if rt.plain_attn_backend is not None:
        changes.append((model_runner, "attn_backend", rt.plain_attn_backend))
    changes.append((model_runner, "spec_algorithm", no_speculation))
    return changes
