"""Rule 7a of :mod:`numba_pool.allocator`: a mempool block released on a non-blocking stream stays idle for it; its
next allocation of the size takes it with no alloc or free call (PyTorch's caching allocator keeps blocks per stream).

Note [Idle blocks of a stream]
    A block released on S with nothing else to wait for (``record_stream``, holds and ``defer_cleanup`` take the
    ordered release) was last used on S or before its release there; S runs its next owner after that, as the pool
    would after ``cuMemFreeAsync`` on S.  Hence: only a non-blocking S (on a blocking stream a free is an operation
    that waits for the legacy stream's earlier work, CUDA Runtime API "stream synchronization behavior"; keeping
    enqueues nothing: the fuzzer found that race); keyed by S's driver id (``cuStreamGetId``, rule 6), never by
    handle; an idle Block keeps no stream object (a dropped stream's blocks wait for trim, out of memory, reset);
    never while S is captured (``cuStreamIsCapturing`` at the release, any capture: the release stays the pool's
    free, refused by the driver for memory no graph allocated, as for cuda.core's pool); within
    :data:`PER_STREAM_SIZE`, :data:`MAX_BYTES` and :data:`MAX_LISTS`, beyond which it is freed on S.  A hit settles
    no fence (a miss does).  No lock: :meth:`StreamIdle.take_all` and the pruning pop lists from the table; a release
    that appended to one no longer in it takes its block back out and frees it, or finds it taken (freed or put back
    by the taker)."""

from __future__ import annotations

from cuda.bindings.driver import CUstream_flags

from ..cuda.capture import NOT_CAPTURING
from ..cuda.driver import NOT_CAPTURING_ANSWER, SUCCESS, hot
from ..cuda.streams import LEGACY, StreamRef
from .block import Block
from .fences import take_list

_NON_BLOCKING = int(CUstream_flags.CU_STREAM_NON_BLOCKING)  #: ``cuStreamGetFlags``'s bit for a non-blocking stream.
PER_STREAM_SIZE = 8  #: Idle blocks kept per stream and size.
MAX_BYTES = 256 << 20  #: Bytes kept idle for all streams together.
MAX_LISTS = 1024  #: (stream, size) pairs kept, empty ones pruned when reached.


class StreamIdle:
    """``lists``: (stream id, bytes) -> idle Blocks (popped by ``PooledBlocks.allocate_block``); ``nbytes``: their
    bytes, counted again when off (no lock)."""

    __slots__ = ("lists", "nbytes", "_cu", "_capture_status")

    def __init__(self, cu):
        self.lists: dict[tuple, list[Block]] = {}
        self.nbytes = 0
        self._cu = cu
        self._capture_status = hot(cu, "cuStreamIsCapturing")

    def key_of(self, stream: StreamRef):
        """``stream``'s idle key: its ``cuStreamGetId`` (``stream.key``, asked once with the arena's domains) if
        non-blocking, else False (also when the driver won't say).  Not on a capturing stream: the id invalidates it."""
        cu = self._cu
        err, flags = cu.cuStreamGetFlags(stream.handle)
        if err != SUCCESS or not int(flags) & _NON_BLOCKING:
            return False
        if stream.key is None:
            err, stream_id = cu.cuStreamGetId(stream.handle)
            stream.key = stream_id if err == SUCCESS else None
        return False if stream.key is None else stream.key

    def keep(self, block: Block) -> bool:
        """The gate's fast action for a non-legacy ``block``: kept (True), or to free on its stream.  Never raises."""
        size, stream = block.size, block.stream
        stream_key = stream.idle_key
        if stream_key is None or stream_key is False:  # unknown, or a blocking stream
            return False
        if not 0 <= self.nbytes <= MAX_BYTES - size:  # full, or the unlocked count drifted: count again
            self.nbytes = self.held_bytes()
            if self.nbytes > MAX_BYTES - size:
                return False
        answer = self._capture_status(stream.handle)  # the driver says surely not capturing
        if answer is not NOT_CAPTURING_ANSWER and (answer[0] != SUCCESS or answer[1] != NOT_CAPTURING):
            return False
        lists, key = self.lists, (stream_key, size)
        idle = lists.get(key)
        if idle is None:
            if len(lists) >= MAX_LISTS and not self._prune():
                return False
            idle = lists.setdefault(key, [])
        if len(idle) >= PER_STREAM_SIZE:
            return False
        block.stream = LEGACY  # while idle: no stream object kept alive
        idle.append(block)
        self.nbytes += size
        if lists.get(key) is idle:
            return True
        try:  # popped meanwhile (take_all, a prune): take it back and free it
            idle.remove(block)
        except ValueError:  # taken with the list: its taker frees it
            return True
        block.stream = stream
        self.nbytes -= size
        return False

    def take_all(self) -> list[Block]:
        """Every idle block (for a synchronize, then a free), the table emptied."""
        taken: list[Block] = []
        for key in list(self.lists):
            idle = self.lists.pop(key, None)
            if idle is not None:
                taken += take_list(idle)
        self.nbytes = 0
        return taken

    def held_bytes(self) -> int:
        """Bytes kept idle now."""
        return sum(size * len(idle) for (_, size), idle in list(self.lists.items()))

    def _prune(self) -> bool:
        # The table is full: drop empty lists (a release's block appended between the test and the pop goes back).
        lists = self.lists
        for key, idle in list(lists.items()):
            if not idle and lists.pop(key, None) is idle and idle:
                home = lists.setdefault(key, idle)
                if home is not idle:
                    home.extend(take_list(idle))
        return len(lists) < MAX_LISTS
