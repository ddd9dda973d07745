"""Allocation statistics: usage events from the EMM manager plus the mempool's own attributes.

Byte counts are the sizes Numba requested; the pool's *reserved* and *used* bytes come from
``CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT/HIGH`` and ``CU_MEMPOOL_ATTR_USED_MEM_CURRENT/HIGH`` and
include the driver's rounding.

Why events and not counters: the allocator's hot path must not take a lock (it costs as much
as the rest of our bookkeeping, and a finalizer run by the garbage collector inside a locked
section would deadlock on it).  Each allocate or free appends one int to a list, which is
atomic: ``nbytes`` for an allocation, ``~nbytes`` (that is ``-nbytes - 1``, negative also for 0
bytes) for a free.  :meth:`UsageTracker.drain` replays them in order with numpy (running sums,
so current values and peaks are exact), at about 30 ns an event instead of 130 in a Python loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

import numpy as np

#: Replay once this many events are pending, to bound the events' memory.
DRAIN_AT = 1 << 16


@dataclass(frozen=True)
class PoolStatistics:
    """A snapshot of one device's numba_pool memory manager (bytes and counts).

    ``bytes_in_use``/``blocks_in_use``: arrays allocated and not yet freed, with their peaks
    since start or :func:`numba_pool.reset_peak`.  ``total_allocations``/``total_frees``: since
    start; ``total_bytes``: bytes of all allocations since start.  Bytes are the sizes Numba
    requested.  ``pool_*``: the mempool's attributes (bytes, with the driver's rounding).
    ``oom_retries``: allocations that hit ``CUDA_ERROR_OUT_OF_MEMORY`` once and were retried
    after synchronizing and trimming; ``oom_errors``: those that failed again and raised.
    ``arena_*``: the sub-allocating arena (zero, and ``arena_on`` false, when it is off): slab
    bytes reserved from the mempool, bytes in live blocks (rounded to 256 B), free blocks and
    the largest of them, bytes cached, quarantined and free in the slabs, and the slabs.
    ``host_*``: pinned host blocks (``NUMBA_POOL_HOST``; zero, ``host_on`` false, when off):
    bytes from ``cuMemHostAlloc`` (rounded to powers of two), in pinned/mapped arrays, cached
    for reuse, and the blocks reserved.

    The same figures under RMM's names (``rmm.statistics.Statistics``): :attr:`current_bytes`,
    :attr:`current_count`, :attr:`peak_bytes`, :attr:`peak_count`, :attr:`total_bytes`,
    :attr:`total_count`; :meth:`to_dict` gives those with the pool, arena and out-of-memory
    figures.
    """

    bytes_in_use: int
    peak_bytes_in_use: int
    blocks_in_use: int
    peak_blocks_in_use: int
    total_allocations: int
    total_frees: int
    pool_reserved_bytes: int
    pool_reserved_high: int
    pool_used_bytes: int
    pool_used_high: int
    oom_retries: int
    oom_errors: int
    arena_reserved_bytes: int = 0
    arena_in_use_bytes: int = 0
    arena_free_blocks: int = 0
    arena_largest_free_block: int = 0
    total_bytes: int = 0
    arena_on: bool = False
    arena_cached_bytes: int = 0
    arena_quarantined_bytes: int = 0
    arena_free_bytes: int = 0
    arena_slabs: int = 0
    host_on: bool = False
    host_reserved_bytes: int = 0
    host_in_use_bytes: int = 0
    host_cached_bytes: int = 0
    host_blocks: int = 0

    # -- RMM's names (rmm.statistics.Statistics) ------------------------------------------

    @property
    def current_bytes(self) -> int:
        """Bytes of the allocations alive now (:attr:`bytes_in_use`)."""
        return self.bytes_in_use

    @property
    def current_count(self) -> int:
        """Allocations alive now (:attr:`blocks_in_use`)."""
        return self.blocks_in_use

    @property
    def peak_bytes(self) -> int:
        """The most bytes alive at once (:attr:`peak_bytes_in_use`)."""
        return self.peak_bytes_in_use

    @property
    def peak_count(self) -> int:
        """The most allocations alive at once (:attr:`peak_blocks_in_use`)."""
        return self.peak_blocks_in_use

    @property
    def total_count(self) -> int:
        """Allocations since start (:attr:`total_allocations`)."""
        return self.total_allocations

    def to_dict(self) -> dict[str, int | bool]:
        """The figures as a flat dict: RMM's ``current/peak/total`` x ``bytes/count`` keys, then
        ``total_frees``, the ``pool_*`` and ``oom_*`` keys, and the ``arena_*`` keys (all zero,
        ``arena_on`` false, when the arena is off).  Bytes everywhere but the counts."""
        rmm_style = {name: getattr(self, name) for name in RMM_KEYS}
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _RENAMED}
        return {**rmm_style, **rest}


#: RMM's statistics keys, in its order (``rmm.statistics.Statistics``).
RMM_KEYS = ("current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes", "total_count")
#: Fields that :meth:`PoolStatistics.to_dict` gives under RMM's names instead.
_RENAMED = frozenset({"bytes_in_use", "blocks_in_use", "peak_bytes_in_use", "peak_blocks_in_use",
                      "total_allocations", "total_bytes"})


class UsageTracker:
    """Bytes and blocks in use with their peaks, and bytes allocated in all, from allocate
    (``nbytes``) and free (``~nbytes``) events appended to :attr:`events` by any thread."""

    def __init__(self):
        self.events: list[int] = []
        self.bytes_in_use = 0
        self.peak_bytes_in_use = 0
        self.blocks_in_use = 0
        self.peak_blocks_in_use = 0
        self.total_allocations = 0
        self.total_frees = 0
        self.total_bytes = 0
        self.oom_retries = 0
        self.oom_errors = 0
        self._replay_lock = threading.Lock()

    def drain_if_due(self) -> None:
        """The allocator's periodic call: replay once more than :data:`DRAIN_AT` events are
        pending (bounding their memory when nobody reads statistics), without waiting for
        another thread that is replaying."""
        if len(self.events) > DRAIN_AT:
            self.drain(wait=False)

    def drain(self, wait: bool = True) -> None:
        """Replay pending events.  With ``wait=False`` return at once if another thread is
        replaying, instead of blocking."""
        if not self._replay_lock.acquire(blocking=wait):
            return
        try:
            self._replay(self.events)
        finally:
            self._replay_lock.release()

    def close(self, sink) -> None:
        """Replay pending events and send later ones to ``sink`` (an object with ``append``
        and ``len``, ignored by replays): the figures stop changing."""
        with self._replay_lock:
            events, self.events = self.events, sink
            self._replay(events)

    def _replay(self, events: list[int]) -> None:
        # Under _replay_lock.
        count = len(events)
        if not count:
            return
        # Two C-level steps: events appended meanwhile land after the first `count` and
        # wait for the next replay; only replays (under the lock) remove any.
        batch = np.fromiter(events[:count], dtype=np.int64, count=count)
        del events[:count]
        frees = batch < 0
        self.total_bytes += int(batch.sum(where=~frees))
        batch += frees  # ~nbytes + 1 == -nbytes: a free's change in bytes
        running = np.cumsum(batch)
        running += self.bytes_in_use
        steps = np.where(frees, -1, 1).cumsum()
        steps += self.blocks_in_use
        self.peak_bytes_in_use = max(self.peak_bytes_in_use, int(running.max()))
        self.peak_blocks_in_use = max(self.peak_blocks_in_use, int(steps.max()))
        self.bytes_in_use, self.blocks_in_use = int(running[-1]), int(steps[-1])
        released = int(frees.sum())
        self.total_frees += released
        self.total_allocations += count - released

    def count_oom(self, failed: bool) -> None:
        """Count an out-of-memory retry (``failed=False``) or a final failure (slow path)."""
        with self._replay_lock:
            if failed:
                self.oom_errors += 1
            else:
                self.oom_retries += 1

    def forget_in_use(self) -> None:
        """Count everything still in use as freed (a reset released it)."""
        self.drain()
        with self._replay_lock:
            self.total_frees += self.blocks_in_use
            self.bytes_in_use = self.blocks_in_use = 0

    def reset_peak(self) -> None:
        self.drain()
        self.peak_bytes_in_use = self.bytes_in_use
        self.peak_blocks_in_use = self.blocks_in_use
