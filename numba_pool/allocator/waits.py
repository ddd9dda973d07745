"""Rules 2 and 8 of :mod:`numba_pool.allocator`, for every block source: what a release waits for, the releases
``defer_cleanup`` holds back, the synchronize fallback.  A block's ``waits``: :func:`numba_pool.record_stream`
streams and *holds* (:class:`Hold`: IPC leases, :class:`SeenHold`) registered on it (:meth:`StreamWaits.add_wait`);
with some, inside ``defer_cleanup``, or when its stream needs care, the release gate takes :meth:`StreamWaits.release`.

Note [A release made free later orders now]
    A release made free later (``defer_cleanup``, a hold) orders *at the drop*, while its streams live: its stream waits
    for the recorded ones, ``settle`` runs, an event is recorded on it.  Made free, it waits until the host sees that
    event done (``cuEventQuery``, else after each later fence; no stream waits for it: the legacy stream's wait would
    be a barrier, rule 4), then, at ``defer_cleanup``'s exit, for the next fence (after the blocking streams' work
    queued by then, docs/guide.md), else (a hold let go) no more; no stream handle outlives the drop.

Note [The legacy stream recorded]
    A block of stream S whose release must wait for the legacy stream would need a legacy-stream operation at
    the drop.  Instead S waits for the other streams, settle runs, an event is recorded on S, and the release, in
    :attr:`StreamWaits.after_fence`, is idle once the next fence completes and the host sees that event done.  No
    stream waits for the event: had the fence waited for it, a kernel on S waiting for later work of a blocking
    stream would hang, that work following the fence (a legacy-stream operation)."""

from __future__ import annotations

import contextlib
import threading
from functools import partial
from typing import Callable, Protocol

from ..cuda.capture import relaxed
from ..cuda.context import OwnerContext
from ..cuda.driver import EVENT_FLAGS, NOT_READY, check, report_failure, warn
from ..cuda.streams import LEGACY, StreamRef
from . import captures
from .block import AWAITING_FREE, Block, add_wait, take_waits
from .fences import AfterFence, take_list
from .held import Held


class CannotOrder(RuntimeError):
    """A release that cannot be ordered on the device (rule 8's fallback follows)."""


class Hold(Protocol):
    """Something other than a stream that keeps a released block from reuse (an IPC export)."""

    def defer(self, release: Callable[[], None]) -> bool:
        """True if the block is kept: ``release`` is called once it is not (any thread, never raising), else False."""


class Fenced(StreamRef):
    """A stream a release names that the block's stream must not wait for (Note [A named stream is not waited for]
    in :mod:`.device`): the release records an event on it (and on the block's stream), and is idle after the next
    fence once the host sees those events done (:meth:`StreamWaits._after_fence_events`)."""

    __slots__ = ()


class SeenHold:
    """A hold (rule 2) let go once the host sees a stream's work done (:meth:`StreamWaits.let_go_after`): on a block set
    aside at a dangling holder's address (Note [An address a reset gave again] in :mod:`numba_pool.plugin.serving`),
    and on a scratch block for a carved array's recorded stream (:mod:`.scratch`).  The block's release waits until
    :meth:`let_go`.  Atomic operations only: the holder frees in any thread, and a capture may hold the release back
    past the let-go."""

    __slots__ = ("_kept", "_gone", "nbytes")

    def __init__(self, nbytes: int):
        self._kept: list = []  # the release, until let go; atomic operations only
        self._gone = False
        self.nbytes = nbytes  # the bytes it stands for (toward a fence being due: Fences.due): its block's, its carve's

    def defer(self, release: Callable[[], None]) -> bool:
        """Keep ``release`` until :meth:`let_go` (run now if that came first); True."""
        self._kept.append(release)
        if self._gone:  # let go already (or meanwhile): whoever pops it runs it
            self._run()
        return True

    def let_go(self) -> None:
        """The holder's stream's work is seen done: the release kept (or kept later) runs."""
        self._gone = True
        self._run()

    def _run(self) -> None:
        for release in take_list(self._kept):  # each popped once, whichever thread runs it
            release()


def fenced(ref: StreamRef) -> Fenced:
    """``ref`` as a :class:`Fenced` stream (the same handle, owner, thread and keys)."""
    made = Fenced(ref.handle, ref.owner, key=ref.key, value=ref.value)
    made.thread, made.idle_key = ref.thread, ref.idle_key
    return made


def _after_a_fence(ref: StreamRef) -> bool:
    # Recorded for the fence rather than waited for by the block's stream: the legacy stream, or a Fenced one.
    return ref is LEGACY or type(ref) is Fenced


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


class Deferral:
    """``defer_cleanup``'s state across resets (as Numba's counter); ``depth`` under ``_lock``, ``held_back`` atomic."""

    def __init__(self):
        self.depth = 0  # open defer_cleanup blocks; guarded by _lock
        self.held_back = Held()  # releases to do at the outermost exit
        self._lock = threading.Lock()

    def defer(self, release: Callable[[], None]) -> bool:
        """Inside ``defer_cleanup``: keep ``release`` for the outermost exit, True; else False."""
        if not self.depth:
            return False
        self.held_back.keep(release)
        if not self.depth:  # the block exited while we were appending: flush ourselves
            self.flush()
        return True

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
        """Do the releases held back so far (a reset does them before the pool goes)."""
        for release in self.held_back.drain():
            release()


class StreamWaits:
    """An allocator's release ordering (rules 2, 8): ``held`` takes atomic operations only, registrations ``_lock``."""

    def __init__(self, cu, owner: OwnerContext | None = None, deferral: Deferral | None = None,
                 after_fence: AfterFence | None = None, unseen: list | None = None):
        # ``after_fence`` and ``unseen`` (as ``deferral``) the manager's, across resets: a dropped generation's
        # releases made free later are run by the next generation's fences (a reset's own, before them).
        self._cu = cu
        self.owner = owner if owner is not None else OwnerContext(cu, None)  # rule 10
        self.deferral = deferral if deferral is not None else Deferral()
        self._lock = threading.Lock()  # held by add_wait: two registrations at once both count
        self.fence_waits: list = []  # events the next fence waits for (rule 4); atomic operations only
        # Releases made free after the next fence (Note [The legacy stream recorded]); atomic operations only.
        self.after_fence = after_fence if after_fence is not None else AfterFence()
        # Those a fence ran before their events were seen done (:func:`_once_seen_done`); likewise.
        self.unseen = unseen if unseen is not None else []
        self.fence_lock = threading.Lock()  # held by whoever records a fence or takes the batches
        self.held = Held()  # Block -> (event or None, publish) of a release a hold keeps

    def add_wait(self, block: Block, what: StreamRef | Hold) -> None:
        """Make the release of ``block`` wait for ``what`` (a stream, or a hold)."""
        with self._lock:
            add_wait(block, what)

    def release(self, block: Block, stream: StreamRef, publish: Callable[[StreamRef | None], None],
                settle: Callable[[StreamRef], None] | None = None) -> None:
        """Release ``block`` of ``stream`` after its ``waits`` (taken), now or later (``defer_cleanup``, a hold).
        ``settle`` runs once the recorded streams are waited for; ``publish(on)`` frees it ordered on ``on`` (None:
        after a synchronize).  Never raises; only the release gate calls it, after rule 13's hold-back."""
        streams, holds = split_waiting(take_waits(block))
        if holds or not self.deferral.depth:  # one defer_cleanup holds back stays allocated until made free
            block.state = AWAITING_FREE
        if holds or self.deferral.depth:
            self.owner.enter(self._order_for_later, block, stream, publish, streams, settle, holds)  # rule 10
        else:
            self.owner.enter(self._order, block, stream, publish, streams, settle)  # rule 10

    def _order(self, block: Block, stream: StreamRef, publish, recorded: list[StreamRef], settle, retry: bool) -> None:
        try:
            if stream is not LEGACY and any(_after_a_fence(ref) for ref in recorded):
                self._order_on(stream, [ref for ref in recorded if not _after_a_fence(ref)], settle)
                events = self._after_fence_events(stream, recorded)
                self.after_fence.add(_once_done(self._cu, self.unseen, events, partial(publish, None)), block.size)
                return
            self._order_on(stream, recorded, settle)
            publish(stream)
        except Exception as err:  # noqa: BLE001 - rule 8: a release never raises
            if retry and self.owner.retry(self._order, block, stream, publish, recorded, settle):  # rule 10
                return
            if self._after_the_capture(self._order, block, stream, publish, recorded, settle):
                return
            if self._synchronize_instead(block, stream, err):
                self._publish_synchronized(block, publish)

    def _order_on(self, stream: StreamRef, recorded: list[StreamRef], settle) -> None:
        if stream.belongs_to_another_thread():
            raise CannotOrder("it was allocated on another thread's per-thread default stream")
        if recorded:
            self._wait_on_streams(recorded, stream)
        if settle is not None:
            settle(stream)

    # -- made free later (Note [A release made free later orders now]) -----------------------
    def _order_for_later(self, block: Block, stream: StreamRef, publish, recorded: list[StreamRef], settle,
                         holds: list, retry: bool) -> None:  # Note [A release made free later orders now]
        try:
            if stream is not LEGACY and any(_after_a_fence(ref) for ref in recorded):  # Note [The legacy stream recorded]
                settle = settle or _no_settle  # the event below is named by the fence, not here
                self._order_on(stream, [ref for ref in recorded if not _after_a_fence(ref)], settle)
                events = self._after_fence_events(stream, recorded)
                publish = partial(_after_the_next_fence, self.after_fence, publish, self._cu, self.unseen, events,
                                  block.size)
                event = None
            else:
                self._order_on(stream, recorded, settle)
                event = None if stream is LEGACY or settle is not None else self._record(stream)
        except Exception as err:  # noqa: BLE001 - rule 8
            if retry and self.owner.retry(self._order_for_later, block, stream, publish, recorded, settle, holds):
                return
            if self._after_the_capture(self._order_for_later, block, stream, publish, recorded, settle, holds):
                return
            if not self._synchronize_instead(block, stream, err):
                return
            self._later(block, None, partial(_after_synchronize, block, publish), holds)
            return
        self._later(block, event, publish, holds)

    def _after_fence_events(self, stream: StreamRef, recorded: list[StreamRef]) -> list:
        """For a release of ``stream`` (not legacy) after the legacy stream or a :class:`Fenced` one among
        ``recorded``: returns events on each Fenced stream, and then on ``stream``, that the host must see done
        (``cuEventQuery``) after the next fence, which orders the legacy stream's work (Note [The legacy stream
        recorded]): never a stream's wait (Note [A named stream is not waited for] in :mod:`.device`).
        :raises CannotOrder: another thread's per-thread stream."""
        # The legacy stream's work: the fence's; the block's stream: seen done, never waited on.
        return self._events_on([ref for ref in recorded if type(ref) is Fenced] + [stream])

    def _events_on(self, streams: list[StreamRef]) -> list:
        """An event recorded on each of ``streams``, for the host to see done; none left if one fails.
        :raises CannotOrder: another thread's per-thread stream.  :raises CudaAPIError: the driver refused."""
        events = []
        try:
            for ref in streams:
                if ref.belongs_to_another_thread():
                    raise CannotOrder("a stream it names is another thread's per-thread default stream")
                events.append(self._record(ref))
        except Exception:
            for event in events:
                self._cu.cuEventDestroy(event)
            raise
        return events

    def _record(self, stream: StreamRef):
        cu = self._cu
        event = check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
        try:
            check(cu.cuEventRecord(event, stream.handle), "cuEventRecord (release made free later)")
        except Exception:
            cu.cuEventDestroy(event)
            raise
        return event

    def _later(self, block: Block, event, publish, holds: list) -> None:
        if holds:
            self.held.keep((event, publish), block)
            run_when_released(holds, partial(self._release_unheld, block))
            return
        made_free = partial(self._made_free, block, event, publish, LEGACY)  # Note [... made free later orders now]
        if not self.deferral.defer(made_free):
            made_free()

    def _release_unheld(self, block: Block) -> None:
        kept = self.held.let_go(block)
        if kept is not None:  # else a reset released it (release_held)
            self._made_free(block, *kept, None)

    def _made_free(self, block: Block, event, publish, seen) -> None:
        block.state = AWAITING_FREE
        self.owner.enter(self._publish_after, block, event, publish, seen)  # rule 10

    def _publish_after(self, block: Block, event, publish, seen, retry: bool) -> None:
        # ``seen``: what ``publish`` names if ``event`` (on the block's stream) is seen done now: the legacy stream
        # (defer_cleanup's exit: the next fence, after blocking streams' work queued by then), or None (idle).  Not
        # done yet: idle once seen done after the next fence, which is recorded after now.  While a capture is known
        # to be under way, not asked (rule 13: ``cuEventQuery`` invalidates a global-mode capture): as not done.
        on = LEGACY
        if event is not None:  # seen done by the host: no stream waits for it
            if captures.underway or self._cu.cuEventQuery(event)[0] == NOT_READY:
                self.after_fence.add(_once_done(self._cu, self.unseen, [event], partial(publish, None)), block.size)
                return
            self._cu.cuEventDestroy(event)
            event, on = None, seen
        try:
            publish(on)
        except Exception as err:  # noqa: BLE001 - rule 8
            if retry and self.owner.retry(self._publish_after, block, event, publish, seen):  # rule 10
                return
            if self._synchronize_instead(block, LEGACY, err):
                self._publish_synchronized(block, publish)

    def release_held(self) -> None:
        """After a synchronize (reset): free every block a hold keeps, naming no stream."""
        for event, publish in self.held.drain():
            if event is not None:
                self._cu.cuEventDestroy(event)
            self._publish_synchronized(None, publish)

    def let_go_after(self, hold: SeenHold, stream: StreamRef, what: str) -> None:
        """Let ``hold`` go after the next fence, once the host sees ``stream``'s work so far done (an event on it,
        ``cuEventQuery``; the legacy stream's: the fence's).  No stream waits for it (Note [A named stream is not
        waited for] in :mod:`.device`).  Never raises (rule 8: synchronizes instead, warning of ``what``, the held
        block); during a capture, waits (rule 13), but on the legacy stream (no driver call) or one
        :func:`.captures.orders_beside` accepts: made now, in relaxed mode (Note [Released beside a capture])."""
        if captures.underway and captures.still_capturing(self._cu):
            if stream is not LEGACY and not captures.orders_beside(self._cu, stream):
                captures.defer(partial(self.let_go_after, hold, stream, what))
                return
            with relaxed(self._cu):
                self.owner.enter(self._let_go_after, hold, stream, what)  # rule 10
            return
        self.owner.enter(self._let_go_after, hold, stream, what)  # rule 10

    def _let_go_after(self, hold: SeenHold, stream: StreamRef, what: str, retry: bool) -> None:
        try:
            events = [] if stream is LEGACY else self._events_on([stream])  # the legacy stream's work: the fence's
        except Exception as err:  # noqa: BLE001 - rule 8
            if retry and self.owner.retry(self._let_go_after, hold, stream, what):  # rule 10
                return
            if self._after_the_capture(self._let_go_after, hold, stream, what):
                return
            if report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
                warn(f"could not order {what} after stream {stream.value:#x} ({err}); synchronized the device instead")
            hold.let_go()
            return
        self.after_fence.add(_once_done(self._cu, self.unseen, events, hold.let_go), hold.nbytes)

    def _after_the_capture(self, fn, *args) -> bool:
        """Rule 13 at rule 8's fallback: during a capture (a release made beside it, Note [Released beside a capture]
        in :mod:`.release`) a release that could not be ordered is held back, ``fn(*args, retry)`` run after the
        capture (True), never a synchronize, which would invalidate it; else False."""
        if not (captures.underway and captures.still_capturing(self._cu)):
            return False
        captures.defer(partial(self.owner.enter, fn, *args))
        return True

    def _wait_on_streams(self, recorded: list[StreamRef], stream: StreamRef) -> None:
        cu = self._cu
        for ref in recorded:
            if ref.belongs_to_another_thread():
                raise CannotOrder("a stream recorded for it is another thread's per-thread default stream")
            if ref.same_stream(stream):
                continue
            event = check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
            try:
                check(cu.cuEventRecord(event, ref.handle), "cuEventRecord (record_stream)")
                if stream is LEGACY:  # a legacy-stream block's streams are waited for by its fence (rule 4)
                    self.fence_waits.append(event)
                    event = None
                else:
                    check(cu.cuStreamWaitEvent(stream.handle, event, 0), "cuStreamWaitEvent (record_stream)")
            finally:
                if event is not None:
                    cu.cuEventDestroy(event)  # the driver keeps it until the wait is done

    def _synchronize_instead(self, block: Block, stream: StreamRef, err: Exception) -> bool:
        """Rule 8's fallback: True once synchronized (False: the context is gone)."""
        if not report_failure(self._cu.cuCtxSynchronize(), "cuCtxSynchronize"):
            return False
        warn(f"could not order the release of block {block.address:#x} on stream {stream.value:#x} ({err}); "
             "synchronized the device instead")
        return True

    @staticmethod
    def _publish_synchronized(block: Block | None, publish) -> None:
        try:
            publish(None)
        except Exception as err:  # noqa: BLE001 - rule 8
            which = f"block {block.address:#x}" if block is not None else "a block an IPC export kept"
            warn(f"could not release {which} after synchronizing: {err}")


def _after_the_next_fence(after_fence: AfterFence, publish, cu, unseen: list, events: list, nbytes: int,
                          on: StreamRef | None) -> None:
    # Note [The legacy stream recorded]: idle once the next fence completes (and ``events`` are seen done).
    after_fence.add(_once_done(cu, unseen, events, partial(publish, None)), nbytes)


def _once_done(cu, unseen: list, events: list, release):
    """``release``, or with ``events`` to see done first: what ``after_fence`` runs."""
    return partial(_once_seen_done, cu, unseen, events, release) if events else release


def _once_seen_done(cu, unseen: list, events: list, release) -> None:
    # Run after a fence: ``release()`` once the host sees ``events`` done, else into ``unseen``, run after a later
    # fence (Note [A named stream is not waited for] in .device).  An error other than "not ready" counts as done.
    while events:
        if cu.cuEventQuery(events[-1])[0] == NOT_READY:
            unseen.append(partial(_once_seen_done, cu, unseen, events, release))
            return
        cu.cuEventDestroy(events.pop())
    release()


def _no_settle(stream: StreamRef) -> None:
    pass


def _after_synchronize(block: Block, publish, on: StreamRef | None) -> None:
    StreamWaits._publish_synchronized(block, publish)  # ordering fell back to a synchronize: no stream to name
