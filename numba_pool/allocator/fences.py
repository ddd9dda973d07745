"""Rule 4 of :mod:`numba_pool.allocator`: a block released by its legacy-stream owner is reused
only once the host has seen a fence after its release complete.

A block allocated outside ``using_stream`` may be used by its owner on any blocking stream, so
its release cannot be ordered on one stream.  The legacy stream would order it (an operation
there waits for all earlier work of every blocking stream), but every operation there is also
a barrier: all later work of every blocking stream waits for it, and a kernel that waits for a
later copy on another stream then waits forever.  So a release makes no driver call: the block
waits in a list, and an allocation later records **one fence**, an event on the legacy stream,
for the whole batch, at most once per :data:`FENCE_BLOCKS` blocks or :attr:`Fences.fence_bytes`
bytes (Numba's default manager synchronizes the device once per 11 frees or 20 % of the
device's memory: ``CUDA_DEALLOCS_COUNT``, ``CUDA_DEALLOCS_RATIO``), and never while a
``defer_cleanup`` is open.  The batch is reused once the host has seen the fence complete
(``cuEventQuery``), never before: its blocks are then *idle*, no earlier work can touch them, and
they may go to any stream, as ``cuMemAlloc``'s memory may.  Until then allocations take other
memory.  A synchronize (trim, out of memory, reset) makes every batch taken before it idle.

The private streams (:class:`PrivateStream`): new memory for the legacy stream's owners comes
from the mempool on numba_pool's own non-blocking stream, which never waits for anything and
frees only idle blocks; with the pool's internal dependencies off
(``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES``, :mod:`numba_pool.cuda.mempool`) the pool
hands it only memory that is idle, so its allocations need no legacy-stream operation.  The
host sees each such allocation complete before the memory is handed out
(:meth:`PrivateStream.complete`; a fresh managed block used at once by a memset on the legacy
stream lost the memset otherwise: Numba's ``test_managed_alloc_driver_undersubscribe``, H100,
2026-11-26).

Threads: releases append to the batch lists with one atomic operation; :class:`Fences` is used
by allocations, trim and reset only, under :attr:`Fences.lock` (allocations try it and go on
when it is taken).
"""

from __future__ import annotations

import threading
from collections import deque

from ..cuda.driver import EVENT_FLAGS, SUCCESS, check, report_failure, warn
from ..cuda.streams import LEGACY

#: A fence is recorded once at least this many released blocks wait for one.
FENCE_BLOCKS = 32
#: ... or once they hold this fraction of the device's memory (Numba's ``CUDA_DEALLOCS_RATIO``).
FENCE_FRACTION = 0.2


class Fences:
    """The fences recorded and not yet seen complete, each with the batch of blocks it covers.

    :param cu: the driver object.
    :param fence_bytes: bytes of released blocks that make a fence due whatever their number.
    :param waits_for: events the next fence waits for first (recorded, at their release, on
        the streams registered for blocks with ``record_stream``); shared by a device's sources.
    :param lock: the lock of every fence of the device (one, so that a fence waits for every
        event of a block in its batch).
    :param after_fence: releases to run once the next fence completes, shared by a device's
        sources (Note [The legacy stream recorded] in :mod:`.waits`).
    """

    def __init__(self, cu, fence_bytes: int, waits_for: list | None = None, lock=None,
                 after_fence: list | None = None):
        self._cu = cu
        self._query = cu.cuEventQuery
        self.fence_blocks, self.fence_bytes = FENCE_BLOCKS, fence_bytes  # tests lower them
        self.waits_for = waits_for if waits_for is not None else []
        self.lock = lock if lock is not None else threading.Lock()
        self.after_fence = after_fence if after_fence is not None else []
        self.batches: deque = deque()  # (event, batch), oldest first; under lock
        self._spare: list = []  # events whose fence completed, to record again; under lock
        self.recorded = 0  # fences recorded so far (statistics)

    def due(self, blocks: int, nbytes: int, deferral) -> bool:
        """Whether ``blocks`` released blocks holding ``nbytes`` bytes call for a fence now:
        enough of them, and no ``defer_cleanup`` open (rule 4: nothing on the legacy stream
        while one is; Numba's own frees wait for its exit too)."""
        return (blocks >= self.fence_blocks or (blocks and nbytes >= self.fence_bytes)) and not deferral.depth

    def record(self, batch) -> None:
        """One event on the legacy stream, after ``batch`` was released; ``batch`` is handed
        back by :meth:`completed` once the host has seen it complete.

        :raises CudaAPIError: when the event cannot be made or recorded (nothing kept)."""
        cu = self._cu
        releases = take_list(self.after_fence)  # before the waits: their events were queued first
        waits_for = self.waits_for
        while waits_for:  # taken after the batch: a block's events were queued before it
            event = waits_for.pop()
            result = cu.cuStreamWaitEvent(LEGACY.handle, event, 0)
            cu.cuEventDestroy(event)  # the driver keeps it until the wait is done
            if not report_failure(result, "cuStreamWaitEvent (fence)"):  # rule 8's fallback
                report_failure(cu.cuCtxSynchronize(), "cuCtxSynchronize (fence)")
        event = self._spare.pop() if self._spare else check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate (fence)")
        result = cu.cuEventRecord(event, LEGACY.handle)
        if result[0] != SUCCESS:
            self._spare.append(event)
            self.after_fence.extend(releases)
            check(result, "cuEventRecord (fence)")
        self.batches.append((event, batch, releases))
        self.recorded += 1

    def completed(self) -> list:
        """The batches whose fence the host has seen complete (``cuEventQuery`` returns
        ``CUDA_SUCCESS``), oldest first; a fence not yet complete keeps the later ones too."""
        done = []
        batches, query = self.batches, self._query
        while batches:
            event, batch, releases = batches[0]
            if query(event)[0] != SUCCESS:
                break
            batches.popleft()
            self._spare.append(event)
            done.append(batch)
            run_releases(releases)
        return done

    def take_all(self, releases: list) -> list:
        """Every batch, complete or not (before a synchronize, which makes them idle); the
        releases waiting for them, or for the next fence, are added to ``releases``, for the
        caller to run (:func:`run_releases`) once its own synchronize is done."""
        done = []
        while self.batches:
            event, batch, waiting = self.batches.popleft()
            self._spare.append(event)
            done.append(batch)
            releases += waiting
        releases += take_list(self.after_fence)
        return done

    def destroy(self) -> None:
        """Destroy the events (a reset, after its synchronize); the batches are forgotten."""
        for event, _, _ in self.batches:
            report_failure(self._cu.cuEventDestroy(event), "cuEventDestroy (fence)")
        self.batches.clear()
        for event in take_list(self.waits_for):  # a generation that stopped allocating
            report_failure(self._cu.cuEventDestroy(event), "cuEventDestroy (fence wait)")
        while self._spare:
            report_failure(self._cu.cuEventDestroy(self._spare.pop()), "cuEventDestroy (fence)")


def take_list(items: list) -> list:
    """Everything in ``items`` now, taken one ``list.pop`` at a time (each atomic): an item
    that another thread appends or pops meanwhile is taken by exactly one of them."""
    taken = []
    while True:
        try:
            taken.append(items.pop())
        except IndexError:
            return taken


def run_releases(releases: list) -> None:
    """Run releases made free (idle) after a fence or a synchronize; a failure is warned of."""
    for release in releases:
        try:
            release()
        except Exception as err:  # noqa: BLE001 - a release never raises (rule 8)
            warn(f"could not make a block free after its fence: {err}")


class PrivateStream:
    """A non-blocking stream of numba_pool's own, made at its first use in the owner's context
    (an allocation, a trim): the legacy stream's owners' new memory comes from the mempool on
    one, which waits for nothing; the arena's slabs of other streams go back on another, after
    their domain's event; rule 13's side stream beside a capture is a third.

    :param cu: the driver object.
    :param what: what the stream is for, for the error of its creation.
    """

    def __init__(self, cu, what: str):
        self._cu = cu
        self._what = what
        self._handle = None

    @property
    def handle(self):
        """The stream (``CUstream``), made now if it was not yet.

        :raises CudaAPIError: when the driver refuses to make it."""
        if self._handle is None:
            flags = int(self._cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
            self._handle = check(self._cu.cuStreamCreate(flags), f"cuStreamCreate ({self._what})")
        return self._handle

    def complete(self) -> None:
        """Return once the host has seen every operation on the stream complete (an allocation
        is complete before its memory is used on another stream: "Stream Ordered Memory
        Allocator"): ``cuStreamQuery``, else ``cuStreamSynchronize``, which never waits for the
        program's work (the stream waits for nothing).

        :raises CudaAPIError: when the synchronize fails."""
        cu, handle = self._cu, self.handle
        if cu.cuStreamQuery(handle)[0] != SUCCESS:
            check(cu.cuStreamSynchronize(handle), f"cuStreamSynchronize ({self._what})")

    def destroy(self) -> None:
        """Destroy the stream if it was made (a reset, after its synchronize)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            report_failure(self._cu.cuStreamDestroy(handle), f"cuStreamDestroy ({self._what})")


#: The host-rule cache's fence is due at this many bytes of unfenced blocks (pinned and managed
#: blocks; Note [A release records nothing on the legacy stream] in :mod:`.host_blocks`).
HOST_FENCE_BYTES = 256 << 20


class SharedFence:
    """The legacy-stream event of one host fence (:meth:`HostFences.fence`) and how many blocks
    of its batch still need it (under the cache's lock)."""

    __slots__ = ("event", "users")

    def __init__(self, event, users: int):
        self.event, self.users = event, users


class HostFences:
    """The blocks of a host-rule cache (:mod:`.host_blocks`) released and binned whose
    legacy-stream event is not yet recorded, and the fences that record them: one point of the
    legacy stream for the whole batch.  Used under the cache's lock, in the owner's context.

    :param cu: the driver object.
    :param record: ``record(stream) -> event``: an event recorded on ``stream`` (the cache's).
    :param kind: the cache's kind (``"pinned"``, ``"managed"``), for the fallback's warning.
    """

    def __init__(self, cu, record, kind: str):
        self._cu = cu
        self._record = record
        self._kind = kind
        self.unfenced: list = []  # HostBlocks, oldest first
        self.fence_blocks, self.fence_bytes = FENCE_BLOCKS, HOST_FENCE_BYTES  # tests lower them
        self.deferral = None  # defer_cleanup's state, as the releases name it
        self.recorded = 0  # fences recorded so far (statistics)

    def add(self, block) -> None:
        """``block`` was binned: it waits for a fence unless it has one already."""
        if not block.fenced:
            self.unfenced.append(block)

    def discard(self, block) -> None:
        """``block`` leaves the cache (freed after a synchronize)."""
        if not block.fenced and block in self.unfenced:
            self.unfenced.remove(block)

    def fence_if_due(self, capturing: bool) -> None:
        """A fence once :attr:`fence_blocks` blocks or :attr:`fence_bytes` bytes wait, never
        while a ``defer_cleanup`` is open or a capture is under way (rule 13)."""
        unfenced = self.unfenced
        if not unfenced or capturing or (self.deferral is not None and self.deferral.depth):
            return
        if len(unfenced) >= self.fence_blocks or sum(b.size for b in unfenced) >= self.fence_bytes:
            self.fence()

    def fence(self) -> None:
        """One event on the legacy stream for every unfenced block: the batch shares it
        (:class:`SharedFence`), one driver call whatever its size.  Where the record fails, the
        context is synchronized instead (rule 8) and the blocks need none."""
        unfenced = self.unfenced
        if not unfenced:
            return
        try:
            shared = SharedFence(self._record(LEGACY), len(unfenced))
        except Exception as err:  # noqa: BLE001 - nothing earlier remains after the synchronize
            if report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
                warn(f"could not fence released {self._kind} blocks ({err}); synchronized the device instead")
                self.synchronized()
            return
        for block in unfenced:
            block.fence, block.fenced = shared, True
        unfenced.clear()
        self.recorded += 1

    @staticmethod
    def let_go(block, free_events: list) -> None:
        """``block`` leaves its fence (reused or freed): the fence's event goes back to
        ``free_events`` once no block of its batch needs it."""
        shared = block.fence
        if shared is not None:
            block.fence = None
            shared.users -= 1
            if not shared.users:
                free_events.append(shared.event)

    def synchronized(self) -> None:
        """The context was synchronized after every unfenced block was binned (a trim, rule 8's
        fallback): nothing earlier remains, so they are fenced and need no legacy-stream event."""
        for block in self.unfenced:
            block.fenced = True
        self.unfenced.clear()
