"""Stream capture (CUDA graphs) in the model: what the driver allows while a stream is being
captured, the graphs a capture makes, and the device's *graph memory* (the memory of their
allocation nodes).

What is modelled (measured on an H100, driver 580: :mod:`numba_pool.cuda.capture`)
---------------------------------------------------------------------------------
* ``cuStreamBeginCapture(S, mode)`` (``GLOBAL`` / ``THREAD_LOCAL`` / ``RELAXED``) on a created or
  per-thread stream; the legacy stream cannot be captured (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``).
  ``cuStreamEndCapture(S)`` returns the graph, or ``CUDA_ERROR_STREAM_CAPTURE_INVALIDATED``; a
  capture not begun in relaxed mode must be ended by the thread that began it.
* **On the capturing stream** nothing runs: ``cuMemAllocFromPoolAsync`` records an allocation
  node (an exportable or managed pool: ``CUDA_ERROR_NOT_SUPPORTED``, the capture survives) whose
  address comes from graph memory, a range apart from every pool's, the same at every launch;
  ``cuMemFreeAsync`` of an address allocated in the same capture records a free node (of any
  other memory: a violation, ``"free in a capture of memory not allocated in it"``); a kernel
  (:meth:`launch`) records a kernel node; ``cuEventRecord`` records a capture event;
  ``cuStreamWaitEvent`` on an event recorded outside the capture fails with
  ``CUDA_ERROR_STREAM_CAPTURE_ISOLATION``; ``cuStreamGetId`` and ``cuStreamSynchronize`` fail with
  ``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``.  ``cuStreamIsCapturing`` answers ``ACTIVE`` (then
  ``INVALIDATED``), ``cuStreamGetCaptureInfo`` the status and a process-unique id.
* **The legacy stream while a blocking stream of its context captures** (any mode, any thread):
  every operation on it (allocation, free, event record, wait, kernel, synchronize) fails with
  ``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT``; ``cuStreamIsCapturing(legacy)`` answers that error
  without invalidating anything.
* ``cuCtxSynchronize`` during any capture (any mode, any thread): ``UNSUPPORTED``;
  ``cuMemPoolTrimTo`` likewise unless the calling thread's mode is relaxed.
* **"Potentially unsafe" calls** (``cuMemAllocFromPoolAsync`` / ``cuMemFreeAsync`` on streams not
  captured, ``cuEventQuery``, ``cuEventSynchronize``, ``cuStreamSynchronize``,
  ``cuMemHostAlloc``, ``cuMemPoolGetAttribute``: an H200, driver 580, refused it in a global capture)
  are refused with ``UNSUPPORTED`` when the calling thread's mode
  (``cuThreadExchangeStreamCaptureMode``, default ``GLOBAL``) is not relaxed and (a) the thread
  has a capture under way not begun in relaxed mode, or (b) its mode is ``GLOBAL`` and another
  thread has a capture begun in ``GLOBAL`` mode.
* Event records and waits on streams not captured (blocking ones too, an H200 measured), ``cuStreamGetId`` of such
  streams, ``cuMemGetInfo``, creating streams, events and pools: always allowed.

Every refusal above that the driver answers by invalidating a capture is recorded as a
:class:`~cuda_model.Violation` of kind ``"capture invalidated"`` (naming the call and the
capture), so that a program whose allocator breaks a capture fails.

Graphs (model-only API, like :meth:`CudaModel.launch`, under the driver's names):
``cuGraphInstantiate(graph, flags)`` (``CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH``
honoured; a graph with allocation nodes has one executable at a time), ``cuGraphLaunch(exec,
stream)``: its nodes run in capture order as ops of the launch stream; an allocation node makes
its address a live allocation (owned by the graph), a kernel node checks its uses as
:meth:`launch` does *and* that the memory still belongs to the owner it was captured with (a
kernel node on memory that another owner has used since, say an arena block carved during the
capture and handed out again, is ``"graph kernel on memory of another owner"``), a free node
frees.  Allocations a launch leaves live stay allocated: ``cuMemFreeAsync`` outside the graph
frees them (``CUDA_ERROR_INVALID_VALUE``, no violation, when not allocated now: never launched,
or freed already); a relaunch while they are outstanding is ``CUDA_ERROR_INVALID_VALUE`` unless
the executable auto-frees (then they are freed on the launch stream first).
``cuGraphExecDestroy`` / ``cuGraphDestroy`` leave live graph allocations allocated.

Not modelled: a stream joining a capture through a capture event (reported as a violation,
``"capture join (unmodelled)"``), graph memory reuse across graphs (every allocation node has an
address of its own), child graphs.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable, Iterable, Optional

from cuda.bindings import driver as _cu

from . import base as _base
from .base import SUCCESS, _R, _call_site, _handle, _round_up, GRANULE
from .calls import _VALUES, _driver
from .memory import Violation, _AddressSpace, _Allocation, _Pool
from .ordering import Op, _Stream, describe_stream

if TYPE_CHECKING:
    from .model import CudaModel

# capture.py is one of the model's own files: a call site is the first frame outside them.
_base._MODEL_FILES = _base._MODEL_FILES | {os.path.normcase(os.path.abspath(__file__))}
_VALUES.update({"cuStreamIsCapturing": 1, "cuStreamGetCaptureInfo": 6, "cuThreadExchangeStreamCaptureMode": 1,
                "cuDeviceGetGraphMemAttribute": 1, "cuStreamEndCapture": 1, "cuGraphInstantiate": 1})

_STATUS = _cu.CUstreamCaptureStatus
_NONE = _STATUS.CU_STREAM_CAPTURE_STATUS_NONE
_ACTIVE = _STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE
_INVALIDATED = _STATUS.CU_STREAM_CAPTURE_STATUS_INVALIDATED
_MODE = _cu.CUstreamCaptureMode
GLOBAL = _MODE.CU_STREAM_CAPTURE_MODE_GLOBAL
THREAD_LOCAL = _MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
RELAXED = _MODE.CU_STREAM_CAPTURE_MODE_RELAXED
AUTO_FREE = int(_cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
_GATTR = _cu.CUgraphMem_attribute
#: Graph memory's addresses: apart from the pools' (which start at the model's base_address).
GRAPH_BASE = 0x7E00_0000_0000


@dataclass(eq=False)
class _Capture:
    id: int
    stream: _Stream
    mode: Any
    thread: int
    site: str
    invalidated: bool = False
    nodes: list = field(default_factory=list)  # ("alloc", addr, size, site) | ("kernel", arrays, site) | ("free", addr, site)
    allocs: dict = field(default_factory=dict)  # address -> size, allocated in this capture and not freed in it


@dataclass(eq=False)
class _Graph:
    handle: int
    capture: _Capture
    nodes: list
    exec: Optional["_GraphExec"] = None
    live: set = field(default_factory=set)  # its allocation nodes' addresses allocated now

    @property
    def allocations(self) -> list:
        return [node[1] for node in self.nodes if node[0] == "alloc"]


@dataclass(eq=False)
class _GraphExec:
    handle: int
    graph: _Graph
    auto_free: bool


def _mode_name(mode: Any) -> str:
    return getattr(mode, "name", str(mode)).replace("CU_STREAM_CAPTURE_MODE_", "").lower()


class _CaptureCalls:
    """Stream capture and graphs: the capture-status queries, the thread's capture mode, the
    gates other driver calls pass while a capture is under way, graphs and graph memory."""

    def _init_captures(self: "CudaModel") -> None:
        self._captures: dict[int, _Capture] = {}  # stream id -> its capture under way
        self._capture_ids = 0x1000  # process-unique capture ids
        self._capture_events: dict[int, _Capture] = {}  # event handle -> capture its last record is in
        self._graphs: dict[int, _Graph] = {}
        self._execs: dict[int, _GraphExec] = {}
        self._graph_handles = 0x6000
        self._graph_of: dict[int, _Graph] = {}  # graph memory address -> its graph (after the capture ended)
        self._graph_addresses: set[int] = set()  # every graph memory address handed out
        self._graph_space = _AddressSpace(GRAPH_BASE)
        self._graph_pool = _Pool(0x6FFF0, 0, False)  # graph memory's accounting (no pool of the API)
        self._graph_reserved = self._graph_reserved_high = 0

    # ---- the gates

    def _thread_mode(self) -> Any:
        return getattr(self._tls, "capture_mode", GLOBAL)

    def _invalidate(self, capture: _Capture, call: str) -> None:
        if capture.invalidated:
            return
        capture.invalidated = True
        self.violations.append(Violation(
            "capture invalidated", new_stream=capture.stream.handle, new_stream_id=capture.stream.id,
            new_site=_call_site(),
            detail=f"{call} invalidated the {_mode_name(capture.mode)}-mode capture (id {capture.id}) of "
                   f"{describe_stream(capture.stream.handle, capture.stream.id)} begun at {capture.site}"))

    def _blocking_captures(self, legacy: _Stream) -> list:
        return [c for c in self._captures.values() if c.stream.blocking and c.stream.context == legacy.context]

    def _legacy_refused(self, s: Optional[_Stream], call: str):
        """``CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`` (invalidating) for an op on the legacy stream
        while a blocking stream of its context captures; else None."""
        if s is None or not s.legacy:
            return None
        captures = self._blocking_captures(s)
        if not captures:
            return None
        for capture in captures:
            self._invalidate(capture, f"{call} on the legacy stream")
        self._counts["capture_refusals"] += 1
        return _R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT

    def _unsafe_refused(self, call: str):
        """``UNSUPPORTED`` (invalidating) for a "potentially unsafe" call the calling thread's
        capture mode prohibits now; else None."""
        mode = self._thread_mode()
        if mode == RELAXED or not self._captures:
            return None
        me = threading.get_ident()
        culprits = [c for c in self._captures.values() if c.thread == me and c.mode != RELAXED]
        if mode == GLOBAL:
            culprits += [c for c in self._captures.values() if c.thread != me and c.mode == GLOBAL]
        if not culprits:
            return None
        for capture in culprits:
            self._invalidate(capture, f"{call} (potentially unsafe, thread in {_mode_name(mode)} mode)")
        self._counts["capture_refusals"] += 1
        return _R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED

    def _capture_on(self, s: Optional[_Stream]) -> Optional[_Capture]:
        return None if s is None else self._captures.get(s.id)

    def _check_new_op(self, s: _Stream, kind: str) -> None:
        """Every op the model enqueues: none on a capturing stream (the calls that record nodes
        never get here), none on the legacy stream while a blocking stream captures."""
        if not self._captures:
            return
        capture = self._captures.get(s.id)
        if capture is not None:
            self.violations.append(Violation(
                "unmodelled operation in a capture", new_stream=s.handle, new_stream_id=s.id, new_site=_call_site(),
                detail=f"{kind} on a stream being captured (capture id {capture.id})"))
        elif s.legacy:
            for capture in self._blocking_captures(s):
                self._invalidate(capture, f"{kind} on the legacy stream")

    # ---- the capture-status queries and the thread's mode

    @_driver
    def cuStreamIsCapturing(self: "CudaModel", stream: Any):
        s = self._stream(stream, "cuStreamIsCapturing")
        if s is None:
            return _R.CUDA_ERROR_INVALID_HANDLE, None
        if s.legacy and self._blocking_captures(s):
            return _R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, None  # measured: invalidates nothing
        capture = self._captures.get(s.id)
        if capture is None:
            return SUCCESS, _NONE
        return SUCCESS, _INVALIDATED if capture.invalidated else _ACTIVE

    @_driver
    def cuStreamGetCaptureInfo(self: "CudaModel", stream: Any):
        s = self._stream(stream, "cuStreamGetCaptureInfo")
        if s is None:
            return _R.CUDA_ERROR_INVALID_HANDLE, None, None, None, None, None, None
        if s.legacy and self._blocking_captures(s):  # as cuStreamIsCapturing (not measured)
            return _R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, None, None, None, None, None, None
        capture = self._captures.get(s.id)
        if capture is None:
            return SUCCESS, _NONE, _cu.cuuint64_t(0), None, None, None, 0
        status = _INVALIDATED if capture.invalidated else _ACTIVE
        return SUCCESS, status, _cu.cuuint64_t(capture.id), _cu.CUgraph(0), None, None, 0

    @_driver
    def cuThreadExchangeStreamCaptureMode(self: "CudaModel", mode: Any):
        previous = self._thread_mode()
        self._tls.capture_mode = _MODE(int(mode))
        return SUCCESS, previous

    # ---- beginning and ending a capture

    @_driver
    def cuStreamBeginCapture(self: "CudaModel", stream: Any, mode: Any = GLOBAL):
        s = self._stream(stream, "cuStreamBeginCapture")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if s.legacy:
            return (_R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        if s.id in self._captures:
            return (_R.CUDA_ERROR_ILLEGAL_STATE,)
        self._capture_ids += 1
        self._captures[s.id] = _Capture(self._capture_ids, s, _MODE(int(mode)), threading.get_ident(), _call_site())
        self._counts["captures"] += 1
        return (SUCCESS,)

    @_driver
    def cuStreamEndCapture(self: "CudaModel", stream: Any):
        s = self._stream(stream, "cuStreamEndCapture")
        if s is None:
            return _R.CUDA_ERROR_INVALID_HANDLE, None
        capture = self._captures.get(s.id)
        if capture is None:
            return _R.CUDA_ERROR_ILLEGAL_STATE, None
        if capture.mode != RELAXED and capture.thread != threading.get_ident():
            return _R.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, None
        del self._captures[s.id]
        if capture.invalidated:
            return _R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None
        self._graph_handles += 0x10
        graph = self._graphs[self._graph_handles] = _Graph(self._graph_handles, capture, list(capture.nodes))
        for address in graph.allocations:
            self._graph_of[address] = graph
        return SUCCESS, _cu.CUgraph(graph.handle)

    # ---- graphs

    @_driver
    def cuGraphInstantiate(self: "CudaModel", graph: Any, flags: Any = 0):
        g = self._graphs.get(_handle(graph))
        if g is None:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        if g.exec is not None and g.allocations:  # one executable at a time for a graph with memory nodes
            return _R.CUDA_ERROR_NOT_SUPPORTED, None
        self._graph_handles += 0x10
        g.exec = self._execs[self._graph_handles] = _GraphExec(self._graph_handles, g, bool(int(flags) & AUTO_FREE))
        return SUCCESS, _cu.CUgraphExec(g.exec.handle)

    @_driver
    def cuGraphExecDestroy(self: "CudaModel", graph_exec: Any):
        ex = self._execs.pop(_handle(graph_exec), None)
        if ex is None:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        ex.graph.exec = None
        return (SUCCESS,)

    @_driver
    def cuGraphDestroy(self: "CudaModel", graph: Any):
        if self._graphs.pop(_handle(graph), None) is None:
            return (_R.CUDA_ERROR_INVALID_VALUE,)
        return (SUCCESS,)

    @_driver
    def cuGraphLaunch(self: "CudaModel", graph_exec: Any, stream: Any):
        s = self._stream(stream, "cuGraphLaunch")
        ex = self._execs.get(_handle(graph_exec))
        if s is None or ex is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE if s is None else _R.CUDA_ERROR_INVALID_VALUE,)
        refused = self._legacy_refused(s, "cuGraphLaunch")
        if refused:
            return (refused,)
        if s.id in self._captures:
            self.violations.append(Violation("unmodelled operation in a capture", new_stream=s.handle,
                                             new_stream_id=s.id, new_site=_call_site(),
                                             detail="cuGraphLaunch on a stream being captured"))
            return (_R.CUDA_ERROR_NOT_SUPPORTED,)
        g = ex.graph
        if g.live:
            if not ex.auto_free:
                return (_R.CUDA_ERROR_INVALID_VALUE,)
            for address in sorted(g.live):  # stream-ordered before the new launch
                self._free_graph_memory(address, self._new_op(s, "graph auto-free"))
        for node in g.nodes:
            if node[0] == "alloc":
                _, address, nbytes, site = node
                op = self._new_op(s, "graph alloc")
                self._memory.add_live(_Allocation(address, nbytes, self._graph_pool, op, site))
                g.live.add(address)
                self._graph_pool.used += nbytes
                self._graph_pool.note_high()
                self._graph_reserved = max(self._graph_reserved, self._graph_pool.used)
                self._graph_reserved_high = max(self._graph_reserved_high, self._graph_reserved)
            elif node[0] == "kernel":
                _, arrays, site = node
                op = self._new_op(s, "graph kernel")
                self._counts["graph_kernels"] += 1
                for address, nbytes, owner in arrays:
                    self._check_graph_use(s, op, address, nbytes, owner, site)
            else:
                _, address, site = node
                if address in g.live:
                    self._free_graph_memory(address, self._new_op(s, "graph free"))
        self._counts["graph_launches"] += 1
        return (SUCCESS,)

    def _check_graph_use(self: "CudaModel", s: _Stream, op: Op, address: int, nbytes: int, owner: Hashable,
                         site: str) -> None:
        lo, hi = address // GRANULE * GRANULE, _round_up(address + nbytes)
        for start, end, other in self._granules.owners(lo, hi):
            if other != owner:
                self.violations.append(Violation(
                    "graph kernel on memory of another owner", start, end, prev_owner=other, new_owner=owner,
                    new_stream=s.handle, new_stream_id=s.id, new_site=site,
                    detail="a kernel node captured for this owner runs on memory another owner has used since"))
        self._check_use(s, op, address, nbytes, owner, site)

    def _free_graph_memory(self: "CudaModel", address: int, op: Op) -> None:
        self._memory.free(address, op)
        self._graph_pool.pieces.clear()  # graph memory is never handed to a pool allocation
        graph = self._graph_of.get(address)
        if graph is not None:
            graph.live.discard(address)
        self._counts["graph_frees"] += 1

    @_driver
    def cuDeviceGetGraphMemAttribute(self: "CudaModel", device: Any, attribute: Any):
        values = {_GATTR.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: self._graph_pool.used,
                  _GATTR.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: self._graph_pool.used_high,
                  _GATTR.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: self._graph_reserved,
                  _GATTR.CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: self._graph_reserved_high}
        if _handle(device) != 0 or attribute not in values:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        return SUCCESS, _cu.cuuint64_t(values[attribute])

    @_driver
    def cuDeviceGraphMemTrim(self: "CudaModel", device: Any):
        if _handle(device) != 0:
            return (_R.CUDA_ERROR_INVALID_DEVICE,)
        self._graph_reserved = self._graph_pool.used
        return (SUCCESS,)

    # ---- the driver calls a capture changes

    @_driver
    def cuMemAllocFromPoolAsync(self: "CudaModel", size: Any, pool: Any, stream: Any):
        s = self._streams.resolve(_handle(stream))
        if s is not None:
            refused = self._legacy_refused(s, "cuMemAllocFromPoolAsync")
            if refused:
                return refused, None
            capture = self._captures.get(s.id)
            if capture is not None:
                return self._capture_alloc(capture, size, pool)
            refused = self._unsafe_refused("cuMemAllocFromPoolAsync")
            if refused:
                return refused, None
        return super().cuMemAllocFromPoolAsync.__wrapped__(self, size, pool, stream)

    def _capture_alloc(self: "CudaModel", capture: _Capture, size: Any, pool: Any):
        if capture.invalidated:
            return _R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, None
        p = self._pool(pool, "cuMemAllocFromPoolAsync")
        if p is None or int(size) <= 0:
            return _R.CUDA_ERROR_INVALID_VALUE, None
        if getattr(p, "exportable", False) or p.managed:  # measured: the capture survives
            return _R.CUDA_ERROR_NOT_SUPPORTED, None
        nbytes = _round_up(int(size))
        address = self._graph_space.map(nbytes)
        capture.allocs[address] = nbytes
        self._graph_addresses.add(address)
        capture.nodes.append(("alloc", address, nbytes, _call_site()))
        self._counts["graph_alloc_nodes"] += 1
        return SUCCESS, _cu.CUdeviceptr(address)

    @_driver
    def cuMemFreeAsync(self: "CudaModel", ptr: Any, stream: Any):
        s = self._streams.resolve(_handle(stream))
        base = _handle(ptr)
        if s is not None:
            refused = self._legacy_refused(s, "cuMemFreeAsync")
            if refused:
                return (refused,)
            capture = self._captures.get(s.id)
            if capture is not None:
                if capture.invalidated:
                    return (_R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
                if capture.allocs.pop(base, None) is None:
                    self._report("free in a capture of memory not allocated in it", s, "cuMemFreeAsync", base, base + 1)
                    return (_R.CUDA_ERROR_INVALID_VALUE,)
                capture.nodes.append(("free", base, _call_site()))
                self._counts["graph_free_nodes"] += 1
                return (SUCCESS,)
            refused = self._unsafe_refused("cuMemFreeAsync")
            if refused:
                return (refused,)
            if self._captures and s.blocking and not s.legacy and not s.per_thread:
                self._counts["blocking frees beside a capture"] += 1  # the fuzzer checks it sees them
            if base in self._graph_addresses:
                if base not in self._memory.live:  # measured: not allocated now (never launched, or freed)
                    return (_R.CUDA_ERROR_INVALID_VALUE,)
                self._free_graph_memory(base, self._new_op(s, "free"))
                return (SUCCESS,)
        return super().cuMemFreeAsync.__wrapped__(self, ptr, stream)

    @_driver
    def cuEventRecord(self: "CudaModel", event: Any, stream: Any = 0):
        s = self._streams.resolve(_handle(stream))
        refused = self._legacy_refused(s, "cuEventRecord")
        if refused:
            return (refused,)
        capture = self._capture_on(s)
        if capture is not None:
            e = self._event(event, "cuEventRecord")
            if e is None:
                return (_R.CUDA_ERROR_INVALID_HANDLE,)
            if capture.invalidated:
                return (_R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
            self._capture_events[e.handle] = capture
            return (SUCCESS,)
        result = super().cuEventRecord.__wrapped__(self, event, stream)
        if result[0] == SUCCESS:
            self._capture_events.pop(_handle(event), None)
        return result

    @_driver
    def cuEventDestroy(self: "CudaModel", event: Any):
        self._capture_events.pop(_handle(event), None)
        return super().cuEventDestroy.__wrapped__(self, event)

    @_driver
    def cuStreamWaitEvent(self: "CudaModel", stream: Any, event: Any, flags: Any = 0):
        s = self._streams.resolve(_handle(stream))
        refused = self._legacy_refused(s, "cuStreamWaitEvent")
        if refused:
            return (refused,)
        e = self._events.resolve(_handle(event))
        in_capture = self._capture_events.get(_handle(event)) if e is not None else None
        if in_capture is not None and in_capture.id not in {c.id for c in self._captures.values()}:
            in_capture = None  # its capture ended: the record is a node of a graph, waiting orders nothing here
        capture = self._capture_on(s)
        if capture is not None and e is not None:
            if capture.invalidated:
                return (_R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,)
            if in_capture is capture or (in_capture is None and e.record is None):
                return (SUCCESS,)  # a dependency inside the capture (or on nothing)
            self._invalidate(capture, "cuStreamWaitEvent on an event recorded outside the capture")
            return (_R.CUDA_ERROR_STREAM_CAPTURE_ISOLATION,)
        if in_capture is not None and s is not None:
            self.violations.append(Violation("capture join (unmodelled)", new_stream=s.handle, new_stream_id=s.id,
                                             new_site=_call_site(),
                                             detail=f"cuStreamWaitEvent on an event of capture {in_capture.id}"))
            return (_R.CUDA_ERROR_NOT_SUPPORTED,)
        return super().cuStreamWaitEvent.__wrapped__(self, stream, event, flags)

    @_driver
    def cuStreamSynchronize(self: "CudaModel", stream: Any):
        s = self._streams.resolve(_handle(stream))
        refused = self._legacy_refused(s, "cuStreamSynchronize")
        if refused:
            return (refused,)
        capture = self._capture_on(s)
        if capture is not None:
            self._invalidate(capture, "cuStreamSynchronize of the capturing stream")
            return (_R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        refused = self._unsafe_refused("cuStreamSynchronize")
        if refused:
            return (refused,)
        return super().cuStreamSynchronize.__wrapped__(self, stream)

    @_driver
    def cuCtxSynchronize(self: "CudaModel"):
        if self._captures:
            for capture in list(self._captures.values()):
                self._invalidate(capture, "cuCtxSynchronize")
            return (_R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        return super().cuCtxSynchronize.__wrapped__(self)

    @_driver
    def cuMemPoolTrimTo(self: "CudaModel", pool: Any, keep_bytes: Any):
        if self._captures and self._thread_mode() != RELAXED:
            for capture in list(self._captures.values()):
                self._invalidate(capture, "cuMemPoolTrimTo")
            return (_R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        return super().cuMemPoolTrimTo.__wrapped__(self, pool, keep_bytes)

    @_driver
    def cuEventQuery(self: "CudaModel", event: Any):
        refused = self._unsafe_refused("cuEventQuery")
        if refused:
            return (refused,)
        return super().cuEventQuery.__wrapped__(self, event)

    @_driver
    def cuEventSynchronize(self: "CudaModel", event: Any):
        refused = self._unsafe_refused("cuEventSynchronize")
        if refused:
            return (refused,)
        return super().cuEventSynchronize.__wrapped__(self, event)

    @_driver
    def cuMemHostAlloc(self: "CudaModel", size: Any, flags: Any = 0):
        refused = self._unsafe_refused("cuMemHostAlloc")
        if refused:
            return refused, None
        return super().cuMemHostAlloc.__wrapped__(self, size, flags)

    @_driver
    def cuMemAllocManaged(self: "CudaModel", size: Any, flags: Any):
        refused = self._unsafe_refused("cuMemAllocManaged")
        if refused:
            return refused, None
        return super().cuMemAllocManaged.__wrapped__(self, size, flags)

    @_driver
    def cuMemFree(self: "CudaModel", ptr: Any):
        refused = self._unsafe_refused("cuMemFree")
        if refused:
            return (refused,)
        return super().cuMemFree.__wrapped__(self, ptr)

    @_driver
    def cuStreamGetId(self: "CudaModel", stream: Any):
        capture = self._capture_on(self._streams.resolve(_handle(stream)))
        if capture is not None:
            self._invalidate(capture, "cuStreamGetId of the capturing stream")
            return _R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, None
        return super().cuStreamGetId.__wrapped__(self, stream)

    @_driver
    def cuStreamDestroy(self: "CudaModel", stream: Any):
        capture = self._capture_on(self._streams.resolve(_handle(stream)))
        if capture is not None:
            self._invalidate(capture, "cuStreamDestroy of the capturing stream")
            return (_R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        return super().cuStreamDestroy.__wrapped__(self, stream)

    # ---- kernels (model-only)

    def _captured_launch(self: "CudaModel", s: _Stream, arrays: Iterable[tuple[int, int, Hashable]], site: str) -> bool:
        """:meth:`CudaModel.launch` on a stream being captured: a kernel node of the capture
        (checked at each launch of its graph); False when ``s`` is not being captured."""
        capture = self._captures.get(s.id) if self._captures else None
        if capture is None:
            return False
        if not capture.invalidated:
            capture.nodes.append(("kernel", [(int(a), int(n), o) for a, n, o in arrays], site))
            self._counts["graph_kernel_nodes"] += 1
        return True

    # ---- model-only queries

    def capturing(self: "CudaModel") -> list:
        """``(stream handle, capture id, invalidated)`` of every capture under way."""
        with self._lock:
            return [(c.stream.handle, c.id, c.invalidated) for c in self._captures.values()]

    def graph_memory_live(self: "CudaModel") -> int:
        """Bytes of graph memory allocated now (launched and not freed)."""
        with self._lock:
            return self._graph_pool.used
