"""Happens-before over GPU operations: operations with vector clocks, streams (legacy,
per-thread, blocking, non-blocking) and events (CUDA Driver API, "Stream synchronization
behavior")."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable, Optional

from .base import LEGACY_HANDLES, PER_THREAD_HANDLE

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
    context: int = 0  # the context it belongs to (its handle value)
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
      streams and every per-thread default stream) *of its context*;
    * on a blocking stream: after its context's legacy stream's last op;
    * on a non-blocking stream: nothing more.

    Every context has its own legacy stream and per-thread default streams: the handles 0,
    ``CU_STREAM_LEGACY`` and ``CU_STREAM_PER_THREAD`` name those of the context current in the
    calling thread (``current_context()``, a handle value); created streams keep the context
    they were created in.
    """

    FIRST_HANDLE, HANDLE_STEP = 0x1000, 0x10

    def __init__(self, tls: threading.local, legacy_waits_for_destroyed: bool, current_context, main_context: int):
        self._tls = tls
        self._waits_for_destroyed = legacy_waits_for_destroyed
        self._current_context = current_context  # () -> the calling thread's context (handle value)
        self.host_vc: dict = {}
        self.by_id: dict[int, _Stream] = {}
        # context -> {id: stream}: the streams a legacy-stream op of that context waits for
        self._blocking: dict[int, dict[int, _Stream]] = {}
        self._legacy: dict[int, _Stream] = {}  # context -> its legacy stream
        self._by_handle: dict[int, _Stream] = {}
        self._free_handles: list[int] = []
        self._next_handle = self.FIRST_HANDLE
        self._next_id = 1
        self.legacy = self.legacy_of(main_context)
        #: Called as ``hook(vc, whole_context)`` before the host learns ``vc`` (it waited for that
        #: work; ``whole_context``: a context synchronize): the model's deadlock check
        #: (:mod:`cuda_model.deadlock`) and its cost of barriers (:mod:`cuda_model.costs`).
        self.before_host_learns = None

    def legacy_of(self, context: int) -> _Stream:
        """The legacy default stream of ``context`` (made at its first use)."""
        stream = self._legacy.get(context)
        if stream is None:
            stream = self._legacy[context] = self._new(LEGACY_HANDLES[1], blocking=True, context=context, legacy=True)
        return stream

    def _new(self, handle: int, blocking: bool, context: int, **kind: bool) -> _Stream:
        stream = _Stream(self._next_id, handle, blocking, context=context, **kind)
        self._next_id += 1
        self.by_id[stream.id] = stream
        if blocking and not stream.legacy:
            self._blocking.setdefault(context, {})[stream.id] = stream
        return stream

    def create(self, blocking: bool) -> _Stream:
        """A new stream of the calling thread's context, on the most recently freed handle if
        any (LIFO)."""
        if self._free_handles:
            handle = self._free_handles.pop()
        else:
            handle, self._next_handle = self._next_handle, self._next_handle + self.HANDLE_STEP
        stream = self._by_handle[handle] = self._new(handle, blocking, self._current_context())
        return stream

    def destroy(self, stream: _Stream) -> None:
        """Its handle becomes free; its enqueued work stays in the relation."""
        stream.alive = False
        del self._by_handle[stream.handle]
        if not self._waits_for_destroyed:
            self._blocking.get(stream.context, {}).pop(stream.id, None)
        self._free_handles.append(stream.handle)

    def resolve(self, handle: int) -> Optional[_Stream]:
        """The stream a handle means for the calling thread now; None when invalid."""
        if handle in LEGACY_HANDLES:
            return self.legacy_of(self._current_context())
        if handle == PER_THREAD_HANDLE:
            context = self._current_context()
            streams = getattr(self._tls, "per_thread", None)
            if streams is None:  # one per host thread and context (threading.local)
                streams = self._tls.per_thread = {}
            stream = streams.get(context)
            if stream is None:
                stream = streams[context] = self._new(PER_THREAD_HANDLE, blocking=True, context=context,
                                                      per_thread=True)
            return stream
        return self._by_handle.get(handle)

    def _implicit(self, stream: _Stream) -> Iterable[_Stream]:
        if stream.legacy:
            return self._blocking.get(stream.context, {}).values()
        return [self.legacy_of(stream.context)] if stream.blocking else []

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
        """The host has seen every op ordered before ``vc`` complete (it waited for them)."""
        if self.before_host_learns is not None:
            self.before_host_learns(vc, False)
        join(self.host_vc, vc)

    def host_learns_all(self, context: int) -> None:
        """A context synchronize: the host has seen every op of ``context``'s streams complete."""
        vc: dict = {}
        for stream in self.by_id.values():
            if stream.context == context:
                join(vc, stream.last_vc)
        if self.before_host_learns is not None:
            self.before_host_learns(vc, True)
        join(self.host_vc, vc)

    def complete(self, op: Op) -> bool:
        return op_a_precedes(op, self.host_vc)


@dataclass(eq=False)
class _Event:
    handle: int
    context: int = 0  # the context it was created in
    record: Optional[Op] = None


class _Events:
    """Event handles (reused LIFO) and each event's most recent record."""

    FIRST_HANDLE, HANDLE_STEP = 0x50000, 0x10

    def __init__(self):
        self._by_handle: dict[int, _Event] = {}
        self._free_handles: list[int] = []
        self._next_handle = self.FIRST_HANDLE

    def create(self, context: int) -> _Event:
        if self._free_handles:
            handle = self._free_handles.pop()
        else:
            handle, self._next_handle = self._next_handle, self._next_handle + self.HANDLE_STEP
        event = self._by_handle[handle] = _Event(handle, context)
        return event

    def resolve(self, handle: int) -> Optional[_Event]:
        return self._by_handle.get(handle)

    def destroy(self, event: _Event) -> None:
        del self._by_handle[event.handle]
        self._free_handles.append(event.handle)

    def __len__(self) -> int:
        """Events created and not destroyed."""
        return len(self._by_handle)
