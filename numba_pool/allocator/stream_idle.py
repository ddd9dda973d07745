"""Rule 7a of :mod:`numba_pool.allocator`: a mempool block released on a non-blocking stream stays idle for it, and
its next allocation of the size takes it with no driver call (PyTorch's caching allocator keeps blocks per stream).

Note [Idle blocks of a stream]
    A block released on S with nothing else to wait for (a ``record_stream`` stream, a hold or ``defer_cleanup``
    take the ordered release) was last used by work on S or ordered before its release there; S runs its next
    owner's work after that, as the pool would after ``cuMemFreeAsync`` on S.  So:

    * only for a non-blocking S.  On a blocking stream a free is an operation that waits for the legacy stream's
      earlier work (CUDA Runtime API, "stream synchronization behavior"), so a legacy-stream use is ordered before
      work the program orders after S's; keeping the block enqueues nothing (the fuzzer found that race);
    * kept by S's driver id (``cuStreamGetId``, rule 6), never by handle, which a stream made later may get; an
      idle Block keeps no stream object (a dropped stream's blocks wait for trim, out of memory or reset);
    * not while S is being captured (``cuStreamIsCapturing`` at the release, any capture): the release is then the
      pool's free, which the driver refuses for memory no graph allocated (warned; never reused), as for
      cuda.core's own pool; a capturing S gets allocation nodes (rule 13);
    * within :data:`PER_STREAM_SIZE`, :data:`MAX_BYTES` and :data:`MAX_LISTS`; beyond, freed on S as before.

    Releases come from any thread without a lock.  :meth:`StreamIdle.take_all` and the pruning of empty lists pop
    a list from the table; a release that appended to a list no longer in it takes its block back out and frees
    it (or finds it taken, to be freed by the taker)."""

from __future__ import annotations

from cuda.bindings.driver import CUstream_flags

from ..cuda.capture import surely_not_capturing
from ..cuda.driver import SUCCESS
from ..cuda.streams import LEGACY, StreamRef
from .block import Block
from .fences import take_list

_NON_BLOCKING = int(CUstream_flags.CU_STREAM_NON_BLOCKING)
PER_STREAM_SIZE = 8  #: Idle blocks kept per stream and size.
MAX_BYTES = 256 << 20  #: Bytes kept idle for all streams together.
MAX_LISTS = 1024  #: (stream, size) pairs kept, empty ones pruned when reached.


class StreamIdle:
    """``lists``: (stream id, bytes) -> idle Blocks of that stream; ``nbytes``: their bytes, added without a lock (a
    lost update is undone by :meth:`take_all`)."""

    __slots__ = ("lists", "nbytes", "_cu")

    def __init__(self, cu):
        self.lists: dict[tuple, list[Block]] = {}
        self.nbytes = 0
        self._cu = cu

    def key_of(self, stream: StreamRef):
        """The key of ``stream``'s idle blocks: its driver id (``cuStreamGetId``, rule 6) for a non-blocking stream;
        False for a blocking one, or one the driver won't answer for.  Not on a capturing stream (the id invalidates
        its capture)."""
        cu = self._cu
        err, flags = cu.cuStreamGetFlags(stream.handle)
        if err != SUCCESS or not int(flags) & _NON_BLOCKING:
            return False
        err, stream_id = cu.cuStreamGetId(stream.handle)
        return stream_id if err == SUCCESS else False

    def keep(self, block: Block) -> bool:
        """The release gate's fast action for ``block`` (allocated on a stream other than the legacy one): True when
        kept idle, False when it is to be freed on its stream.  Any thread; never raises."""
        size = block.size
        stream = block.stream
        stream_key = stream.idle_key
        if stream_key is None or stream_key is False or self.nbytes + size > MAX_BYTES:
            return False
        if not surely_not_capturing(self._cu, stream.handle):
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

    def take(self, key, size: int) -> Block | None:
        """An idle block of ``size`` bytes for the stream of id ``key``, or None."""
        idle = self.lists.get((key, size))
        if idle:
            try:
                block = idle.pop()
            except IndexError:  # another thread took the last one
                return None
            self.nbytes -= size
            return block
        return None

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
        # The table is full: drop its empty lists; whether there is room now.
        for key, idle in list(self.lists.items()):
            if not idle:
                self.lists.pop(key, None)
        return len(self.lists) < MAX_LISTS
