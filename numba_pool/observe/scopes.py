"""Scoped statistics: ``with numba_pool.statistics() as s:`` counts the thread's device allocations in the block,
in bytes (as requested) and counts, current, peak and total (as ``rmm.statistics.statistics()``).

* **Thread-aware and nested**: the entering thread's allocations only (not threads started inside), each in every
  open scope of its thread (as RMM's ``push_statistics`` ends up counting; frees are exact here).
* **Frees count where their allocation counted**, whatever thread releases, whenever: ``current_*`` >= 0.
* **Figures freeze at exit** (``assert s.current_bytes == 0`` checks for leaks).
* Every device numba_pool serves; scratch blocks count through the arrays carved from them.

Cost: none while no scope is open (:class:`CountedAllocations` is in the path only then: docs/architecture.md, "The
path").  It appends an event per open scope of the thread (:data:`_local`) to the scope's lock-free
:class:`~.usage.UsageTracker`, wrapping the pointer's release to append the free; ``profile=True`` walks the stack."""

from __future__ import annotations

import numbers
import os
import sys
import threading
from typing import Callable

from ..allocator.usage import DRAIN_AT, UsageTracker
from ..cuda.pointers import PoolPointer
from .history import is_library_frame


class _ThreadScopes(threading.local):
    scopes: tuple = ()  # outermost first; a tuple replaced, never mutated (a release keeps its allocation's)


_local = _ThreadScopes()  #: The thread's open scopes, a hot-path latch (docs/architecture.md, "Module-level state").


class _Discard:
    """A closed scope's event list: frees after the scope exited are not counted."""

    __slots__ = ()

    def append(self, event: int) -> None:
        pass

    def __len__(self) -> int:
        return 0


_DISCARD = _Discard()


class ScopedStatistics:
    """One thread's allocations in a ``with`` block (:func:`numba_pool.statistics`): ``current_*`` (frozen at
    exit), ``peak_*``, ``total_*``, ``total_frees``, in requested bytes; readable from any thread; entered once.
    ``profile``: also record allocations per call site (:attr:`sites`, :meth:`report`)."""

    def __init__(self, *, profile: bool = False):
        self._usage = UsageTracker()
        self._sites: dict | None = {} if profile else None
        self._thread: int | None = None
        self._state = "new"  # "new" -> "open" -> "closed"

    def __enter__(self) -> "ScopedStatistics":
        """Start counting the calling thread's allocations.  :raises RuntimeError: when entered before."""
        if self._state != "new":
            raise RuntimeError("numba_pool.statistics: a scope can be entered only once; make a new one")
        self._thread = threading.get_ident()
        self._state = "open"
        _local.scopes = _local.scopes + (self,)
        return self

    def __exit__(self, *exc_info) -> None:
        """Stop counting; freeze the figures.  :raises RuntimeError: when not open, or exited by another thread."""
        if self._state != "open":
            raise RuntimeError(f"numba_pool.statistics: exiting a scope that is {self._state}, not open")
        if threading.get_ident() != self._thread:
            raise RuntimeError("numba_pool.statistics: a scope must be exited by the thread that entered it")
        _local.scopes = tuple(s for s in _local.scopes if s is not self)
        self._usage.close(_DISCARD)  # what a release appends from now on goes nowhere
        self._state = "closed"

    def _read(self) -> UsageTracker:
        if self._state == "open":
            self._usage.drain()
        return self._usage

    @property
    def current_bytes(self) -> int:
        """Bytes allocated inside and not freed (frozen at exit)."""
        return self._read().bytes_in_use

    @property
    def current_count(self) -> int:
        """Allocations made inside and not freed (frozen at exit)."""
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

    @property
    def sites(self) -> dict[tuple[str, int, str], tuple[int, int]]:
        """``(file, line, function) -> (allocations, bytes)`` per call site (a copy).
        :raises RuntimeError: without ``profile=True``."""
        if self._sites is None:
            raise RuntimeError("numba_pool.statistics: call sites are recorded only with profile=True")
        return dict(self._sites)

    def report(self, limit: int | None = None) -> str:
        """A table of the call sites, most bytes first (``limit`` rows at most: None or a positive int).
        :raises RuntimeError: without ``profile=True``.  :raises TypeError, ValueError: for another ``limit``."""
        whole = isinstance(limit, numbers.Integral) and not isinstance(limit, bool)
        if limit is not None and not (whole and limit > 0):
            raise (ValueError if whole else TypeError)(
                f"numba_pool.statistics().report: limit={limit!r:.80} must be None or a positive int")
        import humanfriendly
        from tabulate import tabulate

        ranked = sorted(self.sites.items(), key=lambda item: (-item[1][1], -item[1][0], item[0]))[:limit]
        rows = [(f"{os.path.basename(f)}:{line} ({function})", count,
                 f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)")
                for (f, line, function), (count, nbytes) in ranked]
        return tabulate(rows, headers=["call site", "allocations", "bytes"], tablefmt="github",
                        disable_numparse=True)

    def _record_site(self, site: tuple[str, int, str], size: int) -> None:  # only its own thread adds: no lock
        count, nbytes = self._sites.get(site, (0, 0))
        self._sites[site] = (count + 1, nbytes + size)


class CountedAllocations:
    """The counting adaptor: an allocation, and its free (any thread, any time), counts in the thread's scopes."""

    def __init__(self, upstream: Callable[[int], PoolPointer]):
        self._upstream = upstream

    def allocate(self, size: int) -> PoolPointer:
        """``size`` bytes from upstream, counted (outside every scope: upstream's pointer as it is)."""
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


def _count_free(scopes: tuple, size: int, release) -> None:  # any thread, from a finalizer: appends only, never raises
    for scope in scopes:
        scope._usage.events.append(~size)
    release()


def _call_site() -> tuple[str, int, str]:
    """The innermost frame outside Numba's frontends and numba_pool (not its kernels): file, line, function."""
    frame = sys._getframe(1)
    while frame is not None and is_library_frame(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return ("<numba_pool>", 0, "?")
    return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
