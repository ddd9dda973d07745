"""Rules 2 and 8 of :mod:`numba_pool.allocator`, shared by every block source: what a release
waits for, the releases ``defer_cleanup`` holds back, and the synchronize fallback.

What a release waits for is registered per block (by its start address) in
:attr:`StreamWaits.waiting`: the streams given to :func:`numba_pool.record_stream` (the
release orders its allocation stream after their work, on the device) and *holds*, objects
that keep the block from reuse for a reason outside CUDA's streams (an IPC export's leases,
:mod:`numba_pool.ipc`).  A hold has one method, ``defer(release) -> bool``: True when it keeps
the block now and will call ``release`` once it lets go (from any thread), False when it does
not keep it.

A block source's release takes the slow path (:meth:`StreamWaits.release`) only when its own
block has something registered, a ``defer_cleanup`` is open, or its stream needs care; every
other release stays on the source's fast path.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from functools import partial
from typing import Callable, Protocol

from ..cuda.context import OwnerContext
from ..cuda.driver import EVENT_FLAGS, check, report_failure, warn
from ..cuda.streams import StreamRef


class CannotOrder(RuntimeError):
    """A release that cannot be ordered on the device (rule 8's fallback follows)."""


class Hold(Protocol):
    """Something other than a stream that keeps a released block from reuse (an IPC export)."""

    def defer(self, release: Callable[[], None]) -> bool:
        """True when the block is kept now: ``release`` is then called once it is not (from any
        thread, never raising); False when it is not kept."""


def split_waiting(waiting: list | None) -> tuple[list[StreamRef], list[Hold]]:
    """A block's registered waits as (streams, holds)."""
    if not waiting:
        return [], []
    streams = [w for w in waiting if isinstance(w, StreamRef)]
    return streams, [w for w in waiting if not isinstance(w, StreamRef)]


def run_when_released(holds: list[Hold], release: Callable[[], None]) -> None:
    """Run ``release`` now, or once the last of ``holds`` that keeps the block lets it go."""
    for index, hold in enumerate(holds):
        if hold.defer(partial(run_when_released, holds[index + 1:], release)):
            return
    release()


class StreamWaits:
    """One device allocator's release ordering (rules 2 and 8) and ``defer_cleanup`` hold-back.

    ``waiting`` (block start -> streams and holds), ``held`` and ``held_back`` take atomic
    operations only (releases run in finalizers); ``depth`` changes under ``_lock``.
    """

    def __init__(self, cu, owner: OwnerContext | None = None):
        self._cu = cu
        self.owner = owner if owner is not None else OwnerContext(cu, None)  # rule 10
        self.waiting: dict[int, list] = {}  # block start -> StreamRefs and holds; atomic operations only
        self.depth = 0  # open defer_cleanup blocks; guarded by _lock
        self.held_back: deque = deque()  # releases deferred by defer_cleanup; atomic operations only
        # Block start -> (stream, publish, recorded streams) of a release a hold keeps; atomic
        # operations only.
        self.held: dict[int, tuple] = {}
        self._lock = threading.Lock()

    def add_wait(self, start: int, what: StreamRef | Hold) -> None:
        """Make the release of the block starting at ``start`` wait for ``what``: the work
        queued on a stream by then (``record_stream``), or a hold until it lets go."""
        self.waiting.setdefault(start, []).append(what)

    def release(self, start: int, stream: StreamRef, publish: Callable[[bool], None]) -> None:
        """Release a block allocated on ``stream``: now or, inside ``defer_cleanup``, at its
        outermost exit.  ``publish(synchronized)`` makes the block free (it may raise; then
        the fallback synchronizes and calls ``publish(True)``).  Never raises."""
        if self.depth and self.defer(partial(self._release_now, start, stream, publish)):
            return
        self._release_now(start, stream, publish)

    def defer(self, release: Callable[[], None]) -> bool:
        """Inside ``defer_cleanup``: keep ``release`` for the outermost exit and return True;
        else False (the caller releases now).  Device and host blocks alike."""
        if not self.depth:
            return False
        self.held_back.append(release)
        if not self.depth:  # the block exited while we were appending: flush ourselves
            self.flush()
        return True

    def _release_now(self, start: int, stream: StreamRef, publish: Callable[[bool], None]) -> None:
        waiting = self.waiting.pop(start, None) if self.waiting else None
        if waiting is None:
            self.owner.enter(self._order, start, stream, publish, None)  # rule 10
            return
        streams, holds = split_waiting(waiting)
        if holds:
            self.held[start] = (stream, publish, streams)
            run_when_released(holds, partial(self._release_unheld, start))
            return
        self.owner.enter(self._order, start, stream, publish, streams)  # rule 10

    def _release_unheld(self, start: int) -> None:
        kept = self.held.pop(start, None)
        if kept is not None:  # else a reset released it (release_held)
            stream, publish, streams = kept
            self.owner.enter(self._order, start, stream, publish, streams)  # rule 10

    def release_held(self) -> None:
        """After a synchronize (a reset, before the pool goes): make every block a hold still
        keeps free at once.  Nothing earlier remains, so no stream of theirs is named (they may
        be destroyed by now)."""
        while self.held:
            try:
                start, (_, publish, _) = self.held.popitem()
            except KeyError:  # the hold let go meanwhile
                return
            self._publish_synchronized(start, publish)

    def _order(self, start: int, stream: StreamRef, publish: Callable[[bool], None],
               recorded: list[StreamRef] | None, retry: bool) -> None:
        try:
            if stream.belongs_to_another_thread():
                raise CannotOrder("it was allocated on another thread's per-thread default stream")
            if recorded:
                self._wait_on_streams(recorded, stream)
            publish(False)
        except Exception as err:  # noqa: BLE001 - rule 8: a release never raises
            if retry and self.owner.retry(self._order, start, stream, publish, recorded):  # rule 10
                return
            self._synchronize_instead(start, stream, publish, err)

    def order_now(self, recorded: list[StreamRef], stream: StreamRef) -> None:
        """Make ``stream``'s later work wait for the work queued on each ``recorded`` stream by
        now (an event recorded on each, waited for by ``stream``).  For a scratch array, whose
        block is released later: its recorded streams may be destroyed by then.  Never raises
        (rule 8: the fallback synchronizes)."""
        self.owner.enter(self._order_now, recorded, stream)  # rule 10

    def _order_now(self, recorded: list[StreamRef], stream: StreamRef, retry: bool) -> None:
        try:
            if stream.belongs_to_another_thread():
                raise CannotOrder("the block is on another thread's per-thread default stream")
            self._wait_on_streams(recorded, stream)
        except Exception as err:  # noqa: BLE001 - rule 8
            if retry and self.owner.retry(self._order_now, recorded, stream):  # rule 10
                return
            if report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
                warn(f"could not order a scratch array's recorded streams on stream {stream.value:#x} "
                     f"({err}); synchronized the device instead")

    def _wait_on_streams(self, recorded: list[StreamRef], stream: StreamRef) -> None:
        cu = self._cu
        for ref in recorded:
            if ref.belongs_to_another_thread():
                raise CannotOrder("a stream recorded for it is another thread's per-thread default stream")
            if ref.value == stream.value and ref.thread == stream.thread:
                continue
            event = check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
            try:
                check(cu.cuEventRecord(event, ref.handle), "cuEventRecord (record_stream)")
                check(cu.cuStreamWaitEvent(stream.handle, event, 0), "cuStreamWaitEvent (record_stream)")
            finally:
                cu.cuEventDestroy(event)  # the driver keeps it until the wait is done

    def _synchronize_instead(self, start: int, stream: StreamRef, publish, err: Exception) -> None:
        if not report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
            return  # the context is gone, and the memory with it
        warn(f"could not order the release of block {start:#x} on stream {stream.value:#x} ({err}); "
             "synchronized the device instead")
        self._publish_synchronized(start, publish)

    @staticmethod
    def _publish_synchronized(start: int, publish) -> None:
        try:
            publish(True)
        except Exception as err:  # noqa: BLE001 - rule 8
            warn(f"could not release block {start:#x} after synchronizing: {err}")

    @contextlib.contextmanager
    def holding_back(self):
        """While active, releases are held back; the outermost exit does them."""
        with self._lock:
            self.depth += 1
        try:
            yield
        finally:
            with self._lock:
                self.depth -= 1
                done = self.depth == 0
            if done:
                self.flush()

    def flush(self) -> None:
        """Do the releases held back so far (reset does them before the pool goes)."""
        while True:
            try:
                release = self.held_back.popleft()
            except IndexError:
                return
            release()
