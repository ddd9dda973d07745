"""A device's statistics (:class:`PoolStatistics`, :func:`collect`) from usage events (:mod:`.allocator.usage`), mempool
attributes (``CU_MEMPOOL_ATTR_{RESERVED,USED}_MEM_{CURRENT,HIGH}``), the arena and caches."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields

from ..allocator import captures
from ..allocator.host_blocks import statistics as cache_statistics
from ..cuda.capture import graph_memory, relaxed


@dataclass(frozen=True)
class PoolStatistics:
    """One device's numba_pool figures; bytes as requested, but for ``pool_*``, ``arena_*``, ``host_*``, ``managed_*``,
    ``graph_*``.  ``bytes_in_use``/``blocks_in_use`` (peaks since start or :func:`numba_pool.reset_peak`);
    ``total_allocations``, ``total_frees``, ``total_bytes`` since start.  ``pool_*``: mempool attributes;
    ``pool_released_bytes``: dropped arrays' bytes awaiting a fence, or idle (4, 7a).  ``oom_retries``/``oom_errors``:
    allocations retried after synchronizing and trimming / failing again.  ``arena_*`` (0, ``arena_on`` false, when
    off): slabs reserved, live blocks (rounded to 256 B), free blocks, the largest, bytes cached, quarantined and free,
    the slabs.  ``host_*``/``managed_*`` (likewise ``*_on``): bytes reserved (powers of two), in arrays, cached, blocks.
    ``graph_*``: device graph memory (``cuDeviceGetGraphMemAttribute``, not the mempools'), high watermarks, our live
    captured arrays; ``releases_held_for_capture``: held back by a capture (rule 13)."""

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
    managed_on: bool = False
    managed_reserved_bytes: int = 0
    managed_in_use_bytes: int = 0
    managed_cached_bytes: int = 0
    managed_blocks: int = 0
    graph_used_bytes: int = 0
    graph_used_high: int = 0
    graph_reserved_bytes: int = 0
    graph_reserved_high: int = 0
    graph_arrays: int = 0
    graph_array_bytes: int = 0
    releases_held_for_capture: int = 0
    pool_released_bytes: int = 0

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
        """The figures as a flat dict, RMM's ``current/peak/total`` x ``bytes/count`` keys first, then the others."""
        rmm_style = {name: getattr(self, name) for name in RMM_KEYS}
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _RENAMED}
        return {**rmm_style, **rest}


#: RMM's statistics keys, in its order (``rmm.statistics.Statistics``).
RMM_KEYS = ("current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes", "total_count")
#: Fields that :meth:`PoolStatistics.to_dict` gives under RMM's names instead.
_RENAMED = frozenset({"bytes_in_use", "blocks_in_use", "peak_bytes_in_use", "peak_blocks_in_use",
                      "total_allocations", "total_bytes"})


def collect(usage, allocator, host=None, managed=None) -> PoolStatistics:
    """One device's statistics now, from ``usage`` (the manager's :class:`~.usage.UsageTracker`, drained here),
    ``allocator`` (the device's :class:`~.device.DeviceAllocator`), ``host``/``managed`` (its caches, or None)."""
    allocator.issue_frees()  # the legacy-stream frees releases queued, before the pool is read
    pool = allocator.pool.usage()
    usage.drain()
    return PoolStatistics(
        bytes_in_use=usage.bytes_in_use, peak_bytes_in_use=usage.peak_bytes_in_use,
        blocks_in_use=usage.blocks_in_use, peak_blocks_in_use=usage.peak_blocks_in_use,
        total_allocations=usage.total_allocations, total_frees=usage.total_frees, total_bytes=usage.total_bytes,
        pool_reserved_bytes=pool.reserved, pool_reserved_high=pool.reserved_high,
        pool_used_bytes=pool.used, pool_used_high=pool.used_high,
        pool_released_bytes=allocator.mempool_blocks.released_bytes(),
        oom_retries=usage.oom_retries, oom_errors=usage.oom_errors,
        **_arena_fields(allocator.arenas), **_cache_fields(host, "host_on"), **_cache_fields(managed, "managed_on"),
        **_graph_fields(allocator))


def _graph_fields(allocator) -> dict:
    cu = allocator.cu
    with relaxed(cu) if captures.underway else contextlib.nullcontext():  # rule 13
        graph = graph_memory(cu, allocator.pool.device_id)
    live = allocator.graph_blocks.live.copy()
    return {"graph_used_bytes": graph.used, "graph_used_high": graph.used_high,
            "graph_reserved_bytes": graph.reserved, "graph_reserved_high": graph.reserved_high,
            "graph_arrays": len(live), "graph_array_bytes": sum(block.size for block in live.values()),
            "releases_held_for_capture": captures.held_back()}


def _arena_fields(arenas) -> dict:
    fields: dict = {}
    for a in (arena.statistics() for arena in arenas):  # none when the arena is off
        fields = {"arena_reserved_bytes": a.reserved, "arena_in_use_bytes": a.in_use,
                  "arena_free_blocks": a.free_blocks, "arena_largest_free_block": a.largest_free_block,
                  "arena_on": True, "arena_cached_bytes": a.cached, "arena_quarantined_bytes": a.quarantined,
                  "arena_free_bytes": a.free, "arena_slabs": a.slabs}
    return fields


def _cache_fields(cache, switch: str) -> dict:
    if cache is None:
        return {}
    return {switch: True, **cache_statistics(cache)}
