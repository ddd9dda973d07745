"""A test-only model of CUDA stream ordering and of the stream-ordered memory pool.

:class:`CudaModel` stands in for the module ``cuda.bindings.driver``: numba_pool runs unchanged
against it (``cu.cuMemAllocFromPoolAsync(...)`` and so on), with no GPU.  The model keeps a
*happens-before* relation over every GPU operation and checks, for each 256-byte granule of
device memory, that a new owner's use is ordered after the previous owner's last uses.  An
unordered reuse is a :class:`Violation`, naming both owners, both streams and both call sites.

What is modelled
----------------
* **Streams** (CUDA Driver API, "Stream synchronization behavior"): the legacy default stream
  (handle 0 or ``CU_STREAM_LEGACY``), the per-thread default stream of each host thread
  (``CU_STREAM_PER_THREAD``, a blocking stream), blocking streams (``CU_STREAM_DEFAULT``: an
  operation on the legacy stream waits for all earlier work of every blocking stream, and later
  work of a blocking stream waits for it) and non-blocking streams (``CU_STREAM_NON_BLOCKING``:
  no implicit ordering).  Every operation gets a vector clock over stream *ids*; the ids are
  never reused, while stream handles are (LIFO, as the driver may do).
* **Events**: ``cuStreamWaitEvent`` orders the stream after the event's most recent record *at
  the time of the call*; waiting on a never-recorded event is a no-op.
* **Host knowledge**: ``cuStreamSynchronize`` / ``cuEventSynchronize`` / ``cuCtxSynchronize``
  add what they cover to the host's vector clock, which every later operation joins.
* **The pool** ("Stream Ordered Memory Allocator"): a block freed on stream F is reused by an
  allocation on stream S only when S is F, or the free is known complete to the host, or S's
  next operation is ordered after the free through events or the legacy stream's implicit
  ordering (``CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES``).  Reuse is eager: the most
  recently freed eligible block wins over fresh address space, split when larger.  Reserved /
  used bytes, high watermarks, ``maxSize``, the release threshold (trimmed at every
  synchronize) and ``cuMemPoolTrimTo`` are modelled.

What is deliberately conservative (stricter than the driver), and why
---------------------------------------------------------------------
* ``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`` is not modelled: the real driver may
  reuse a block on another stream by *inserting* a dependency; the model never does, so it
  never hides a missing dependency of the allocator under test behind one of its own.
* ``CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`` (reuse when the free happens to have finished on
  the device) is modelled only as "the host *knows* it finished" (a synchronize covered it):
  timing never makes a program legal.
* Synchronizing one stream teaches the host only about that stream's work and what it was
  ordered after; synchronizing the legacy stream is not assumed to wait for blocking streams
  unless an operation on it did.
* Work left on a destroyed stream still runs (its operations stay in the relation), but by
  default later legacy-stream operations are *not* assumed to wait for it (the driver documents
  no such ordering); ``CudaModel(legacy_waits_for_destroyed=True)`` assumes they do.
* A handle reused for a new stream is a new stream: nothing on it is ordered after the old
  stream's work.

* **The current context**: one context, current in every thread unless the thread called
  :meth:`CudaModel.leave_context` (a thread that never used CUDA); there, every call but
  ``cuDevice*`` and the context stack's (``cuCtxGetCurrent``/``PushCurrent``/``PopCurrent``)
  fails with ``CUDA_ERROR_INVALID_CONTEXT``, as the driver's do.
* **Pinned host memory** (``cuMemHostAlloc`` ...): see :class:`_HostCalls`; the host's own
  uses are ops of a pseudo stream, the host, ordered after what it has observed complete.

Model-only API for tests: :meth:`CudaModel.launch`, :meth:`CudaModel.copy_async`,
:meth:`CudaModel.host_use`, :meth:`CudaModel.host_stats`, :attr:`CudaModel.violations`,
:meth:`CudaModel.tail`, :meth:`CudaModel.would_follow`, :meth:`CudaModel.wait`,
:attr:`CudaModel.preempt`, :meth:`CudaModel.stats`, :meth:`CudaModel.leave_context`.
"""

from __future__ import annotations

import bisect
import functools
import os
import re
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Optional

from cuda.bindings import driver as _cu

_R = _cu.CUresult
SUCCESS = _R.CUDA_SUCCESS
_ATTR = _cu.CUmemPool_attribute
#: Ownership is tracked per granule of this many bytes (the pool's alignment).
GRANULE = 256
LEGACY_HANDLES = (0, int(_cu.CU_STREAM_LEGACY))
PER_THREAD_HANDLE = int(_cu.CU_STREAM_PER_THREAD)
_DRIVER_FUNCTION = re.compile(r"cu[A-Z]")
_THIS_FILE = os.path.normcase(os.path.abspath(__file__))


def _round_up(nbytes: int) -> int:
    return (nbytes + GRANULE - 1) // GRANULE * GRANULE


def _handle(x: Any) -> int:
    """A handle given as a cuda-python object or a plain int (None: 0)."""
    return 0 if x is None else int(x)


def _call_site() -> str:
    """``file:line function`` of the nearest frame outside this file."""
    frame = sys._getframe(1)
    while frame is not None and os.path.normcase(os.path.abspath(frame.f_code.co_filename)) == _THIS_FILE:
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    try:
        rel = os.path.relpath(name)
        name = rel if not rel.startswith("..") else name
    except ValueError:
        pass
    return f"{name}:{frame.f_lineno} {frame.f_code.co_name}"


# --------------------------------------------------------------------------- happens-before


@dataclass(frozen=True, eq=False)
class Op:
    """One GPU operation: the ``seq``-th on the stream with id ``stream_id``; ``vc`` is its
    vector clock (stream id -> highest seq of that stream ordered before or at this op)."""

    stream_id: int
    seq: int
    vc: dict
    kind: str
    handle: int

    def __repr__(self) -> str:
        return f"Op({self.kind} #{self.seq} on stream id {self.stream_id})"


def join(into: dict, other: dict) -> None:
    """``into`` := the component-wise maximum of ``into`` and ``other``."""
    for key, seq in other.items():
        if into.get(key, 0) < seq:
            into[key] = seq


def op_a_precedes(op: Op, vc: dict) -> bool:
    """True when ``op`` happens before (or is) the operation whose vector clock is ``vc``."""
    return vc.get(op.stream_id, 0) >= op.seq


@dataclass(eq=False)
class _Stream:
    id: int
    handle: int
    blocking: bool
    legacy: bool = False
    per_thread: bool = False
    seq: int = 0
    last: Optional[Op] = None
    alive: bool = True

    @property
    def last_vc(self) -> dict:
        return self.last.vc if self.last is not None else {}


#: The pseudo stream of host (CPU) uses of pinned memory: its id and handle are never a stream's.
HOST_ID = 0
HOST_HANDLE = -1


def describe_stream(handle: Optional[int], stream_id: Optional[int]) -> str:
    if handle is None:
        return "?"
    if handle == HOST_HANDLE:
        return "the host (CPU)"
    if handle in LEGACY_HANDLES:
        return f"legacy stream (id {stream_id})"
    if handle == PER_THREAD_HANDLE:
        return f"per-thread stream (id {stream_id})"
    return f"stream {handle:#x} (id {stream_id})"


class _Streams:
    """Stream handles and ids, the per-stream last operation and the host's vector clock.

    Ordering rules (CUDA Driver API, "Stream synchronization behavior"): a new op on stream S
    is ordered after S's last op, after everything the host has seen complete, and

    * on the legacy stream: after the last op of every blocking stream (``CU_STREAM_DEFAULT``
      streams and every per-thread default stream);
    * on a blocking stream: after the legacy stream's last op;
    * on a non-blocking stream: nothing more.
    """

    FIRST_HANDLE, HANDLE_STEP = 0x1000, 0x10

    def __init__(self, tls: threading.local, legacy_waits_for_destroyed: bool):
        self._tls = tls
        self._waits_for_destroyed = legacy_waits_for_destroyed
        self.host_vc: dict = {}
        self.by_id: dict[int, _Stream] = {}
        self._blocking: dict[int, _Stream] = {}  # the streams a legacy-stream op waits for
        self._by_handle: dict[int, _Stream] = {}
        self._free_handles: list[int] = []
        self._next_handle = self.FIRST_HANDLE
        self._next_id = 1
        self.legacy = self._new(LEGACY_HANDLES[1], blocking=True, legacy=True)

    def _new(self, handle: int, blocking: bool, **kind: bool) -> _Stream:
        stream = _Stream(self._next_id, handle, blocking, **kind)
        self._next_id += 1
        self.by_id[stream.id] = stream
        if blocking and not stream.legacy:
            self._blocking[stream.id] = stream
        return stream

    def create(self, blocking: bool) -> _Stream:
        """A new stream, on the most recently freed handle if any (LIFO)."""
        if self._free_handles:
            handle = self._free_handles.pop()
        else:
            handle, self._next_handle = self._next_handle, self._next_handle + self.HANDLE_STEP
        stream = self._by_handle[handle] = self._new(handle, blocking)
        return stream

    def destroy(self, stream: _Stream) -> None:
        """Its handle becomes free; its enqueued work stays in the relation."""
        stream.alive = False
        del self._by_handle[stream.handle]
        if not self._waits_for_destroyed:
            self._blocking.pop(stream.id, None)
        self._free_handles.append(stream.handle)

    def resolve(self, handle: int) -> Optional[_Stream]:
        """The stream a handle means for the calling thread now; None when invalid."""
        if handle in LEGACY_HANDLES:
            return self.legacy
        if handle == PER_THREAD_HANDLE:
            stream = getattr(self._tls, "per_thread", None)
            if stream is None:  # one per host thread (threading.local: a new thread, a new one)
                stream = self._tls.per_thread = self._new(PER_THREAD_HANDLE, blocking=True, per_thread=True)
            return stream
        return self._by_handle.get(handle)

    def _implicit(self, stream: _Stream) -> Iterable[_Stream]:
        if stream.legacy:
            return self._blocking.values()
        return [self.legacy] if stream.blocking else []

    def next_vc(self, stream: _Stream) -> dict:
        """The vector clock (less its own component) of an op enqueued on ``stream`` now."""
        vc = dict(stream.last_vc)
        join(vc, self.host_vc)
        for other in self._implicit(stream):
            join(vc, other.last_vc)
        return vc

    def new_op(self, stream: _Stream, kind: str, extra: Iterable[dict] = ()) -> Op:
        """Enqueue one op on ``stream``, also ordered after each vector clock in ``extra``."""
        vc = self.next_vc(stream)
        for other in extra:
            join(vc, other)
        stream.seq += 1
        vc[stream.id] = stream.seq
        stream.last = Op(stream.id, stream.seq, vc, kind, stream.handle)
        return stream.last

    def host_learns(self, vc: dict) -> None:
        """The host has seen every op ordered before ``vc`` complete."""
        join(self.host_vc, vc)

    def host_learns_all(self) -> None:
        for stream in self.by_id.values():
            join(self.host_vc, stream.last_vc)

    def complete(self, op: Op) -> bool:
        return op_a_precedes(op, self.host_vc)


@dataclass(eq=False)
class _Event:
    handle: int
    record: Optional[Op] = None


class _Events:
    """Event handles (reused LIFO) and each event's most recent record."""

    FIRST_HANDLE, HANDLE_STEP = 0x50000, 0x10

    def __init__(self):
        self._by_handle: dict[int, _Event] = {}
        self._free_handles: list[int] = []
        self._next_handle = self.FIRST_HANDLE

    def create(self) -> _Event:
        if self._free_handles:
            handle = self._free_handles.pop()
        else:
            handle, self._next_handle = self._next_handle, self._next_handle + self.HANDLE_STEP
        event = self._by_handle[handle] = _Event(handle)
        return event

    def resolve(self, handle: int) -> Optional[_Event]:
        return self._by_handle.get(handle)

    def destroy(self, event: _Event) -> None:
        del self._by_handle[event.handle]
        self._free_handles.append(event.handle)


# --------------------------------------------------------------------------- violations


@dataclass
class Violation:
    """A broken rule: ``kind`` is ``"unordered reuse"``, ``"use of unallocated memory"``,
    ``"invalid stream"``, ``"invalid event"``, ``"invalid pool"`` or ``"free of unknown pointer
    / double free"``.  ``start``/``end`` is the address range concerned (0, 0 if none)."""

    kind: str
    start: int = 0
    end: int = 0
    prev_owner: Any = None
    prev_stream: Optional[int] = None
    prev_stream_id: Optional[int] = None
    prev_site: Optional[str] = None
    new_owner: Any = None
    new_stream: Optional[int] = None
    new_stream_id: Optional[int] = None
    new_site: Optional[str] = None
    detail: str = ""

    def __str__(self) -> str:
        where = f" [{self.start:#x}, {self.end:#x}) ({self.end - self.start} B)" if self.end > self.start else ""
        text = f"{self.kind}{where}" + (f": {self.detail}" if self.detail else "")
        if self.prev_owner is not None or self.prev_site is not None:
            text += (f"\n  previous owner {self.prev_owner!r} on "
                     f"{describe_stream(self.prev_stream, self.prev_stream_id)} at {self.prev_site};")
        new = f"new owner {self.new_owner!r} on " if self.new_owner is not None else "on "
        return text + f"\n  {new}{describe_stream(self.new_stream, self.new_stream_id)} at {self.new_site}"


@dataclass(frozen=True, eq=False)
class _Use:
    op: Op
    owner: Hashable
    site: str


class _Seg:
    __slots__ = ("start", "end", "owner", "frontier")

    def __init__(self, start: int, end: int, owner: Hashable, frontier: tuple):
        self.start, self.end, self.owner, self.frontier = start, end, owner, frontier

    def same_state(self, other: "_Seg") -> bool:
        return (self.end == other.start and self.owner == other.owner
                and len(self.frontier) == len(other.frontier)
                and all(a is b for a, b in zip(self.frontier, other.frontier)))


class _Granules:
    """Owner and use frontier of every granule ever used, as an interval map (sorted,
    disjoint segments of uniform state; bisect on their starts), so 64 MiB arrays are cheap.

    The frontier of a segment holds its owner's maximal uses: a new use of the same owner
    drops the uses it is ordered after.  A new owner must be ordered after all of them.
    """

    def __init__(self):
        self._starts: list[int] = []
        self._segs: list[_Seg] = []

    def __len__(self) -> int:
        return len(self._segs)

    def _split_at(self, x: int) -> None:
        i = bisect.bisect_right(self._starts, x) - 1
        if i >= 0 and self._segs[i].start < x < self._segs[i].end:
            seg = self._segs[i]
            self._segs.insert(i + 1, _Seg(x, seg.end, seg.owner, seg.frontier))
            self._starts.insert(i + 1, x)
            seg.end = x

    def _merge_at(self, i: int) -> None:
        """Merge segment i into segment i-1 when they are contiguous with the same state."""
        if 0 < i < len(self._segs) and self._segs[i - 1].same_state(self._segs[i]):
            self._segs[i - 1].end = self._segs[i].end
            del self._segs[i], self._starts[i]

    @staticmethod
    def _update(seg: _Seg, use: _Use, conflicts: list) -> None:
        vc = use.op.vc
        if seg.owner != use.owner:
            for prev in seg.frontier:
                if not op_a_precedes(prev.op, vc):
                    last = conflicts[-1] if conflicts else None
                    if last is not None and last[2] is prev and last[1] == seg.start:
                        last[1] = seg.end
                    else:
                        conflicts.append([seg.start, seg.end, prev])
            seg.owner, seg.frontier = use.owner, (use,)
        else:
            seg.frontier = tuple(u for u in seg.frontier if not op_a_precedes(u.op, vc)) + (use,)

    def use(self, lo: int, hi: int, use: _Use) -> list:
        """Record ``use`` of granules [lo, hi); return ``[start, end, previous_use]`` for each
        range whose previous owner's use is not ordered before it."""
        self._split_at(lo)
        self._split_at(hi)
        i0, i1 = bisect.bisect_left(self._starts, lo), bisect.bisect_left(self._starts, hi)
        conflicts: list = []
        region: list[_Seg] = []
        pos = lo
        for seg in self._segs[i0:i1]:
            if pos < seg.start:
                region.append(_Seg(pos, seg.start, use.owner, (use,)))
            self._update(seg, use, conflicts)
            region.append(seg)
            pos = seg.end
        if pos < hi:
            region.append(_Seg(pos, hi, use.owner, (use,)))
        merged = [region[0]]
        for seg in region[1:]:
            if merged[-1].same_state(seg):
                merged[-1].end = seg.end
            else:
                merged.append(seg)
        self._segs[i0:i1] = merged
        self._starts[i0:i1] = [s.start for s in merged]
        self._merge_at(i0 + len(merged))
        self._merge_at(i0)
        return conflicts


# --------------------------------------------------------------------------- memory


@dataclass(eq=False)
class _Piece:
    """A free block of a pool: freed by ``free_op``; ``order`` grows with each free."""

    base: int
    size: int
    free_op: Op
    order: int


@dataclass(eq=False)
class _Allocation:
    base: int
    size: int
    pool: "_Pool"
    op: Op
    site: str


class _AddressSpace:
    """Device virtual addresses: unmapped holes are reused first (first fit), then new
    addresses are taken above everything handed out so far."""

    def __init__(self, base: int):
        self._next = base
        self._holes: list[list[int]] = []  # sorted, disjoint, coalesced [start, end)

    def map(self, nbytes: int) -> int:
        for i, hole in enumerate(self._holes):
            if hole[1] - hole[0] >= nbytes:
                base = hole[0]
                hole[0] += nbytes
                if hole[0] == hole[1]:
                    del self._holes[i]
                return base
        base, self._next = self._next, self._next + nbytes
        return base

    def unmap(self, base: int, nbytes: int) -> None:
        i = bisect.bisect_left(self._holes, [base, base])
        self._holes.insert(i, [base, base + nbytes])
        for j in (i + 1, i):
            if 0 < j < len(self._holes) and self._holes[j - 1][1] == self._holes[j][0]:
                self._holes[j - 1][1] = self._holes[j][1]
                del self._holes[j]


class _Pool:
    """One memory pool: its free pieces and its accounting (``CU_MEMPOOL_ATTR_*``).

    reserved = live bytes + free pieces not unmapped; used = live bytes."""

    def __init__(self, handle: int, max_size: int, is_default: bool):
        self.handle, self.max_size, self.is_default = handle, max_size, is_default
        self.alive = True
        self.threshold = 0
        self.reserved = self.used = self.reserved_high = self.used_high = 0
        self.pieces: list[_Piece] = []

    def note_high(self) -> None:
        self.reserved_high = max(self.reserved_high, self.reserved)
        self.used_high = max(self.used_high, self.used)

    def take(self, nbytes: int, eligible: Callable[[_Piece], bool]) -> Optional[tuple[int, list[_Piece]]]:
        """Carve ``nbytes`` out of eligible free pieces, the most recently freed first: one
        piece large enough, else a run of address-contiguous eligible pieces.  Returns the base
        and the pieces used (as they were), or None."""
        ok = [p for p in self.pieces if eligible(p)]
        single = [p for p in ok if p.size >= nbytes]
        if single:
            run = [max(single, key=lambda p: p.order)]
        else:
            run = self._best_run(ok, nbytes)
            if run is None:
                return None
        base, used, need = run[0].base, [], nbytes
        for piece in run:
            part = min(need, piece.size)
            used.append(_Piece(piece.base, part, piece.free_op, piece.order))
            piece.base, piece.size, need = piece.base + part, piece.size - part, need - part
            if piece.size == 0:
                self.pieces.remove(piece)
        self.used += nbytes
        self.note_high()
        return base, used

    @staticmethod
    def _best_run(ok: list[_Piece], nbytes: int) -> Optional[list[_Piece]]:
        runs: list[list[_Piece]] = []
        for piece in sorted(ok, key=lambda p: p.base):
            if runs and runs[-1][-1].base + runs[-1][-1].size == piece.base:
                runs[-1].append(piece)
            else:
                runs.append([piece])
        fits = []
        for run in runs:  # the shortest prefix of each run that is large enough
            total = 0
            for k, piece in enumerate(run):
                total += piece.size
                if total >= nbytes:
                    fits.append(run[:k + 1])
                    break
        return max(fits, key=lambda r: max(p.order for p in r), default=None)

    def trim(self, keep: int, complete: Callable[[Op], bool], space: _AddressSpace) -> int:
        """Unmap free pieces whose free is known complete, oldest first, until reserved <=
        ``keep``; return the bytes unmapped."""
        unmapped = 0
        for piece in sorted(self.pieces, key=lambda p: p.order):
            if self.reserved <= keep:
                break
            if complete(piece.free_op):
                self.pieces.remove(piece)
                self.reserved -= piece.size
                unmapped += piece.size
                space.unmap(piece.base, piece.size)
        return unmapped


class _Memory:
    """All pools, the live allocations (sorted by address) and the device's capacity."""

    FIRST_POOL_HANDLE, POOL_HANDLE_STEP = 0x9000, 0x10

    def __init__(self, device_total: int, base_address: int):
        self.device_total = device_total
        self.space = _AddressSpace(base_address)
        self.pools: dict[int, _Pool] = {}  # alive, by handle
        self.dying: list[_Pool] = []  # destroyed with memory still reserved
        self.default: Optional[_Pool] = None
        self._next_handle = self.FIRST_POOL_HANDLE
        self._live_starts: list[int] = []
        self.live: dict[int, _Allocation] = {}
        self._free_order = 0

    def create_pool(self, max_size: int, is_default: bool = False) -> _Pool:
        pool = self.pools[self._next_handle] = _Pool(self._next_handle, max_size, is_default)
        self._next_handle += self.POOL_HANDLE_STEP
        return pool

    def destroy_pool(self, pool: _Pool) -> None:
        pool.alive = False
        del self.pools[pool.handle]
        self.dying.append(pool)

    def all_pools(self) -> list[_Pool]:
        return list(self.pools.values()) + self.dying

    def total_reserved(self) -> int:
        return sum(p.reserved for p in self.all_pools())

    def fits(self, pool: _Pool, nbytes: int) -> bool:
        if pool.max_size and pool.reserved + nbytes > pool.max_size:
            return False
        return self.total_reserved() + nbytes <= self.device_total

    def map_fresh(self, pool: _Pool, nbytes: int) -> int:
        pool.reserved += nbytes
        pool.used += nbytes
        pool.note_high()
        return self.space.map(nbytes)

    def add_live(self, alloc: _Allocation) -> None:
        bisect.insort(self._live_starts, alloc.base)
        self.live[alloc.base] = alloc

    def free(self, base: int, op: Op) -> Optional[_Allocation]:
        """Turn the live allocation at ``base`` into a free piece of its pool."""
        alloc = self.live.pop(base, None)
        if alloc is None:
            return None
        del self._live_starts[bisect.bisect_left(self._live_starts, base)]
        self._free_order += 1
        alloc.pool.pieces.append(_Piece(base, alloc.size, op, self._free_order))
        alloc.pool.used -= alloc.size
        return alloc

    def find(self, address: int) -> Optional[_Allocation]:
        i = bisect.bisect_right(self._live_starts, address) - 1
        if i >= 0:
            alloc = self.live[self._live_starts[i]]
            if address < alloc.base + alloc.size:
                return alloc
        return None

    def uncovered(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The parts of [lo, hi) outside every live allocation."""
        gaps, pos = [], lo
        i = max(0, bisect.bisect_right(self._live_starts, lo) - 1)
        while pos < hi and i < len(self._live_starts):
            alloc = self.live[self._live_starts[i]]
            if alloc.base > pos:
                gaps.append((pos, min(alloc.base, hi)))
            pos = max(pos, alloc.base + alloc.size)
            i += 1
        if pos < hi:
            gaps.append((pos, hi))
        return gaps

    def trim_pool(self, pool: _Pool, keep: int, complete: Callable[[Op], bool]) -> int:
        unmapped = pool.trim(keep, complete, self.space)
        if not pool.alive and pool.reserved == 0 and pool in self.dying:
            self.dying.remove(pool)
        return unmapped

    def trim_to_thresholds(self, complete: Callable[[Op], bool]) -> int:
        """What the driver does at each synchronize: every pool down to its release threshold
        (a destroyed pool down to 0)."""
        return sum(self.trim_pool(p, p.threshold if p.alive else 0, complete) for p in self.all_pools())


# --------------------------------------------------------------------------- driver calls


#: The one modelled context's handle.
CONTEXT = _cu.CUcontext(0xC0)
#: Driver functions that need no current context (the rest fail with
#: ``CUDA_ERROR_INVALID_CONTEXT`` in a thread that has none: see :meth:`CudaModel.leave_context`).
_CONTEXT_FREE = re.compile(r"cuDevice|cuCtxGetCurrent|cuCtxPushCurrent|cuCtxPopCurrent")
#: How many values each modelled function returns after its ``CUresult`` (default 0).
_VALUES = {"cuStreamCreate": 1, "cuStreamGetId": 1, "cuEventCreate": 1, "cuMemPoolCreate": 1,
           "cuMemPoolGetAttribute": 1, "cuMemAllocFromPoolAsync": 1, "cuMemGetInfo": 2,
           "cuPointerGetAttribute": 1, "cuMemHostAlloc": 1, "cuMemHostGetDevicePointer": 1,
           "cuCtxGetCurrent": 1, "cuCtxPopCurrent": 1}


def _driver(fn: Callable) -> Callable:
    """A modelled driver function: ``preempt("enter"/"exit", name)`` around it (outside the
    lock, not re-entered from inside preempt), the state change under the model's lock.  In a
    thread with no current context, a function that needs one fails with
    ``CUDA_ERROR_INVALID_CONTEXT`` and changes nothing."""
    name = fn.__name__
    needs_context = not _CONTEXT_FREE.match(name)
    refused = (_R.CUDA_ERROR_INVALID_CONTEXT,) + (None,) * _VALUES.get(name, 0)

    @functools.wraps(fn)
    def call(self: "CudaModel", *args: Any, **kwargs: Any):
        outer = self.preempt is not None and not getattr(self._tls, "in_preempt", False)
        if outer:
            self._run_preempt("enter", name)
        with self._lock:
            self._counts["driver_calls"] += 1
            if needs_context and not self._contexts():
                self._counts["no_context"] += 1
                result = refused
            else:
                result = fn(self, *args, **kwargs)
        if outer:
            self._run_preempt("exit", name)
        return result

    return call


class _StreamCalls:
    """Stream, event and synchronization driver functions."""

    @_driver
    def cuStreamCreate(self, flags: Any = 0):
        blocking = not (int(flags) & int(_cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        return SUCCESS, _cu.CUstream(self._streams.create(blocking).handle)

    @_driver
    def cuStreamDestroy(self, stream: Any):
        s = self._user_stream(stream, "cuStreamDestroy")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        self._streams.destroy(s)
        return (SUCCESS,)

    @_driver
    def cuStreamGetId(self, stream: Any):
        s = self._stream(stream, "cuStreamGetId")
        return (SUCCESS, s.id) if s is not None else (_R.CUDA_ERROR_INVALID_HANDLE, None)

    @_driver
    def cuStreamSynchronize(self, stream: Any):
        s = self._stream(stream, "cuStreamSynchronize")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        self._streams.host_learns(s.last_vc)
        self._after_sync()
        return (SUCCESS,)

    @_driver
    def cuCtxGetCurrent(self):
        stack = self._contexts()
        return SUCCESS, stack[-1] if stack else _cu.CUcontext(0)

    @_driver
    def cuCtxPushCurrent(self, context: Any):
        if int(context) != int(CONTEXT):
            return (_R.CUDA_ERROR_INVALID_CONTEXT,)
        self._tls.contexts = self._contexts() + [CONTEXT]
        return (SUCCESS,)

    @_driver
    def cuCtxPopCurrent(self):
        stack = self._contexts()
        if not stack:
            return _R.CUDA_ERROR_INVALID_CONTEXT, None
        self._tls.contexts = stack[:-1]
        return SUCCESS, stack[-1]

    @_driver
    def cuCtxSynchronize(self):
        self._streams.host_learns_all()
        self._after_sync()
        return (SUCCESS,)

    @_driver
    def cuEventCreate(self, flags: Any = 0):
        return SUCCESS, _cu.CUevent(self._events.create().handle)

    @_driver
    def cuEventDestroy(self, event: Any):
        e = self._event(event, "cuEventDestroy")
        if e is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        self._events.destroy(e)
        return (SUCCESS,)

    @_driver
    def cuEventRecord(self, event: Any, stream: Any = 0):
        e, s = self._event(event, "cuEventRecord"), self._stream(stream, "cuEventRecord")
        if e is None or s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        e.record = self._new_op(s, "event record")
        return (SUCCESS,)

    @_driver
    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: Any = 0):
        """Orders ``stream`` after the event's record as it is now; never recorded: no-op."""
        s, e = self._stream(stream, "cuStreamWaitEvent"), self._event(event, "cuStreamWaitEvent")
        if e is None or s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if e.record is not None:
            self._new_op(s, "stream wait", extra=(e.record.vc,))
        return (SUCCESS,)

    @_driver
    def cuEventSynchronize(self, event: Any):
        e = self._event(event, "cuEventSynchronize")
        if e is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if e.record is not None:
            self._streams.host_learns(e.record.vc)
        self._after_sync()
        return (SUCCESS,)

    @_driver
    def cuEventQuery(self, event: Any):
        """SUCCESS only when the host already knows the recorded work is complete."""
        e = self._event(event, "cuEventQuery")
        if e is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if e.record is None or self._streams.complete(e.record):
            return (SUCCESS,)
        return (_R.CUDA_ERROR_NOT_READY,)


class _MemoryCalls:
    """Memory pool and allocation driver functions."""

    _HIGH = {_ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: ("reserved_high", "reserved"),
             _ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH: ("used_high", "used")}
    _READ = {_ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: "threshold",
             _ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: "reserved",
             _ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: "reserved_high",
             _ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT: "used",
             _ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH: "used_high"}

    @_driver
    def cuMemPoolCreate(self, props: Any):
        if props is None:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        pool = self._memory.create_pool(int(getattr(props, "maxSize", 0) or 0))
        return SUCCESS, _cu.CUmemoryPool(pool.handle)

    @_driver
    def cuDeviceGetDefaultMemPool(self, device: Any):
        if _handle(device) != 0:
            return _R.CUDA_ERROR_INVALID_DEVICE, None
        if self._memory.default is None:
            self._memory.default = self._memory.create_pool(0, is_default=True)
        return SUCCESS, _cu.CUmemoryPool(self._memory.default.handle)

    @_driver
    def cuMemPoolDestroy(self, pool: Any):
        p = self._pool(pool, "cuMemPoolDestroy")
        if p is None or p.is_default:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._memory.destroy_pool(p)
        self._memory.trim_pool(p, 0, self._streams.complete)
        return (SUCCESS,)

    @_driver
    def cuMemPoolSetAttribute(self, pool: Any, attr: Any, value: Any):
        p = self._pool(pool, "cuMemPoolSetAttribute")
        if p is None:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        value = int(value)
        if attr == _ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            p.threshold = value
        elif attr in self._HIGH and value == 0:  # only a reset to the current value is allowed
            high, current = self._HIGH[attr]
            setattr(p, high, getattr(p, current))
        else:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        return (SUCCESS,)

    @_driver
    def cuMemPoolGetAttribute(self, pool: Any, attr: Any):
        p = self._pool(pool, "cuMemPoolGetAttribute")
        if p is None or attr not in self._READ:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, _cu.cuuint64_t(getattr(p, self._READ[attr]))

    @_driver
    def cuMemPoolTrimTo(self, pool: Any, keep_bytes: Any):
        p = self._pool(pool, "cuMemPoolTrimTo")
        if p is None:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._counts["unmapped_bytes"] += self._memory.trim_pool(p, int(keep_bytes), self._streams.complete)
        return (SUCCESS,)

    @_driver
    def cuMemAllocFromPoolAsync(self, size: Any, pool: Any, stream: Any):
        """0 bytes: ``CUDA_ERROR_INVALID_VALUE``, as ``cuMemAlloc`` documents (what the async
        call does is undocumented and differs between driver modes: the strict answer)."""
        s = self._stream(stream, "cuMemAllocFromPoolAsync")
        if s is None:
            return _R.CUDA_ERROR_INVALID_HANDLE, None
        p = self._pool(pool, "cuMemAllocFromPoolAsync")
        if p is None or int(size) <= 0:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        base = self._allocate(p, _round_up(int(size)), s)
        if base is None:
            self._counts["oom"] += 1
            return _R.CUDA_ERROR_OUT_OF_MEMORY, None
        return SUCCESS, _cu.CUdeviceptr(base)

    @_driver
    def cuMemFreeAsync(self, ptr: Any, stream: Any):
        s = self._stream(stream, "cuMemFreeAsync")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        base = _handle(ptr)
        if base not in self._memory.live:
            self._report("free of unknown pointer / double free", s, "cuMemFreeAsync", base, base + 1)
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._memory.free(base, self._new_op(s, "free"))
        self._counts["frees"] += 1
        return (SUCCESS,)

    @_driver
    def cuMemGetInfo(self):
        total = self._memory.device_total
        return SUCCESS, total - self._memory.total_reserved(), total

    @_driver
    def cuPointerGetAttribute(self, attribute: Any, ptr: Any):
        if attribute != _cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        alloc = self._memory.find(_handle(ptr))
        if alloc is None:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, alloc.pool.handle

    def _allocate(self, pool: _Pool, nbytes: int, s: _Stream) -> Optional[int]:
        """Eager reuse of an eligible free piece, else fresh memory (after unmapping this
        pool's completed free pieces when the cap is in the way); None: out of memory."""
        next_vc = self._streams.next_vc(s)

        def eligible(piece: _Piece) -> bool:
            # FOLLOW_EVENT_DEPENDENCIES (incl. legacy-stream ordering) and same-stream order;
            # ALLOW_OPPORTUNISTIC only once the host knows; no ALLOW_INTERNAL_DEPENDENCIES.
            op = piece.free_op
            return op.stream_id == s.id or self._streams.complete(op) or op_a_precedes(op, next_vc)

        taken = pool.take(nbytes, eligible)
        if taken is None:
            if not self._memory.fits(pool, nbytes):
                self._counts["unmapped_bytes"] += self._memory.trim_pool(pool, 0, self._streams.complete)
            if not self._memory.fits(pool, nbytes):
                return None
            base, pieces = self._memory.map_fresh(pool, nbytes), []
        else:
            base, pieces = taken
        op = self._new_op(s, "alloc")
        self._memory.add_live(_Allocation(base, nbytes, pool, op, _call_site()))
        self._count_alloc(pieces, s)
        return base

    def _count_alloc(self, pieces: list[_Piece], s: _Stream) -> None:
        self._counts["allocs"] += 1
        if not pieces:
            self._counts["fresh_allocs"] += 1
        elif all(p.free_op.stream_id == s.id for p in pieces):
            self._counts["reuse_same_stream"] += 1
        else:
            self._counts["reuse_cross_stream"] += 1
            if any(p.free_op.stream_id != s.id and not self._streams.complete(p.free_op) for p in pieces):
                self._counts["reuse_cross_stream_pending"] += 1


class _DeviceCalls:
    """The device queries numba_pool makes when it creates a pool: one device, whose mempools
    support POSIX file descriptor handles (``handle_types``), no peers."""

    handle_types = int(_cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)

    @_driver
    def cuDeviceGetCount(self):
        return SUCCESS, 1

    @_driver
    def cuDeviceCanAccessPeer(self, device: Any, peer: Any):
        if _handle(device) != 0 or _handle(peer) != 0:
            return _R.CUDA_ERROR_INVALID_DEVICE, None
        return SUCCESS, 0

    @_driver
    def cuDeviceGetAttribute(self, attr: Any, device: Any):
        if _handle(device) != 0:
            return _R.CUDA_ERROR_INVALID_DEVICE, None
        if attr == _cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
            return SUCCESS, self.handle_types
        if attr == _cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
            return SUCCESS, 1
        raise AttributeError(f"CudaModel does not model cuDeviceGetAttribute({attr!r})")

    @_driver
    def cuMemPoolSetAccess(self, pool: Any, descs: Any, count: Any):
        # Only the one device: a grant to another device is refused, as for a device that
        # does not exist.
        if self._pool(pool, "cuMemPoolSetAccess") is None or len(descs) != int(count):
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        if any(int(d.location.id) != 0 for d in descs):
            return (_R.CUDA_ERROR_INVALID_DEVICE,)
        return (SUCCESS,)


class _HostCalls:
    """Pinned host memory (``cuMemHostAlloc``/``cuMemFreeHost``/``cuMemHostGetDevicePointer``)
    and its uses.  A host block's uses are device ops (:meth:`CudaModel.copy_async`: an async
    copy, or a kernel touching mapped memory, on a stream) and *host* ops
    (:meth:`CudaModel.host_use`: the CPU reading or writing it), checked per granule like device
    memory.  A host op is ordered after a device op only when the host has observed that op
    complete (``cuEventQuery`` returning ``CUDA_SUCCESS`` for an event recorded after it,
    ``cuEventSynchronize``, ``cuStreamSynchronize``, ``cuCtxSynchronize``); device ops enqueued
    after a host op are ordered after it.  Mapped blocks: the device address is the host
    address (unified addressing).  ``cuMemFreeHost`` is not assumed to synchronize."""

    @_driver
    def cuMemHostAlloc(self, size: Any, flags: Any = 0):
        nbytes = int(size)
        if nbytes <= 0:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        if self._host_reserved + _round_up(nbytes) > self.host_total:
            self._counts["host_oom"] += 1
            return _R.CUDA_ERROR_OUT_OF_MEMORY, None
        nbytes = _round_up(nbytes)
        base = self._host_space.map(nbytes)
        self._host_live[base] = (nbytes, int(flags), _call_site())
        self._host_reserved += nbytes
        self._counts["host_allocs"] += 1
        return SUCCESS, base

    @_driver
    def cuMemFreeHost(self, ptr: Any):
        base = _handle(ptr)
        entry = self._host_live.pop(base, None)
        if entry is None:
            self._report("free of unknown pointer / double free", None, "cuMemFreeHost", base, base + 1)
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        self._host_reserved -= entry[0]
        self._host_space.unmap(base, entry[0])
        self._counts["host_frees"] += 1
        return (SUCCESS,)

    @_driver
    def cuMemHostGetDevicePointer(self, ptr: Any, flags: Any = 0):
        entry = self._host_find(_handle(ptr))
        if entry is None or int(flags) != 0 or not entry[1] & int(_cu.CU_MEMHOSTALLOC_DEVICEMAP):
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, _cu.CUdeviceptr(_handle(ptr))

    def _host_find(self, address: int):
        for base, entry in self._host_live.items():
            if base <= address < base + entry[0]:
                return entry
        return None

    def _check_host_use(self, s_handle: int, s_id: int, op: "Op", address: int, nbytes: int, owner: Hashable,
                        site: str) -> None:
        lo = address
        while lo < address + nbytes:  # every byte in a live host block
            base = next((b for b, e in self._host_live.items() if b <= lo < b + e[0]), None)
            if base is None:
                self.violations.append(Violation("use of unallocated host memory", lo, address + nbytes,
                                                 new_owner=owner, new_stream=s_handle, new_stream_id=s_id,
                                                 new_site=site))
                break
            lo = base + self._host_live[base][0]
        lo, hi = address // GRANULE * GRANULE, _round_up(address + nbytes)
        for start, end, prev in self._host_granules.use(lo, hi, _Use(op, owner, site)):
            self.violations.append(Violation(
                "unordered reuse of host memory", start, end, prev.owner, prev.op.handle, prev.op.stream_id,
                prev.site, owner, s_handle, s_id, site))

    def copy_async(self, stream: Any, address: int, nbytes: int, owner: Hashable,
                   site: Optional[str] = None) -> Optional["Op"]:
        """An async copy (or a kernel on mapped memory) on ``stream`` reading or writing host
        bytes [address, address + nbytes) for ``owner``: one op.  Returns it (None: invalid
        stream)."""
        site = site or _call_site()
        with self._lock:
            s = self._stream(stream, "copy_async")
            if s is None:
                return None
            op = self._new_op(s, "copy")
            self._counts["copies"] += 1
            self._check_host_use(s.handle, s.id, op, int(address), int(nbytes), owner, site)
            return op

    def host_use(self, address: int, nbytes: int, owner: Hashable, site: Optional[str] = None) -> "Op":
        """The CPU reads or writes host bytes [address, address + nbytes) for ``owner`` now."""
        site = site or _call_site()
        with self._lock:
            self._host_seq += 1
            vc = dict(self._streams.host_vc)
            vc[HOST_ID] = self._host_seq
            op = Op(HOST_ID, self._host_seq, vc, "host use", HOST_HANDLE)
            self._streams.host_vc[HOST_ID] = self._host_seq
            self._check_host_use(HOST_HANDLE, HOST_ID, op, int(address), int(nbytes), owner, site)
            return op

    def host_stats(self) -> dict:
        """Pinned host memory: live blocks, reserved bytes, cuMemHostAlloc/cuMemFreeHost calls."""
        with self._lock:
            return {"live": len(self._host_live), "reserved": self._host_reserved,
                    "allocs": self._counts["host_allocs"], "frees": self._counts["host_frees"]}


class CudaModel(_StreamCalls, _MemoryCalls, _DeviceCalls, _HostCalls):
    """A drop-in for ``cuda.bindings.driver`` (one device, one context) that checks stream
    ordering of memory reuse.  See the module docstring.

    :param device_total: the modelled device memory in bytes.
    :param base_address: the first device address handed out.
    :param legacy_waits_for_destroyed: whether legacy-stream ops are ordered after the work
        left on destroyed blocking streams (default: not, the conservative choice).
    :param host_total: the modelled pinnable host memory in bytes (``cuMemHostAlloc``).
    """

    def __init__(self, device_total: int = 1 << 30, base_address: int = 0x7F00_0000_0000,
                 legacy_waits_for_destroyed: bool = False, host_total: int = 1 << 30):
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._streams = _Streams(self._tls, legacy_waits_for_destroyed)
        self._events = _Events()
        self._memory = _Memory(device_total, base_address)
        self._granules = _Granules()
        self.host_total = host_total
        self._host_space = _AddressSpace(0x5500_0000_0000)
        self._host_live: dict[int, tuple[int, int, str]] = {}  # base -> (bytes, flags, call site)
        self._host_reserved = 0
        self._host_granules = _Granules()
        self._host_seq = 0
        self._counts: Counter = Counter()
        #: Every violation found so far, in order.
        self.violations: list[Violation] = []
        #: ``preempt(phase, name)``, phase "enter" or "exit", around each driver call.
        self.preempt: Optional[Callable[[str, str], Any]] = None

    op_a_precedes = staticmethod(op_a_precedes)

    # ---- the current context (one context; every thread has it current unless it left it)

    def _contexts(self) -> list:
        stack = getattr(self._tls, "contexts", None)
        return [CONTEXT] if stack is None else stack

    def leave_context(self) -> None:
        """The calling thread has no current context from now on, as a thread that never used
        CUDA (a finalizer may run there): driver calls that need one fail until it pushes one."""
        self._tls.contexts = []

    def __getattr__(self, name: str) -> Any:
        if _DRIVER_FUNCTION.match(name):
            raise AttributeError(f"CudaModel does not model {name}")
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(_cu, name)

    # ---- internals shared by the driver calls

    def _run_preempt(self, phase: str, name: str) -> None:
        hook = self.preempt
        if hook is None:
            return
        self._tls.in_preempt = True
        try:
            hook(phase, name)
        finally:
            self._tls.in_preempt = False

    def _new_op(self, s: _Stream, kind: str, extra: Iterable[dict] = ()) -> Op:
        self._counts["ops"] += 1
        return self._streams.new_op(s, kind, extra)

    def _report(self, kind: str, s: Optional[_Stream], call: str, start: int = 0, end: int = 0,
                handle: Optional[int] = None) -> None:
        self.violations.append(Violation(
            kind, start, end, new_stream=s.handle if s else handle, new_stream_id=s.id if s else None,
            new_site=_call_site(), detail=call))

    def _stream(self, handle: Any, call: str) -> Optional[_Stream]:
        h = _handle(handle)
        s = self._streams.resolve(h)
        if s is None:
            self._report("invalid stream", None, f"{call} on destroyed or unknown stream handle {h:#x}", handle=h)
        return s

    def _user_stream(self, handle: Any, call: str) -> Optional[_Stream]:
        s = self._stream(handle, call)
        if s is not None and (s.legacy or s.per_thread):
            self._report("invalid stream", s, f"{call} of a default stream")
            return None
        return s

    def _event(self, handle: Any, call: str) -> Optional[_Event]:
        h = _handle(handle)
        e = self._events.resolve(h)
        if e is None:
            self._report("invalid event", None, f"{call} on destroyed or unknown event handle {h:#x}")
        return e

    def _pool(self, handle: Any, call: str) -> Optional[_Pool]:
        h = _handle(handle)
        p = self._memory.pools.get(h)
        if p is None:
            self._report("invalid pool", None, f"{call} on destroyed or unknown pool handle {h:#x}")
        return p

    def _after_sync(self) -> None:
        self._counts["unmapped_bytes"] += self._memory.trim_to_thresholds(self._streams.complete)

    # ---- model-only API for tests

    def launch(self, stream: Any, arrays: Iterable[tuple[int, int, Hashable]], site: Optional[str] = None) -> Optional[Op]:
        """A kernel on ``stream`` using each ``(address, nbytes, owner)`` of ``arrays``: one op.

        Each granule it touches must have been last owned by ``owner``, or every maximal use of
        its previous owner must happen before this op; and every byte must lie in a live pool
        allocation now (host order).  Returns the op (None for an invalid stream)."""
        site = site or _call_site()
        with self._lock:
            s = self._stream(stream, "launch")
            if s is None:
                return None
            op = self._new_op(s, "launch")
            self._counts["launches"] += 1
            for address, nbytes, owner in arrays:
                self._check_use(s, op, int(address), int(nbytes), owner, site)
            return op

    def _check_use(self, s: _Stream, op: Op, address: int, nbytes: int, owner: Hashable, site: str) -> None:
        if nbytes <= 0:
            return
        for lo, hi in self._memory.uncovered(address, address + nbytes):
            self.violations.append(Violation("use of unallocated memory", lo, hi, new_owner=owner,
                                             new_stream=s.handle, new_stream_id=s.id, new_site=site))
        lo, hi = address // GRANULE * GRANULE, _round_up(address + nbytes)
        for start, end, prev in self._granules.use(lo, hi, _Use(op, owner, site)):
            self.violations.append(Violation(
                "unordered reuse", start, end, prev.owner, prev.op.handle, prev.op.stream_id, prev.site,
                owner, s.handle, s.id, site))

    def tail(self, stream: Any) -> Optional[Op]:
        """The stream's last op (None when it has none): a token for :meth:`would_follow`.

        :raises ValueError: for a destroyed or unknown handle."""
        with self._lock:
            s = self._streams.resolve(_handle(stream))
            if s is None:
                raise ValueError(f"tail: invalid stream handle {_handle(stream):#x}")
            return s.last

    def would_follow(self, stream: Any, token: Optional[Op]) -> bool:
        """True when an op enqueued on ``stream`` now would be ordered after ``token`` (legacy
        implicit ordering and host knowledge included).

        :raises ValueError: for a destroyed or unknown handle."""
        with self._lock:
            s = self._streams.resolve(_handle(stream))
            if s is None:
                raise ValueError(f"would_follow: invalid stream handle {_handle(stream):#x}")
            return token is None or s.id == token.stream_id or op_a_precedes(token, self._streams.next_vc(s))

    def wait(self, later_stream: Any, earlier_stream: Any) -> None:
        """Order ``later_stream``'s future work after ``earlier_stream``'s work so far (an event
        recorded on the earlier stream and waited on by the later one)."""
        _, event = self.cuEventCreate(_cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.cuEventRecord(event, earlier_stream)
        self.cuStreamWaitEvent(later_stream, event, 0)
        self.cuEventDestroy(event)

    def stream_id(self, stream: Any) -> int:
        """The id (as ``cuStreamGetId``) of a valid handle, without a driver call."""
        with self._lock:
            s = self._streams.resolve(_handle(stream))
            if s is None:
                raise ValueError(f"stream_id: invalid stream handle {_handle(stream):#x}")
            return s.id

    def stats(self) -> dict:
        """Counts: ops, launches, allocs, fresh_allocs, reuse_same_stream, reuse_cross_stream
        (of which reuse_cross_stream_pending: a free not yet known complete, reused through an
        event or legacy-stream dependency), frees, oom, unmapped_bytes, driver_calls, no_context
        (calls refused for want of a current context), violations, live_allocations,
        granule_segments."""
        with self._lock:
            keys = ("ops", "launches", "allocs", "fresh_allocs", "reuse_same_stream", "reuse_cross_stream",
                    "reuse_cross_stream_pending", "frees", "oom", "unmapped_bytes", "driver_calls", "no_context")
            out = {k: self._counts[k] for k in keys}
            out.update(violations=len(self.violations), live_allocations=len(self._memory.live),
                       granule_segments=len(self._granules))
            return out

    def assert_no_violations(self) -> None:
        """:raises AssertionError: listing every violation, if any."""
        if self.violations:
            raise AssertionError(f"{len(self.violations)} violation(s):\n" + "\n".join(map(str, self.violations)))
