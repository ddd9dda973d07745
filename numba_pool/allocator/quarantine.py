"""Rule 4 of :mod:`numba_pool.allocator`: the legacy domain's quarantine and ready cache.

A block freed on the legacy stream may still be read by work on any blocking stream.  It waits
here until a *fence* (one event record on the legacy stream for a batch,
:meth:`numba_pool.allocator.arena.ArenaBlocks._fence`, :mod:`.fences`) has been recorded and the
host has seen it complete; the snapshot of what a fence covers is taken before it is recorded
(:meth:`Quarantine.take`).  Blocks whose fence completed are idle and fill a per-size cache
that allocations pop without a lock.
"""

from __future__ import annotations

from .fences import take_list


class Quarantine:
    """Rule 4's state: legacy-stream blocks freed and not yet fenced, and the fenced ones kept
    ready for lock-free allocation (glibc's tcache idea), each as rounded size -> starts.

    ``waiting`` lists are appended to without a lock by releases and emptied by :meth:`take`
    under the arena's lock; ``ready`` lists are popped without a lock by allocations and filled
    under the lock.  ``fences`` (:class:`~numba_pool.allocator.fences.Fences`) holds the
    batches fenced and not yet seen complete, each as rounded size -> starts."""

    def __init__(self, cache_limit: int, fences):
        self.waiting: dict[int, list[int]] = {}  # rounded size -> starts freed since the last fence
        self.ready: dict[int, list[int]] = {}  # rounded size -> starts whose fence completed, for lock-free reuse
        self.cache_limit = cache_limit  # ready blocks kept per size
        self.fences = fences

    def fence_if_due(self, at: int, limit: int, deferral) -> None:
        """A fence for the waiting blocks once ``at`` of them wait, or more than ``limit``;
        never while a ``defer_cleanup`` is open (``deferral.depth``), nor while another thread
        records one (the next miss fences these).  The snapshot comes before the fence.

        :raises CudaAPIError: when the fence cannot be recorded (the blocks wait on)."""
        fences = self.fences
        count = self.count() + len(fences.after_fence)
        if not count or (count < at and count <= limit) or deferral.depth:
            return
        if not fences.lock.acquire(blocking=False):
            return
        try:
            taken = self.take()
            if taken or fences.after_fence:
                try:
                    fences.record(taken)
                except Exception:
                    self.put_back(taken)
                    raise
        finally:
            fences.lock.release()

    def collect(self) -> list[tuple[int, int]]:
        """The batches whose fence the host has seen complete fill the cache; returns the
        blocks that did not fit, as (start, size)."""
        fences = self.fences
        if not fences.lock.acquire(blocking=False):
            return []
        try:
            done = fences.completed()
        finally:
            fences.lock.release()
        rest = []
        for taken in done:
            rest += self.make_ready(taken)
        return rest

    def take_released(self, releases: list) -> list[dict[int, list[int]]]:
        """Every waiting and fenced block (before a synchronize makes them idle); the releases
        waiting for a fence are added to ``releases``."""
        with self.fences.lock:
            return [self.take(), *self.fences.take_all(releases)]

    def fenced(self) -> list[dict[int, list[int]]]:
        """The batches whose fence is not yet seen complete (a copy)."""
        return [taken for _, taken, _ in list(self.fences.batches)]

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
        # take_list pops one at a time: an allocation popping meanwhile takes each block or not.
        return [(start, size) for size, ready in list(self.ready.items()) for start in take_list(ready)]

    def bytes(self) -> tuple[int, int]:
        """(quarantined, cached) bytes; quarantined counts the fenced blocks too."""
        def total(lists):
            return sum(size * len(starts) for size, starts in lists.copy().items())
        return total(self.waiting) + sum(map(total, self.fenced())), total(self.ready)

    def empty(self) -> None:
        """Empty every list in place (a reset): a lock-free pop racing it finds nothing."""
        for starts in [*list(self.waiting.values()), *list(self.ready.values())]:
            starts.clear()

    def holds(self, start: int, size: int) -> bool:
        """Whether the block (start, size) waits for a fence or is ready (a released block)."""
        # list() copies: releases append to the lists without the arena's lock.
        return (start in list(self.waiting.get(size, ())) or start in list(self.ready.get(size, ()))
                or any(start in taken.get(size, ()) for taken in self.fenced()))

    def check_invariants(self, taken: dict[int, int]) -> None:
        """Every quarantined, fenced and ready block is out of the heap (in ``taken``) at its
        size, and is there once (tests).  :raises AssertionError: otherwise."""
        seen = set()
        lists = [*self.waiting.items(), *self.ready.items()] + [item for batch in self.fenced() for item in batch.items()]
        for size, starts in lists:
            for start in list(starts):
                assert taken.get(start) == size, f"free block {start:#x} ({size} bytes) is not out of the heap"
                assert start not in seen, f"block {start:#x} is twice in the quarantine or the cache"
                seen.add(start)
