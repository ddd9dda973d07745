"""The later-queue of things held until a condition ends (:class:`Held`), beside
:class:`~.release.Pending`: the releases ``defer_cleanup`` or a capture holds back, the blocks a
hold or ``defer_cleanup`` keeps (:mod:`.release` lists them)."""

from __future__ import annotations


class Held:
    """Things held until a condition ends, oldest first.  ``keep(what, key)`` (key: a block, or
    ``what`` itself); ``let_go(key)`` returns what was kept (None: not kept, or taken);
    :meth:`take_oldest` and :meth:`take` empty it oldest first.  Atomic operations only:
    finalizers keep and let go in any thread, and two takers at once never take one thing twice."""

    __slots__ = ("_kept",)

    def __init__(self):
        self._kept: dict = {}  # key -> what; insertion order is age

    def keep(self, what, key=None) -> None:
        """Hold ``what`` until it is let go or taken."""
        self._kept[what if key is None else key] = what

    def let_go(self, key):
        """What was held under ``key``, no longer held; None when it was not (or was taken)."""
        return self._kept.pop(key, None)

    def take_oldest(self):
        """The oldest thing held, no longer held; None when nothing is."""
        kept = self._kept
        while kept:
            try:
                key = next(iter(kept))
            except (StopIteration, RuntimeError):  # emptied, or changed under the iterator: again
                continue
            what = kept.pop(key, None)
            if what is not None:
                return what
        return None

    def take(self) -> list:
        """Everything held, oldest first, no longer held."""
        taken = []
        while (what := self.take_oldest()) is not None:
            taken.append(what)
        return taken

    def keys(self) -> list:
        return list(self._kept.copy())  # a copy: finalizers change it

    def values(self) -> list:
        return list(self._kept.copy().values())

    def __len__(self) -> int:
        return len(self._kept)
