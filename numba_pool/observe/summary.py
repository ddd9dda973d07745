"""The table of :func:`numba_pool.memory_summary` (as ``torch.cuda.memory_summary()``), built from a
:class:`~numba_pool.PoolStatistics` snapshot by :func:`format_summary`, which needs no GPU."""

from __future__ import annotations

import humanfriendly
from tabulate import tabulate

from .statistics import PoolStatistics


def _size(nbytes: int) -> str:
    """``"1.5 MiB (1572864 bytes)"``; below 1 KiB just ``"1000 bytes"``."""
    if nbytes < 1024:
        return f"{nbytes} bytes"
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)"


def format_summary(stats: PoolStatistics, *, device: int | None = None, scratch=None) -> str:
    """The summary table of ``stats`` (the sections of :func:`numba_pool.memory_summary`; the scratch block when
    ``scratch`` is given; ``device``: the ordinal for the title); sizes in binary units with the exact bytes."""
    s = stats
    blank = ""
    rows = [
        ("allocated bytes", _size(s.bytes_in_use), _size(s.peak_bytes_in_use), _size(s.total_bytes)),
        ("allocations", s.blocks_in_use, s.peak_blocks_in_use, s.total_allocations),
        ("frees", blank, blank, s.total_frees),
        ("pool reserved", _size(s.pool_reserved_bytes), _size(s.pool_reserved_high), blank),
        ("pool used", _size(s.pool_used_bytes), _size(s.pool_used_high), blank),
    ]
    if s.arena_on:
        rows += [
            ("arena reserved (slabs)", _size(s.arena_reserved_bytes), blank, blank),
            ("arena in use", _size(s.arena_in_use_bytes), blank, blank),
            ("arena cached", _size(s.arena_cached_bytes), blank, blank),
            ("arena quarantined", _size(s.arena_quarantined_bytes), blank, blank),
            ("arena free", _size(s.arena_free_bytes), blank, blank),
            ("arena free blocks", s.arena_free_blocks, blank, blank),
            ("arena largest free block", _size(s.arena_largest_free_block), blank, blank),
            ("arena slabs", s.arena_slabs, blank, blank),
        ]
    if s.host_on:
        rows += [
            ("host pinned reserved", _size(s.host_reserved_bytes), blank, blank),
            ("host pinned in use", _size(s.host_in_use_bytes), blank, blank),
            ("host pinned cached", _size(s.host_cached_bytes), blank, blank),
            ("host pinned blocks", s.host_blocks, blank, blank),
        ]
    if s.managed_on:
        rows += [
            ("managed reserved", _size(s.managed_reserved_bytes), blank, blank),
            ("managed in use", _size(s.managed_in_use_bytes), blank, blank),
            ("managed cached", _size(s.managed_cached_bytes), blank, blank),
            ("managed blocks", s.managed_blocks, blank, blank),
        ]
    if s.graph_reserved_high or s.graph_arrays or s.releases_held_for_capture:
        rows += [
            ("graph memory used (CUDA graphs)", _size(s.graph_used_bytes), _size(s.graph_used_high), blank),
            ("graph memory reserved", _size(s.graph_reserved_bytes), _size(s.graph_reserved_high), blank),
            ("arrays allocated in captures", s.graph_arrays, blank, blank),
            ("their bytes", _size(s.graph_array_bytes), blank, blank),
            ("releases waiting for a capture", s.releases_held_for_capture, blank, blank),
        ]
    if scratch is not None:
        rows += [
            ("scratch block (this thread)", _size(scratch.size), blank, blank),
            ("scratch carved", _size(scratch.offset), blank, blank),
            ("scratch live arrays", scratch.live_arrays, blank, blank),
        ]
    rows += [("out-of-memory retries", blank, blank, s.oom_retries),
             ("out-of-memory errors", blank, blank, s.oom_errors)]
    where = f"device {device}" if device is not None else "current device"
    title = f"numba_pool memory summary: {where}, arena {'on' if s.arena_on else 'off'}"
    table = tabulate(rows, headers=["", "current", "peak", "total"], tablefmt="github",
                     disable_numparse=True)
    notes = ("allocated bytes: sizes requested by Numba; peaks since start or numba_pool.reset_peak().\n"
             "pool: the mempool's reserved/used bytes (driver rounding, arena slabs count as used); "
             "peak = its high watermark.")
    return f"{title}\n\n{table}\n\n{notes}"
