"""Scoped statistics: ``with numba_pool.statistics() as s:`` counts the device allocations that
the calling thread makes inside the block, in bytes and counts, current, peak and total (the
figures of ``rmm.statistics.statistics()``).

Semantics
---------
* **Thread-aware.**  A scope counts the allocations of the thread that entered it, and of no
  other thread (threads started inside the block included).
* **Nested.**  An allocation counts in every scope of its thread that is open at that moment:
  an inner scope's allocations also count in the outer ones.  (RMM's ``push_statistics`` adds a
  popped scope's figures to the one below; the result is the same for allocations, and frees
  are exact here, see the next point.)
* **Frees count where their allocation counted**, whichever thread releases the memory and
  whenever: a scope's ``current_*`` never go negative, and an array allocated before the scope
  and freed inside it does not count.
* **Figures freeze when the scope exits**: ``current_*`` are then what the block allocated and
  still held at its exit (``assert s.current_bytes == 0`` checks for leaks); later frees no
  longer change them.
* Bytes are the sizes requested (Numba's ``memalloc`` size), on every device that numba_pool
  serves; scratch blocks count through the arrays carved from them (as in the allocation log).

Cost
----
None while no scope is open anywhere in the process: only while one is open is the counting
adaptor (:class:`CountedAllocations`) in the allocation path, which the plugin composes
(:mod:`numba_pool.plugin.path`).  The scopes :func:`numba_pool.statistics` makes are the
plugin's subclass of :class:`ScopedStatistics`: it counts the scopes open in the process (the
process state, :mod:`numba_pool.plugin.state`) and, at the first to open and the last to exit,
composes every device's path again.  This module keeps only each thread's open scopes
(:data:`_local`, which the adaptor reads per allocation).  The adaptor appends
one event per open scope of the thread to that scope's
:class:`~numba_pool.allocator.usage.UsageTracker` (lock-free, replayed exactly on reading), and
puts its part in front of the pointer's release (``PoolPointer.wrap_release``): the release
appends the matching events, then releases.

With ``profile=True`` a scope also records, per call site (the first frame outside numba,
numba-cuda, Numba-CUDA-MLIR and numba_pool), the allocations and their bytes: :meth:`ScopedStatistics.report`.
That walks the stack at every allocation (a few microseconds): for diagnosis, not production.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable

from ..allocator.usage import DRAIN_AT, UsageTracker
from ..cuda.pointers import PoolPointer
from .history import is_library_frame


class _ThreadScopes(threading.local):
    # The calling thread's open scopes, outermost first (a tuple, replaced, never mutated: a
    # pointer's release keeps the one its allocation saw).
    scopes: tuple = ()


#: The calling thread's open scopes: a latch of the hot path (docs/architecture.md, "Module-level
#: state"), read by the counting adaptor at each allocation.
_local = _ThreadScopes()


class _Discard:
    """A closed scope's event list: frees after the scope exited are not counted."""

    __slots__ = ()

    def append(self, event: int) -> None:
        pass

    def __len__(self) -> int:
        return 0


_DISCARD = _Discard()


class ScopedStatistics:
    """The allocations made by one thread inside a ``with`` block.

    Figures (bytes are requested sizes; counts are allocations): ``current_bytes`` and
    ``current_count`` (allocated inside and not yet freed; at exit, frozen), ``peak_bytes`` and
    ``peak_count`` (their largest values), ``total_bytes`` and ``total_count`` (everything
    allocated inside), and ``total_frees``.  Live while the block runs, read from any thread.

    A scope is entered once.  Use :func:`numba_pool.statistics` to make one: it puts the
    counting adaptor in the allocation paths while the scope is open (this class alone counts
    only while another scope keeps the adaptor there).

    :param profile: also record allocations per call site (:attr:`sites`, :meth:`report`).
    """

    def __init__(self, *, profile: bool = False):
        self._usage = UsageTracker()
        self._sites: dict | None = {} if profile else None
        self._thread: int | None = None
        self._state = "new"  # "new" -> "open" -> "closed"

    # -- the with statement ---------------------------------------------------------------

    def __enter__(self) -> "ScopedStatistics":
        """Start counting the calling thread's allocations.

        :raises RuntimeError: when this scope was entered before.
        """
        if self._state != "new":
            raise RuntimeError("numba_pool.statistics: a scope can be entered only once; make a new one")
        self._thread = threading.get_ident()
        self._state = "open"
        _local.scopes = _local.scopes + (self,)
        return self

    def __exit__(self, *exc_info) -> None:
        """Stop counting and freeze the figures.

        :raises RuntimeError: when the scope is not open, or is exited by another thread than
            the one that entered it.
        """
        if self._state != "open":
            raise RuntimeError(f"numba_pool.statistics: exiting a scope that is {self._state}, not open")
        if threading.get_ident() != self._thread:
            raise RuntimeError("numba_pool.statistics: a scope must be exited by the thread that entered it")
        _local.scopes = tuple(s for s in _local.scopes if s is not self)
        self._usage.close(_DISCARD)  # what a release appends from now on goes nowhere
        self._state = "closed"

    # -- figures --------------------------------------------------------------------------

    def _read(self) -> UsageTracker:
        if self._state == "open":
            self._usage.drain()
        return self._usage

    @property
    def current_bytes(self) -> int:
        """Bytes allocated inside the block and not freed (at its exit, once it has exited)."""
        return self._read().bytes_in_use

    @property
    def current_count(self) -> int:
        """Allocations made inside the block and not freed (at its exit, once it has exited)."""
        return self._read().blocks_in_use

    @property
    def peak_bytes(self) -> int:
        """The largest :attr:`current_bytes` so far."""
        return self._read().peak_bytes_in_use

    @property
    def peak_count(self) -> int:
        """The largest :attr:`current_count` so far."""
        return self._read().peak_blocks_in_use

    @property
    def total_bytes(self) -> int:
        """Bytes of all allocations made inside the block."""
        return self._read().total_bytes

    @property
    def total_count(self) -> int:
        """Allocations made inside the block."""
        return self._read().total_allocations

    @property
    def total_frees(self) -> int:
        """Frees of allocations made inside the block (up to its exit)."""
        return self._read().total_frees

    def to_dict(self) -> dict[str, int]:
        """RMM's keys (``current/peak/total`` x ``bytes/count``) and ``total_frees``, read at once."""
        u = self._read()
        return {"current_bytes": u.bytes_in_use, "current_count": u.blocks_in_use,
                "peak_bytes": u.peak_bytes_in_use, "peak_count": u.peak_blocks_in_use,
                "total_bytes": u.total_bytes, "total_count": u.total_allocations, "total_frees": u.total_frees}

    def __repr__(self) -> str:
        figures = ", ".join(f"{k}={v}" for k, v in self.to_dict().items())
        return f"<numba_pool.statistics ({self._state}): {figures}>"

    # -- profile --------------------------------------------------------------------------

    @property
    def sites(self) -> dict[tuple[str, int, str], tuple[int, int]]:
        """``(file, line, function) -> (allocations, bytes)`` for each call site that allocated
        inside the block (a copy).

        :raises RuntimeError: when the scope was made without ``profile=True``.
        """
        if self._sites is None:
            raise RuntimeError("numba_pool.statistics: call sites are recorded only with profile=True")
        return dict(self._sites)

    def report(self, limit: int | None = None) -> str:
        """A table of the call sites, most bytes first (``limit`` rows at most).

        :raises RuntimeError: when the scope was made without ``profile=True``.
        """
        import humanfriendly
        from tabulate import tabulate

        ranked = sorted(self.sites.items(), key=lambda item: (-item[1][1], -item[1][0], item[0]))[:limit]
        rows = [(f"{os.path.basename(f)}:{line} ({function})", count,
                 f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)")
                for (f, line, function), (count, nbytes) in ranked]
        return tabulate(rows, headers=["call site", "allocations", "bytes"], tablefmt="github",
                        disable_numparse=True)

    def _record_site(self, site: tuple[str, int, str], size: int) -> None:
        # Only the scope's own thread allocates into it: no lock.
        count, nbytes = self._sites.get(site, (0, 0))
        self._sites[site] = (count + 1, nbytes + size)


# -- the counting adaptor ----------------------------------------------------------------

class CountedAllocations:
    """The counting adaptor: counts each allocation in the calling thread's open scopes, and
    its free in the same scopes whenever and wherever the memory is released.

    :param upstream: the allocation it wraps (bytes -> ``PoolPointer``).
    """

    def __init__(self, upstream: Callable[[int], PoolPointer]):
        self._upstream = upstream

    def allocate(self, size: int) -> PoolPointer:
        """``size`` bytes from upstream, counted; outside every scope of this thread, upstream's
        pointer as it is."""
        mem = self._upstream(size)
        scopes = _local.scopes
        if not scopes:
            return mem
        site = None
        for scope in scopes:
            usage = scope._usage
            events = usage.events
            events.append(size)
            if len(events) > DRAIN_AT:  # bound the events' memory (UsageTracker.drain_if_due, inlined)
                usage.drain(wait=False)
            if scope._sites is not None:
                if site is None:
                    site = _call_site()
                scope._record_site(site, size)
        mem.wrap_release(_count_free, scopes, size)
        return mem


def _count_free(scopes: tuple, size: int, release) -> None:
    # Any thread, from a finalizer: appends only, never raises.
    for scope in scopes:
        scope._usage.events.append(~size)
    release()


def _call_site() -> tuple[str, int, str]:
    """The innermost frame outside numba, numba-cuda, Numba-CUDA-MLIR and numba_pool (but its
    example kernels): (file, line, function)."""
    frame = sys._getframe(1)
    while frame is not None and is_library_frame(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("<numba_pool>", 0, "?")
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
