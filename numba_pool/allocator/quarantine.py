"""Rule 4 (:mod:`numba_pool.allocator`), legacy domain: a block freed on the legacy stream (blocking streams may read
it) is quarantined till a later *fence* (:mod:`.fences`) is seen done, then fills a lock-free per-size ready cache."""

from __future__ import annotations

from .block import FREE, Block
from .fences import take_list
from .release import Pending


class Quarantine:
    """Rule 4's state: blocks freed, not yet fenced (:attr:`waiting`, the release gate's :class:`~.release.Pending`),
    the fenced batches (``fences``), and the ready cache (glibc's tcache idea): rounded size -> :data:`~.block.FREE`
    blocks, popped without a lock (Note [A ready block is its Block]), filled under the arena's lock."""

    def __init__(self, cache_limit: int, fences):
        self.waiting = Pending()  # blocks freed since the last fence
        self.ready: dict[int, list[Block]] = {}  # rounded size -> blocks whose fence completed, for lock-free reuse
        self.cache_limit = cache_limit  # ready blocks kept per size
        self.fences = fences

    def fence_if_due(self, at: int, limit: int, deferral) -> None:
        """A fence for the waiting blocks (taken before it) once ``at`` wait, or more than ``limit``; never inside
        ``defer_cleanup`` (``deferral.depth``), nor while another thread records one (the next miss fences these).
        :raises CudaAPIError: when the fence cannot be recorded (the blocks wait on)."""
        fences = self.fences
        after = fences.after_fence
        count = len(self.waiting) + len(after)
        if not count or deferral.depth:
            return
        if count < at and count <= limit and not fences.due(0, 0, deferral):  # after_fence's: as in mempool mode
            return
        if not fences.lock.acquire(blocking=False):
            return
        try:
            taken = self.waiting.take()
            if taken or after:
                try:
                    fences.record(taken)
                except Exception:
                    self.waiting.extend(taken)
                    raise
        finally:
            fences.lock.release()

    def collect(self) -> list[Block]:
        """The batches whose fence the host has seen complete fill the cache; returns the rest."""
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

    def take_released(self, releases: list) -> list[list]:
        """Every waiting and fenced block, in batches (before a synchronize); releases for a fence to ``releases``."""
        with self.fences.lock:
            return [self.waiting.take(), *self.fences.take_all(releases)]

    def fenced(self) -> list[list]:
        """The batches whose fence is not yet seen complete (a copy)."""
        return [taken for _, taken, _ in list(self.fences.batches)]

    def released(self) -> list:
        """Every block waiting for a fence or its completion (a copy: releases append without the lock)."""
        return [block for batch in [list(self.waiting), *self.fenced()] for block in batch]

    def make_ready(self, taken: list[Block]) -> list[Block]:
        """Fenced blocks fill the cache first (:data:`~.block.FREE`); returns the rest."""
        rest = []
        ready_lists, limit = self.ready, self.cache_limit
        for block in taken:
            size = block.rounded
            ready = ready_lists.get(size)
            if ready is None:
                ready = ready_lists.setdefault(size, [])
            if len(ready) < limit:
                block.state = FREE
                ready.append(block)
            else:
                rest.append(block)
        return rest

    def take_ready(self) -> list[Block]:
        """Empty the cache: every ready block (popped one at a time: a racing pop takes each block or not)."""
        return [block for ready in list(self.ready.values()) for block in take_list(ready)]

    def bytes(self) -> tuple[int, int]:
        """(quarantined, cached) bytes; quarantined counts the fenced blocks too."""
        quarantined = sum(block.rounded for block in self.released())
        return quarantined, sum(size * len(blocks) for size, blocks in self.ready.copy().items())

    def empty(self) -> None:
        """Empty every list in place (a reset): a lock-free pop racing it finds nothing."""
        self.waiting.take()
        for blocks in list(self.ready.values()):
            blocks.clear()

    def check_invariants(self, taken: dict[int, int]) -> None:
        """Each quarantined, fenced, ready block is in ``taken`` once, at its size.  :raises AssertionError: if not."""
        seen = set()
        ready = [(size, block) for size, blocks in list(self.ready.items()) for block in list(blocks)]
        for size, block in [(block.rounded, block) for block in self.released()] + ready:
            start = block.start
            assert taken.get(start) == size == block.rounded, f"free block {start:#x} ({size} bytes) is not out of the heap"
            assert start not in seen, f"block {start:#x} is twice in the quarantine or the cache"
            seen.add(start)
