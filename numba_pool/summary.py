"""What a device's pool holds now, in readable form: :func:`memory_summary` (as
``torch.cuda.memory_summary()``) and the one-number readouts :func:`used_bytes` and
:func:`reserved_bytes` (as CuPy's ``MemoryPool.used_bytes()`` / ``total_bytes()`` and
``torch.cuda.memory_allocated()`` / ``memory_reserved()``).

The table is built from a :class:`~numba_pool.PoolStatistics` snapshot by :func:`format_summary`,
which needs no GPU.
"""

from __future__ import annotations

import humanfriendly
from tabulate import tabulate

from .stats import PoolStatistics


def _size(nbytes: int) -> str:
    """``"1.5 MiB (1572864 bytes)"``; below 1 KiB just ``"1000 bytes"``."""
    if nbytes < 1024:
        return f"{nbytes} bytes"
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)"


def format_summary(stats: PoolStatistics, *, device: int | None = None, scratch=None) -> str:
    """The summary table of ``stats``: allocations (bytes requested and counts: current, peak,
    total), frees, the pool's reserved and used bytes with their high watermarks, the arena's
    figures when it is on, the pinned host cache's (``NUMBA_POOL_HOST``) when it is on, the calling thread's scratch block when ``scratch`` (a
    :class:`~numba_pool.scratch.ScratchBlock`) is given, and the out-of-memory counts.  Sizes
    in binary units with the exact bytes.

    :param device: the device ordinal for the title.
    """
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
    if scratch is not None:
        rows += [
            ("scratch block (this thread)", _size(scratch.size), blank, blank),
            ("scratch carved", _size(scratch.offset), blank, blank),
            ("scratch live arrays", len(scratch._outstanding), blank, blank),
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


def memory_summary(device: int | None = None) -> str:
    """A printable table of the current (or given) device's numba_pool memory: allocations
    (bytes and counts: current, peak, total), the pool's reserved and used bytes with their
    high watermarks, the arena's figures (reserved, in use, cached, quarantined, free, slabs),
    the calling thread's scratch block if it is inside ``numba_pool.scratch``, and the
    out-of-memory retries and errors.  Sizes in binary units and exact bytes.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    from . import _manager
    from .streams import current_stream

    manager = _manager(device)
    scratch = current_stream().scratch
    if scratch is not None and getattr(scratch.block, "context", None) is not manager.context:
        scratch = None  # another device's block
    return format_summary(manager.statistics(), device=manager.device_id, scratch=scratch)


def used_bytes(device: int | None = None) -> int:
    """Bytes held by live allocations of the current (or given) device, as requested (CuPy's
    ``MemoryPool.used_bytes()``, PyTorch's ``memory_allocated()``).

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    from . import _manager

    return _manager(device).statistics().bytes_in_use


def reserved_bytes(device: int | None = None) -> int:
    """Bytes the device's mempool has reserved from the device (``CU_MEMPOOL_ATTR_RESERVED_
    MEM_CURRENT``): live allocations, arena slabs and cached free memory (CuPy's
    ``MemoryPool.total_bytes()``, PyTorch's ``memory_reserved()``).  With
    ``use_default_pool`` the pool is the device's default one, shared with other libraries.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    from . import _manager

    return _manager(device).statistics().pool_reserved_bytes
