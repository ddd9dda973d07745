"""Rule 4 of :mod:`numba_pool.allocator`: a legacy-stream owner's released block is reused once the host saw a later
fence complete.  A release makes no driver call (a legacy-stream operation is a barrier: a kernel waiting for a later
copy on another stream would hang); an allocation records **one fence**, a legacy-stream event, per :data:`FENCE_BLOCKS`
blocks or :attr:`Fences.fence_bytes` bytes (as Numba's ``CUDA_DEALLOCS_COUNT``, ``CUDA_DEALLOCS_RATIO``), never in
``defer_cleanup``; the batch is idle once seen done (``cuEventQuery``) or synchronized.  :class:`PrivateStream`: legacy
owners' new memory is from our own non-blocking stream (``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`` off: only
idle memory), each allocation complete before hand-out (:meth:`PrivateStream.complete`; else a legacy-stream memset on a
fresh managed block was lost).  Threads: releases append atomically; allocations take :attr:`Fences.lock` if free."""

from __future__ import annotations

import threading
from collections import deque

from ..cuda.driver import EVENT_FLAGS, SUCCESS, check, report_failure, warn
from ..cuda.streams import LEGACY

FENCE_BLOCKS = 32  #: A fence is recorded once at least this many released blocks wait for one...
FENCE_FRACTION = 0.2  #: ... or once they hold this fraction of the device's memory (Numba's ``CUDA_DEALLOCS_RATIO``).


class AfterFence(list):
    """Releases made free after the next fence (Note [The legacy stream recorded] in .waits), appended and taken with
    atomic list operations; ``nbytes``, the bytes their blocks hold, counts toward a fence being due with the
    pending blocks' (:meth:`Fences.due`).  Added and zeroed without a lock, bytes before the release and the list
    before the bytes, so that a race loses bytes (a fence comes later); bytes left with the list empty (a
    finalizer's add inside ``+=``) are dropped by :meth:`Fences.due`."""

    __slots__ = ("nbytes",)

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def add(self, release, nbytes: int) -> None:
        """``release`` (any thread) runs after the next fence; ``nbytes``: the bytes it makes free."""
        self.nbytes += nbytes
        self.append(release)

    def take(self) -> list:
        """Every release in the list (:func:`take_list`); the byte count starts again."""
        taken = take_list(self)
        self.nbytes = 0
        return taken


class Fences:
    """The fences recorded, not yet seen complete, with their batches; a device's sources share ``waits_for``
    (events the next fence waits for), ``lock`` and ``after_fence`` (Note [The legacy stream recorded])."""

    def __init__(self, cu, fence_bytes: int, waits_for: list | None = None, lock=None,
                 after_fence: AfterFence | None = None, unseen: list | None = None):
        self._cu = cu
        self._query = cu.cuEventQuery
        self.fence_blocks, self.fence_bytes = FENCE_BLOCKS, fence_bytes  # tests lower them
        self.waits_for = waits_for if waits_for is not None else []
        self.lock = lock if lock is not None else threading.Lock()
        self.after_fence = after_fence if after_fence is not None else AfterFence()
        # Releases a fence ran whose events were not yet seen done (Note [A named stream is not waited for] in
        # .device): run again after each later fence, never counted toward one being due.
        self.unseen = unseen if unseen is not None else []
        self.batches: deque = deque()  # (event, batch), oldest first; under lock
        self._spare: list = []  # events whose fence completed, to record again; under lock
        self.recorded = 0  # fences recorded so far (statistics)

    def due(self, blocks: int, nbytes: int, deferral) -> bool:
        """Whether ``blocks`` blocks of ``nbytes`` bytes (the releases in :attr:`after_fence` added) call for a
        fence, outside ``defer_cleanup``."""
        after = self.after_fence
        if not after and after.nbytes:  # left by a race (AfterFence): nothing holds them
            after.nbytes = 0
        blocks, nbytes = blocks + len(after), nbytes + after.nbytes
        return (blocks >= self.fence_blocks or (blocks and nbytes >= self.fence_bytes)) and not deferral.depth

    def record(self, batch) -> None:
        """A legacy-stream event after ``batch``, for :meth:`completed`.  :raises CudaAPIError: if not made/recorded."""
        cu = self._cu  # the fence's event first: a failure to make one loses no release
        event = self._spare.pop() if self._spare else check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate (fence)")
        taken_bytes = self.after_fence.nbytes
        releases = self.after_fence.take()  # before the waits: their events were queued first
        releases += take_list(self.unseen)
        waits_for = self.waits_for
        while waits_for:  # taken after the batch: a block's events were queued before it
            waited = waits_for.pop()
            result = cu.cuStreamWaitEvent(LEGACY.handle, waited, 0)
            cu.cuEventDestroy(waited)  # the driver keeps it until the wait is done
            if not report_failure(result, "cuStreamWaitEvent (fence)"):  # rule 8's fallback
                report_failure(cu.cuCtxSynchronize(), "cuCtxSynchronize (fence)")
        result = cu.cuEventRecord(event, LEGACY.handle)
        if result[0] != SUCCESS:
            self._spare.append(event)
            self.after_fence.extend(releases)
            self.after_fence.nbytes += taken_bytes
            check(result, "cuEventRecord (fence)")
        self.batches.append((event, batch, releases))
        self.recorded += 1

    def completed(self) -> list:
        """The batches whose fence completed (``cuEventQuery``), oldest first, stopping at one not; their releases
        run, and the :attr:`unseen` ones again."""
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
        if self.unseen:  # looked at again (cuEventQuery), with no fence of their own
            run_releases(take_list(self.unseen))
        return done

    def take_all(self, releases: list) -> list:
        """All batches (before a synchronize); their releases join ``releases``, for :func:`run_releases`."""
        done = []
        while self.batches:
            event, batch, waiting = self.batches.popleft()
            self._spare.append(event)
            done.append(batch)
            releases += waiting
        releases += self.after_fence.take()
        releases += take_list(self.unseen)
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
    """Everything in ``items``, one atomic ``list.pop`` at a time (safe against other threads)."""
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
    """Our non-blocking stream (made at first use, as owner) for legacy new memory, slab returns, rule 13 (``what``)."""

    def __init__(self, cu, what: str):
        self._cu = cu
        self._what = what
        self._handle = None

    @property
    def handle(self):
        """The stream (``CUstream``), made at first use.  :raises CudaAPIError: when the driver refuses to make it."""
        if self._handle is None:
            flags = int(self._cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
            self._handle = check(self._cu.cuStreamCreate(flags), f"cuStreamCreate ({self._what})")
        return self._handle

    def complete(self) -> None:
        """Wait out the stream (``cuStreamQuery``, else ``cuStreamSynchronize``).  :raises CudaAPIError: on failure."""
        cu, handle = self._cu, self.handle
        if cu.cuStreamQuery(handle)[0] != SUCCESS:
            check(cu.cuStreamSynchronize(handle), f"cuStreamSynchronize ({self._what})")

    def destroy(self) -> None:
        """Destroy the stream if it was made (a reset, after its synchronize)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            report_failure(self._cu.cuStreamDestroy(handle), f"cuStreamDestroy ({self._what})")


#: Unfenced pinned/managed bytes making a host-rule fence due (Note [A release records nothing on the legacy stream]).
HOST_FENCE_BYTES = 256 << 20


class SharedFence:
    """One host fence's legacy-stream event (:meth:`HostFences.fence`) and how many blocks of its batch need it."""

    __slots__ = ("event", "users")

    def __init__(self, event, users: int):
        self.event, self.users = event, users


class HostFences:
    """A host-rule cache's binned blocks awaiting a legacy-stream fence, and the fences (one event per batch); under
    the cache's lock, as :class:`SharedFence` is.  ``record(stream) -> event``."""

    def __init__(self, cu, record, kind: str):
        self._cu = cu
        self._record = record
        self._kind = kind
        self.unfenced: list = []  # HostBlocks, oldest first
        self.fence_blocks, self.fence_bytes = FENCE_BLOCKS, HOST_FENCE_BYTES  # tests lower them
        self.deferral = None  # defer_cleanup's state: the host cache's (HostBlocks sets it)
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
        """Fence at :attr:`fence_blocks` blocks or :attr:`fence_bytes` bytes; never in ``defer_cleanup`` or capture."""
        unfenced = self.unfenced
        if not unfenced or capturing or (self.deferral is not None and self.deferral.depth):
            return
        if len(unfenced) >= self.fence_blocks or sum(b.size for b in unfenced) >= self.fence_bytes:
            self.fence()

    def fence(self) -> None:
        """One legacy-stream event for the unfenced blocks (:class:`SharedFence`); else synchronize (rule 8)."""
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
        """``block`` (reused or freed) leaves its fence, whose event joins ``free_events`` once unneeded."""
        shared = block.fence
        if shared is not None:
            block.fence = None
            shared.users -= 1
            if not shared.users:
                free_events.append(shared.event)

    def synchronized(self) -> None:
        """After a synchronize: every unfenced block counts as fenced."""
        for block in self.unfenced:
            block.fenced = True
        self.unfenced.clear()
