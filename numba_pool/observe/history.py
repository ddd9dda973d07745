"""Allocation history: the bounded ring :func:`numba_pool.record_history` records, after PyTorch's
``_record_memory_history`` and its trace entries (whose viewer reads :func:`numba_pool.dump_snapshot`'s files).  Per
allocation: address, requested size, stream, device, kind (``device``, ``arena``, ``scratch``, ``pinned``, ``managed``),
thread, time, Python stack.  Events: ``alloc``, ``free_requested``, ``free_completed`` (reusable at once or at the
holding ``defer_cleanup``'s exit), ``oom``, ``trim``, ``reset``; a release reusable at once is one ``free``
(Note [History entries]).  The ring is a ``deque`` with ``maxlen``; live allocations are kept apart, so snapshots name
every live block's frames.  Off, it costs nothing (:class:`RecordedAllocations` is in the path only while on); stacks
are ``(code, offset)`` pairs named at snapshot time (:func:`resolve`; Note [Stack walks]).  Threads: no lock; each step
is atomic (:mod:`numba_pool.allocator`, "Threads"): ``deque.append``, ``dict`` set and ``pop`` on the live table."""

from __future__ import annotations

import bisect
import numbers
import os
import sys
import threading
import time
from collections import deque, namedtuple
from functools import partial
from typing import Callable

from ..cuda.driver import OUT_OF_MEMORY
from ..cuda.errors import CudaAPIError, api_error
from ..cuda.pointers import PoolPointer
from ..cuda.streams import LEGACY, per_thread, scopes_entered

DEFAULT_MAX_ENTRIES = 100_000  #: Events kept by default (each a few hundred bytes with its frames).
MAX_FRAMES = 64  #: Frames kept per allocation at most (the innermost ones).
STACKS = ("python", "none")


#: One event: ``action``, device, ``address`` (0 where none), ``size`` (bytes requested), ``stream`` (handle value),
#: ``kind``, ``thread`` (the allocating thread's; a free's 0), ``time_ns``, ``frames`` (:meth:`History.capture`;
#: empty with ``stacks="none"``), for ``oom`` the device's free bytes.  Plain tuples in the ring (``address`` the
#: ``CUdeviceptr``; a release ``(action, alloc event, time_ns)``, Note [History entries]), read as ``Entry``.
Entry = namedtuple("Entry", "action device address size stream kind thread time_ns frames device_free")


def _as_entry(event: tuple) -> Entry:
    """The :class:`Entry` of an event as the ring holds it."""
    if len(event) == 3:  # a release: (action, alloc event, time_ns)
        action, alloc, time_ns = event
        return Entry(action, alloc[1], int(alloc[2]), alloc[3], alloc[4], alloc[5], 0, time_ns, alloc[8], 0)
    return Entry(event[0], event[1], int(event[2]), *event[3:])

_now = time.time_ns
_thread = threading.get_ident


def _walk(frame) -> list:
    """``[code, offset, ...]``, ``frame`` and up, innermost first, at most :data:`MAX_FRAMES` (Note [Stack walks])."""
    frames: list = []
    append = frames.append
    for _ in range(MAX_FRAMES):
        if frame is None:
            break
        append(frame.f_code)
        append(frame.f_lasti)
        frame = frame.f_back
    return frames


class History:
    """The process's recording: the ring of events (``max_entries`` kept, the oldest dropped first) and the live
    allocations; ``stacks``: ``"python"`` (each allocation's stack) or ``"none"``."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python"):
        self.ring: deque[tuple] = deque(maxlen=max_entries)  # the events, Entry's fields as plain tuples
        self.open: dict[tuple, tuple] = {}  # (device, address or CUdeviceptr) -> its alloc event, while live
        self.stacks = stacks

    @property
    def max_entries(self) -> int:
        """Events the ring keeps."""
        return self.ring.maxlen

    @property
    def entries(self) -> list[Entry]:
        """The events recorded, oldest first (a copy)."""
        return list(map(_as_entry, self.ring.copy()))

    @property
    def live(self) -> dict[tuple[int, int], Entry]:
        """``(device, address)`` -> the alloc event of each allocation alive now (a copy)."""
        return {(device, int(address)): _as_entry(event) for (device, address), event in self.open.copy().items()}

    def capture(self, skip: int = 2) -> list:
        """The thread's stack from ``skip`` frames up, innermost first, flat (``[code, offset, ...]``, :func:`pairs`);
        ``()`` with stacks off (Note [Stack walks])."""
        if self.stacks != "python":
            return ()
        return _walk(sys._getframe(skip))

    def record(self, action: str, device: int, address: int, size: int, stream: int, kind: str,
               frames=(), device_free: int = 0) -> tuple:
        event = (action, device, address, size, stream, kind, _thread(), _now(), frames, device_free)
        self.ring.append(event)
        return event

    def allocated(self, device: int, address: int, size: int, stream: int, kind: str, frames) -> tuple:
        """Record an allocation alive from now on; returns its event (for :meth:`release_recorded`)."""
        event = self.open[(device, address)] = self.record("alloc", device, address, size, stream, kind, frames)
        return event

    def release_recorded(self, deferral, alloc: tuple, release: Callable[[], None]) -> None:
        """Run ``release`` (the pointer's), then record one ``free`` event for ``alloc``, or ``free_requested`` now
        and ``free_completed`` later while ``deferral`` holds releases back.  Never raises (a finalizer)."""
        self.open.pop((alloc[1], alloc[2]), None)
        release()
        if deferral is None or not deferral.depth:
            self.ring.append(("free", alloc, _now()))
            return
        self.ring.append(("free_requested", alloc, _now()))
        completed = partial(self.freed_later, alloc)
        if not deferral.defer(completed):
            completed()

    def freed_later(self, alloc: tuple) -> None:
        """The ``free_completed`` event of a release that ``defer_cleanup`` held back."""
        self.ring.append(("free_completed", alloc, _now()))


def new_recording(max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python") -> History:
    """A new, empty recording, its arguments checked.
    :raises ValueError: for ``max_entries`` outside [1, 2**63) (NumPy integers taken) or ``stacks`` another string."""
    if not isinstance(max_entries, numbers.Integral) or isinstance(max_entries, bool) or not 0 < max_entries < 1 << 63:
        raise ValueError(f"numba_pool.record_history: max_entries={max_entries!r} must be a positive number of events "
                         "below 2**63")
    if stacks not in STACKS:
        raise ValueError(f"numba_pool.record_history: stacks={stacks!r} must be one of {', '.join(map(repr, STACKS))}")
    return History(int(max_entries), stacks)


class RecordedAllocations:
    """The recording adaptor over ``upstream`` (bytes -> ``PoolPointer``): allocations (with stacks), releases and
    out-of-memory errors (then ``on_oom(device, size, error)``) into ``history``.  ``kind``: ``"device"`` (per
    allocation ``scratch``, or ``arena`` up to ``arena_limit`` bytes, -1: no arena) or ``"managed"``; ``deferral``: the
    manager's ``defer_cleanup`` state; ``device_free``: ``() -> free bytes`` of the device, for ``oom`` entries;
    ``skip``: numba_pool frames above this adaptor (1 from Numba, 2 through ``memallocmanaged``)."""

    def __init__(self, upstream: Callable[[int], PoolPointer], history: History, device: int, kind: str, *,
                 arena_limit: int = -1, deferral=None,
                 device_free: Callable[[], int] = lambda: 0, on_oom: Callable | None = None, skip: int = 1):
        self._upstream = upstream
        self._skip = skip + 1
        self._history = history
        self._device = device
        self._kind = kind
        self._arena_limit = arena_limit
        self._deferral = deferral
        self._device_free = device_free
        self._on_oom = on_oom
        self._released = partial(history.release_recorded, deferral)  # made once, not per allocation

    def allocate(self, size: int) -> PoolPointer:
        """``size`` bytes from upstream, recorded with the caller's stack.
        :raises CudaAPIError: upstream's; out of memory with the largest holders named."""
        history = self._history  # History.capture inlined below: a call less per allocation (Note [Stack walks])
        frames = _walk(sys._getframe(self._skip - 1)) if history.stacks == "python" else ()
        ref = per_thread.stream if scopes_entered else LEGACY
        stream = ref.value
        kind = self._kind
        if kind == "device":
            kind = "scratch" if ref.scratch is not None else "arena" if size <= self._arena_limit else "device"
        try:
            mem = self._upstream(size)
        except CudaAPIError as err:
            if err.code != OUT_OF_MEMORY:
                raise
            raise self._out_of_memory(size, stream, kind, frames, err) from None
        pointer = mem.device_pointer  # the CUdeviceptr, int() when read (History.entries)
        if mem.captured:  # rule 13: an allocation node of a capture
            kind = "graph"
        device = self._device
        event = ("alloc", device, pointer, size, stream, kind, _thread(), _now(), frames, 0)
        history.ring.append(event)
        history.open[(device, pointer)] = event
        mem.wrap_release(self._released, event)
        return mem

    def _out_of_memory(self, size: int, stream: int, kind: str, frames: tuple, err: CudaAPIError) -> CudaAPIError:
        try:
            free = self._device_free()
        except CudaAPIError:
            free = 0
        self._history.record("oom", self._device, 0, size, stream, kind, frames, free)
        sites = top_sites(self._history, self._device, limit=3)
        held = "; ".join(f"{site} holds {_size(nbytes)} in {count} array{'s' * (count != 1)}"
                         for site, nbytes, count in sites)
        error = api_error(err.code, f"{err.msg}; largest holders (numba_pool.record_history): {held or 'none recorded'}")
        if self._on_oom is not None:
            self._on_oom(self._device, size, error)
        return error


_SKIP: tuple[str, ...] = ()


def skipped_dirs() -> tuple[str, ...]:
    """The folders of numba_pool, numba, numba-cuda and Numba-CUDA-MLIR (frames there are not the user's)."""
    global _SKIP
    if not _SKIP:
        dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        for name in ("numba", "numba_cuda", "numba_cuda_mlir"):
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__file__", None):
                dirs.append(os.path.dirname(os.path.abspath(module.__file__)))
        _SKIP = tuple(d + os.sep for d in dirs)
    return _SKIP


#: Path parts that mark a frame as Numba's or numba_pool's in a dump from any machine.
PACKAGE_FOLDERS = tuple(f"{os.sep}{package}{os.sep}" for package in ("numba", "numba_cuda", "numba_cuda_mlir",
                                                                      "numba_pool"))
_EXAMPLES = f"{os.sep}numba_pool{os.sep}kernels{os.sep}"  #: Example kernels and scripts: user code when naming a site.


def is_library_frame(filename: str) -> bool:
    """Whether a frame's file is numba_pool's (not its example kernels) or Numba's: in this process's folders
    (:func:`skipped_dirs`), or in a dump from elsewhere, under a package-named folder."""
    if _EXAMPLES in filename:
        return False
    return filename.startswith(skipped_dirs()) or any(part in filename for part in PACKAGE_FOLDERS)


_line_tables: dict = {}  # code object -> (offsets, lines): its line table, read once


def pairs(frames) -> list[tuple]:
    """``(code, offset)`` pairs of a captured stack (:meth:`History.capture`), innermost first."""
    return list(zip(frames[::2], frames[1::2]))


def line_of(code, offset: int) -> int:
    """The source line of bytecode ``offset`` in ``code`` (``co_lines()``, cached per code object), or 0."""
    table = _line_tables.get(code)
    if table is None:
        ranges = [(start, line) for start, _, line in code.co_lines()]
        table = _line_tables[code] = ([start for start, _ in ranges], [line or 0 for _, line in ranges])
    i = bisect.bisect_right(table[0], offset) - 1
    return table[1][i] if i >= 0 else code.co_firstlineno


def site_of(frames: tuple) -> str:
    """``file:line`` of the innermost frame outside numba_pool and Numba (else the innermost), or ``"<no stack>"``."""
    stack = pairs(frames)
    for code, offset in stack:
        if not is_library_frame(code.co_filename):
            return f"{code.co_filename}:{line_of(code, offset)}"
    if stack:
        code, offset = stack[0]
        return f"{code.co_filename}:{line_of(code, offset)}"
    return "<no stack>"


def resolve(frames: tuple) -> list[dict]:
    """Frames as PyTorch's snapshot has them, innermost first: ``[{"filename", "line", "name"}]``, read now."""
    return [{"filename": code.co_filename, "line": line_of(code, offset), "name": code.co_name}
            for code, offset in pairs(frames)]


def live_by_site(history: History, device: int | None = None) -> dict[str, list[Entry]]:
    """The live allocations (of ``device``, or every device) grouped by allocation site."""
    groups: dict[str, list[Entry]] = {}
    for event in history.open.copy().values():  # not History.live: its int keys could merge two
        entry = _as_entry(event)
        if device is None or entry.device == device:
            groups.setdefault(site_of(entry.frames), []).append(entry)
    return groups


def top_sites(history: History, device: int | None = None, limit: int | None = None) -> list[tuple[str, int, int]]:
    """``(site, bytes, allocations)`` held now, most bytes first."""
    rows = [(site, sum(e.size for e in entries), len(entries))
            for site, entries in live_by_site(history, device).items()]
    rows.sort(key=lambda row: (-row[1], -row[2], row[0]))
    return rows[:limit]


def _size(nbytes: int) -> str:
    """``"2.93 KiB (3000 bytes)"``; below 1 KiB ``"1000 bytes"``."""
    import humanfriendly
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)" if nbytes >= 1024 else f"{nbytes} bytes"
