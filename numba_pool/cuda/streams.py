"""The allocation stream: the CUDA stream an allocation (and its free) is ordered on.  Numba's EMM interface passes
no stream to ``memalloc``, so numba_pool keeps a thread-local one: outside :func:`using_stream`, the legacy default
stream (``CU_STREAM_LEGACY``), which is ordered around the work of every blocking stream (Numba's ``cuda.stream()``
ones).  What is done with it: :mod:`numba_pool.allocator`."""

from __future__ import annotations

import contextlib
import numbers
import threading
from typing import Any, Callable, Iterator

from cuda.bindings import driver as cu

LEGACY_HANDLES = (0, int(cu.CU_STREAM_LEGACY))  #: The legacy stream's handles (0: the NULL stream, legacy in Numba's builds).
_PER_THREAD = int(cu.CU_STREAM_PER_THREAD)


class StreamRef:
    """A CUDA stream handle plus its owner (a Numba, CuPy or PyTorch stream...), kept alive while an allocation
    ordered on the stream lives, so the stream-ordered free can be enqueued.  ``key``: the arena's stream identity,
    the driver's stream id (``cuStreamGetId``, unique for the process's life; never the handle, which the driver
    reuses), filled in by :mod:`numba_pool.allocator.arena` at first use; ``idle_key``: rule 7a's, likewise (False:
    none).  ``thread``: the host thread of a per-thread default stream (``CU_STREAM_PER_THREAD``), else None."""

    __slots__ = ("handle", "owner", "value", "key", "idle_key", "thread", "scratch")

    def __init__(self, handle: cu.CUstream, owner: Any = None, *, key: Any = None, scratch: Any = None,
                 value: int | None = None):
        self.handle = handle
        self.owner = owner
        self.value = int(handle) if value is None else value  # the handle as an int (the log's Stream column)
        self.key = key
        self.idle_key = None
        self.thread = threading.get_ident() if self.value == _PER_THREAD else None
        self.scratch = scratch  # the numba_pool.scratch block this thread bump-allocates from

    def same_stream(self, other: "StreamRef") -> bool:
        """Whether ``other`` names this stream: the same handle, and for a per-thread default stream the same
        thread (each thread's is a stream of its own)."""
        return self.value == other.value and self.thread == other.thread

    def belongs_to_another_thread(self) -> bool:
        """Whether this is another thread's per-thread default stream, which this thread cannot name."""
        return self.thread is not None and self.thread != threading.get_ident()

    def with_scratch(self, block: Any) -> "StreamRef":
        """The same stream, with allocations carved from the scratch ``block``."""
        ref = StreamRef(self.handle, self.owner, key=self.key, scratch=block)
        ref.thread, ref.idle_key = self.thread, self.idle_key
        return ref

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"StreamRef({self.value:#x})"


#: The legacy default stream, the allocation stream outside any ``using_stream`` scope.
LEGACY = StreamRef(cu.CUstream(cu.CU_STREAM_LEGACY), key="legacy")


def as_stream_ref(stream: Any) -> StreamRef:
    """A :class:`StreamRef` for a Numba stream (``cuda.stream()``, ``external_stream``, ``default_stream()``...), a
    ``CUstream``, an int handle, or a ``__cuda_stream__`` object (CuPy, PyTorch, cuda.core's ``Stream`` and
    ``GraphBuilder``: the captured stream); handle 0 and ``CU_STREAM_LEGACY`` give :data:`LEGACY`.
    :raises TypeError: for anything else, naming its type."""
    protocol = getattr(stream, "__cuda_stream__", None)  # first: cuda.core's ``handle`` makes a CUstream a call
    if protocol is not None:  # the doors' case, on their hot path: no further frame
        value = handle_of_protocol(stream, protocol)
        if value in LEGACY_HANDLES:
            return LEGACY
        return StreamRef(cu.CUstream(value), stream, value=value)
    if isinstance(stream, StreamRef):
        return stream
    if isinstance(stream, cu.CUstream):
        value, handle, owner = int(stream), stream, stream
    elif isinstance(stream, numbers.Integral) and not isinstance(stream, bool):  # NumPy's integers too
        if not 0 <= stream < 1 << 64:
            raise ValueError(f"numba_pool: stream handle {stream} is not a CUDA stream: expected 0 <= handle < 2**64")
        value, handle, owner = int(stream), None, None
    elif isinstance(getattr(stream, "handle", None), cu.CUstream):  # a Numba stream without __cuda_stream__
        value, handle, owner = int(stream.handle), stream.handle, stream
    else:
        raise TypeError(
            f"numba_pool: {type(stream).__name__} is not a CUDA stream: expected a Numba stream, a "
            "CUstream, an int handle or an object with __cuda_stream__")
    if value in LEGACY_HANDLES:
        return LEGACY
    return StreamRef(cu.CUstream(value) if handle is None else handle, owner, value=value)


def handle_of_protocol(stream: Any, protocol: Any) -> int:
    """The handle in a ``__cuda_stream__`` answer, ``(version, handle)`` (``protocol``: the attribute).
    :raises TypeError: for any other answer, naming the object's type and the answer."""
    info = protocol() if callable(protocol) else protocol
    if type(info) is tuple and len(info) == 2 and type(info[1]) is int and 0 <= info[1] < 1 << 64:
        return info[1]
    if (isinstance(info, tuple) and len(info) == 2 and isinstance(info[1], int) and not isinstance(info[1], bool)
            and 0 <= info[1] < 1 << 64):
        return int(info[1])
    raise TypeError(f"numba_pool: {type(stream).__name__}.__cuda_stream__ gave {info!r:.80}: expected a (version, "
                    "handle) tuple, handle an int below 2**64")


class _ThreadState(threading.local):
    # Class attribute: the value a thread sees before it enters any using_stream scope.
    stream: StreamRef = LEGACY


#: The calling thread's allocation stream: ``per_thread.stream``.
per_thread = _ThreadState()
#: Empty until a thread enters a using_stream or scratch scope: till then every allocation stream is LEGACY, no lookup.
scopes_entered: list = []


def enter_scope(ref: StreamRef) -> StreamRef:
    """Make ``ref`` the calling thread's allocation stream; returns the previous one."""
    if not scopes_entered:
        scopes_entered.append(True)
    previous = per_thread.stream
    per_thread.stream = ref
    return previous


def leave_scope(previous: StreamRef) -> None:
    """Make ``previous`` (:func:`enter_scope`'s return) the thread's allocation stream again."""
    per_thread.stream = previous


def current_stream() -> StreamRef:
    """The calling thread's allocation stream."""
    return per_thread.stream


@contextlib.contextmanager
def using_stream(stream: Any, on_entry: Callable[[StreamRef], None] | None = None) -> Iterator[StreamRef]:
    """:func:`numba_pool.using_stream`'s semantics (stated there), without the capture check.
    :param on_entry: called with the scope's stream before the thread enters it (rule 13's check).
    :raises TypeError: when ``stream`` is not a stream."""
    ref = as_stream_ref(stream)
    if on_entry is not None:
        on_entry(ref)
    previous = enter_scope(ref)
    try:
        yield ref
    finally:
        leave_scope(previous)
