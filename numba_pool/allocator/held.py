"""The later-queue of things held until a condition ends (:class:`Held`), beside :class:`~.release.Pending`."""

from __future__ import annotations

from typing import Callable, Iterator


class Held:
    """Things held until a condition ends, keyed by a block (or by themselves), taken oldest first.  Atomic
    operations only: finalizers keep and let go in any thread; two takers at once never take one thing twice."""

    __slots__ = ("_kept",)

    def __init__(self):
        self._kept: dict = {}  # key -> what; insertion order is age

    def keep(self, what, key=None) -> None:
        self._kept[what if key is None else key] = what

    def let_go(self, key):
        """What was held under ``key``, no longer held; None when it was not (or was taken)."""
        return self._kept.pop(key, None)

    def drain(self, go_on: Callable[[], bool] | None = None) -> Iterator:
        """Take what is held, oldest first (also what is kept meanwhile), while ``go_on()``."""
        kept = self._kept
        while kept:
            for key in list(kept):  # one snapshot: popping the first key each time rescans the deleted ones
                if go_on is not None and not go_on():
                    return
                what = kept.pop(key, None)
                if what is not None:
                    yield what

    def take(self) -> list:
        return list(self.drain())

    def keys(self) -> list:
        return list(self._kept.copy())  # a copy: finalizers change it

    def values(self) -> list:
        return list(self._kept.copy().values())

    def __len__(self) -> int:
        return len(self._kept)
