"""Rule 4 of :mod:`numba_pool.allocator`: the legacy domain's quarantine and ready cache.

A block freed on the legacy stream may still be read by work on a blocking stream that the next
owner's work, on another blocking stream, would not wait for.  It waits here until a *fence*
(one event record on the legacy stream, :meth:`numba_pool.allocator.arena.ArenaBlocks._fence`);
the snapshot of what a fence releases is taken before it is recorded (:meth:`Quarantine.take`).
Fenced blocks fill a per-size cache that allocations pop without a lock.
"""

from __future__ import annotations


class Quarantine:
    """Rule 4's state: legacy-stream blocks freed and not yet fenced, and the fenced ones kept
    ready for lock-free allocation (glibc's tcache idea), each as rounded size -> starts.

    ``waiting`` lists are appended to without a lock by releases and emptied by :meth:`take`
    under the arena's lock; ``ready`` lists are popped without a lock by allocations and filled
    under the lock."""

    def __init__(self, cache_limit: int):
        self.waiting: dict[int, list[int]] = {}  # rounded size -> starts freed since the last fence
        self.ready: dict[int, list[int]] = {}  # rounded size -> starts fenced, for lock-free reuse
        self.cache_limit = cache_limit  # ready blocks kept per size

    def add(self, start: int, size: int) -> None:
        waiting = self.waiting.get(size)
        if waiting is None:
            waiting = self.waiting.setdefault(size, [])
        waiting.append(start)

    def count(self) -> int:
        """Blocks waiting for a fence."""
        return sum(map(len, list(self.waiting.values())))

    def take(self) -> dict[int, list[int]]:
        """The snapshot before a fence: every block waiting now, as rounded size -> starts."""
        taken = {}
        # dict.copy, not list(items()): building the item tuples can run the collector, whose
        # finalizers (releases) add sizes to ``waiting`` mid-iteration (found by a history test).
        for size, waiting in self.waiting.copy().items():
            count = len(waiting)
            if count:
                # Two C-level steps: a release appending meanwhile lands after the first `count`
                # and stays for the next fence.
                taken[size] = waiting[:count]
                del waiting[:count]
        return taken

    def put_back(self, taken: dict[int, list[int]]) -> None:
        """Return a snapshot whose fence could not be recorded."""
        for size, starts in taken.items():
            for start in starts:
                self.add(start, size)

    def make_ready(self, taken: dict[int, list[int]]) -> list[tuple[int, int]]:
        """Fenced blocks fill the cache first, a list at a time; returns those that did not fit,
        as (start, size)."""
        rest = []
        for size, starts in taken.items():
            ready = self.ready.get(size)
            if ready is None:
                ready = self.ready.setdefault(size, [])
            room = self.cache_limit - len(ready)
            if room > 0:
                ready.extend(starts[:room])
                starts = starts[room:]
            rest += [(start, size) for start in starts]
        return rest

    def take_ready(self) -> list[tuple[int, int]]:
        """Empty the cache: every ready block as (start, size)."""
        taken = []
        for size, ready in list(self.ready.items()):
            while True:
                try:
                    taken.append((ready.pop(), size))
                except IndexError:  # empty, or an allocation took the last one
                    break
        return taken

    def bytes(self) -> tuple[int, int]:
        """(quarantined, cached) bytes."""
        def total(lists):
            return sum(size * len(starts) for size, starts in lists.copy().items())
        return total(self.waiting), total(self.ready)

    def empty(self) -> None:
        """Empty every list in place (a reset): a lock-free pop racing it finds nothing."""
        for starts in [*list(self.waiting.values()), *list(self.ready.values())]:
            starts.clear()

    def holds(self, start: int, size: int) -> bool:
        """Whether the block (start, size) waits for a fence or is ready (a released block)."""
        # list() copies: releases append to the lists without the arena's lock.
        return start in list(self.waiting.get(size, ())) or start in list(self.ready.get(size, ()))

    def check_invariants(self, taken: dict[int, int]) -> None:
        """Every quarantined and ready block is out of the heap (in ``taken``) at its size, and
        is there once (tests).  :raises AssertionError: otherwise."""
        seen = set()
        for size, starts in [*self.waiting.items(), *self.ready.items()]:
            for start in list(starts):
                assert taken.get(start) == size, f"free block {start:#x} ({size} bytes) is not out of the heap"
                assert start not in seen, f"block {start:#x} is twice in the quarantine or the cache"
                seen.add(start)
