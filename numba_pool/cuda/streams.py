"""The allocation stream: which CUDA stream an allocation (and its free) is ordered on.

Numba's EMM interface passes no stream to ``memalloc``, so numba_pool keeps a thread-local
*allocation stream*.  Outside :func:`using_stream` it is the legacy default stream
(``CU_STREAM_LEGACY``): every operation on it waits for all earlier work on blocking streams and
all later work on blocking streams waits for it, so an allocation or free issued there is
ordered around the work of Numba's own streams (``cuda.stream()`` creates blocking streams).
What numba_pool does with the stream is :mod:`numba_pool.allocator`'s business.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from cuda.bindings import driver as cu

_LEGACY_HANDLES = (0, int(cu.CU_STREAM_LEGACY))  # 0: the NULL stream, legacy in Numba's builds
_PER_THREAD = int(cu.CU_STREAM_PER_THREAD)


class StreamRef:
    """A CUDA stream handle plus the object that owns it.

    The owner (a Numba ``Stream``, a CuPy or PyTorch stream...) is kept alive for as long as an
    allocation ordered on the stream lives, so that the stream still exists when the
    stream-ordered free is enqueued on it.

    ``key`` is the stream's identity for the arena: the driver's stream id
    (``cuStreamGetId``, unique for the life of the process), filled in by
    :mod:`numba_pool.allocator.arena` at the first arena allocation on the stream.  Never the handle's
    value, which the driver may give to a new stream once this one is destroyed.
    ``thread`` is the host thread of a per-thread default stream (``CU_STREAM_PER_THREAD``
    names a different stream in every thread), else None.
    """

    __slots__ = ("handle", "owner", "value", "key", "thread", "scratch")

    def __init__(self, handle: cu.CUstream, owner: Any = None, *, key: Any = None, scratch: Any = None):
        self.handle = handle
        self.owner = owner
        self.value = int(handle)  # the handle as an int (the allocation log's Stream column)
        self.key = key
        self.thread = threading.get_ident() if self.value == _PER_THREAD else None
        self.scratch = scratch  # the numba_pool.scratch block this thread bump-allocates from

    def belongs_to_another_thread(self) -> bool:
        """Whether this is another host thread's per-thread default stream, which the calling
        thread cannot name (``CU_STREAM_PER_THREAD`` is its own stream here)."""
        return self.thread is not None and self.thread != threading.get_ident()

    def with_scratch(self, block: Any) -> "StreamRef":
        """The same stream, with allocations carved from the scratch ``block``."""
        ref = StreamRef(self.handle, self.owner, key=self.key, scratch=block)
        ref.thread = self.thread
        return ref

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"StreamRef({self.value:#x})"


#: The legacy default stream, the allocation stream outside any ``using_stream`` scope.
LEGACY = StreamRef(cu.CUstream(cu.CU_STREAM_LEGACY), key="legacy")


def as_stream_ref(stream: Any) -> StreamRef:
    """Normalize a stream to a :class:`StreamRef`.

    Accepts a Numba stream (``cuda.stream()``, ``cuda.external_stream(ptr)``,
    ``cuda.default_stream()``...), a ``CUstream``, an int handle, or any object implementing the
    CUDA stream protocol (``__cuda_stream__``), such as CuPy and PyTorch streams, cuda.core's
    ``Stream`` and its ``GraphBuilder`` (numba-cuda launches kernels into a builder's capture:
    its stream is the one captured).  The legacy
    default stream, by handle 0 or ``CU_STREAM_LEGACY``, is always :data:`LEGACY`.

    :raises TypeError: for anything else, naming its type.
    """
    if isinstance(stream, StreamRef):
        return stream
    if isinstance(stream, cu.CUstream):
        handle, owner = stream, stream
    elif isinstance(stream, int) and not isinstance(stream, bool):
        handle, owner = cu.CUstream(stream), None
    elif isinstance(getattr(stream, "handle", None), cu.CUstream):  # numba.cuda.cudadrv.driver.Stream
        handle, owner = stream.handle, stream
    elif getattr(stream, "__cuda_stream__", None) is not None:
        protocol = stream.__cuda_stream__
        info = protocol() if callable(protocol) else protocol
        handle, owner = cu.CUstream(int(info[1])), stream
    else:
        raise TypeError(
            f"numba_pool: {type(stream).__name__} is not a CUDA stream: expected a Numba stream, a "
            "CUstream, an int handle or an object with __cuda_stream__")
    if int(handle) in _LEGACY_HANDLES:
        return LEGACY
    return StreamRef(handle, owner)


class _ThreadState(threading.local):
    # Class attribute: the value a thread sees before it enters any using_stream scope.
    stream: StreamRef = LEGACY


#: The calling thread's allocation stream: ``per_thread.stream``.
per_thread = _ThreadState()
#: Empty until some thread enters a using_stream or scratch scope: while it is, every thread's
#: allocation stream is LEGACY and the allocator skips the thread-local lookup.
scopes_entered: list = []


def enter_scope(ref: StreamRef) -> StreamRef:
    """Make ``ref`` the calling thread's allocation stream; returns the previous one."""
    if not scopes_entered:
        scopes_entered.append(True)
    previous = per_thread.stream
    per_thread.stream = ref
    return previous


def leave_scope(previous: StreamRef) -> None:
    """Make ``previous`` (what :func:`enter_scope` returned) the calling thread's allocation
    stream again."""
    per_thread.stream = previous


def current_stream() -> StreamRef:
    """The calling thread's allocation stream."""
    return per_thread.stream


@contextlib.contextmanager
def using_stream(stream: Any, on_entry: Callable[[StreamRef], None] | None = None) -> Iterator[StreamRef]:
    """Order the allocations made by this thread inside the block on ``stream``.

    Arrays allocated inside are allocated on ``stream`` and freed on it whenever they are
    dropped, also after the block has exited.  Work on ``stream`` may use them at once; work on
    any other stream must be ordered after ``stream`` by the caller (an event, a synchronize)
    and, if it may still run when the array is dropped, registered with
    :func:`numba_pool.record_stream`.  Scopes nest; the innermost wins.  The setting is per host
    thread.

    :param stream: see :func:`as_stream_ref`.
    :param on_entry: called with the scope's stream before the thread enters it.
        :func:`numba_pool.using_stream` passes the allocator's capture check
        (``allocator.captures.note_if_capturing``: rule 13 of :mod:`numba_pool.allocator`, a
        stream entered while it is being captured makes the capture known before its first
        allocation); this layer knows nothing of captures.
    :raises TypeError: when ``stream`` is not a stream.
    """
    ref = as_stream_ref(stream)
    if on_entry is not None:
        on_entry(ref)
    previous = enter_scope(ref)
    try:
        yield ref
    finally:
        leave_scope(previous)
