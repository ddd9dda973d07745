"""The release gate: every block's release (mempool, arena, graph, pinned, managed) makes the same checks, in one
order, here; a block source supplies only its fast action's parts and its ordered release, and :func:`gate` makes
the ``release(block)`` its blocks carry.  Rules, tests and the later-queues (:class:`Pending`, :class:`~.held.Held`):
docs/architecture.md, "A release".  Numbered as in the code:

1. **Capture hold-back** (rule 13): while a known capture is under way, the release waits for its end
   (:func:`.captures.defer`), but for one the source makes beside it (Note [Released beside a capture]); a graph
   block in its own capture is freed there, a free node.
2. **Reset generation** (rule 12): the block's ``ledger`` popped (a reset empties or swaps it), else the
   source's ``dropped``; a host cache's orphan (left by a reset to its release) is freed here.
3. **Usage event**: the free's ``~bytes`` (:mod:`.usage`).
4. **Holds, recorded streams and defer_cleanup** (rules 2, 8a): a block with ``waits``, an open
   ``defer_cleanup``, another thread's per-thread default stream, or a source with no fast action takes the
   ordered release (:meth:`~.waits.StreamWaits.release`; a host cache's records events, rule 9).
5. **The fast action**: the block is :data:`~.block.AWAITING_FREE` (marked by the ordered release when it
   orders, or when made free if ``defer_cleanup`` holds it); a legacy-stream block goes to the source's
   :class:`Pending` list (rule 4: the next allocation fences it); another stream's is kept idle for it (rule 7a)
   or freed on it (``cuMemFreeAsync``, rule 7), a graph block's by ``free(block)`` (its gate's deferral is never
   entered).
6. **The owner's context** (rule 10): a free failing for want of a current context runs ordered in the owner's.

Note [Released beside a capture]
    A release held back past a capture's end names its stream then, and the program may have destroyed that stream
    meanwhile (legal once its arrays are dropped; a cuda.core ``Stream.close()``, a PyTorch stream's handle): the
    free would go to a destroyed handle, or to the new stream the driver gave it, unordered after the old one's work.
    So a mempool or an arena block of a created stream S (blocking or not) not itself captured, waiting for no other
    stream or only for ``record_stream`` streams of that kind, is released at the drop as outside a capture (freed on
    S, kept idle for it, or, an arena block or one held by a hold, an event recorded on S now; with recorded streams,
    events on them and on S now, the block made free after the next fence once the host sees them done, Note [A
    named stream is not waited for] in :mod:`.device`), the thread in relaxed capture mode
    (``cuThreadExchangeStreamCaptureMode``): the driver allows stream-ordered frees, event records and waits on
    uncaptured streams there, blocking ones too, under a global-mode capture of a blocking stream too
    (docs/perf-notes.md, "Stream capture: what the driver allows"); a hold let go after S's work
    (:meth:`.waits.StreamWaits.let_go_after`) likewise.  Other releases still wait (:func:`.captures.released_beside`
    says which) and name their streams after the capture (a known gap: the program must keep those streams alive
    until then): the captured stream's own, a per-thread default stream's, one waiting for a ``record_stream``
    stream that is one of those or the legacy stream, one dropped in a thread with no current context (the capture
    query fails there); and the legacy stream's own blocks (no harm: that stream is never destroyed).  Work beside
    the capture failing for another reason than a missing context (S began capturing meanwhile, an event not made)
    is held back, ordered after the capture: it names its streams then, the gap above.

Note [The gate is a closure]
    The release is the pointer finalizer's one call, on the hot path of every drop.  So the gate is a closure
    made once per source: what it reads is in its cells, and its fast actions are C calls (``list.append``,
    the driver's ``cuMemFreeAsync``) made inline, not a second Python frame (its cost: docs/perf-notes.md)."""

from __future__ import annotations

import threading
from functools import partial
from typing import Callable

from ..cuda.capture import capture_id, relaxed
from ..cuda.driver import report_failure
from ..cuda.streams import LEGACY
from .block import AWAITING_FREE, Block
from .captures import defer, still_capturing, underway


class Pending(list):
    """Legacy-stream blocks released since the last fence, in release order: appended without a lock, taken by an
    allocation (rule 4); ``nbytes``, their bytes, is added without a lock (a lost update only delays a fence)."""

    __slots__ = ("nbytes", "_lock", "_takes")

    def __init__(self):
        super().__init__()
        self.nbytes = 0
        self._lock = threading.RLock()  # held by takers only: releases append without it
        self._takes = 0  # takes begun: one that changes under a take was a finalizer's, nested

    def add(self, blocks: list) -> None:  # the slow paths; the gate appends inline
        self.extend(blocks)
        self.nbytes += sum(block.size for block in blocks)

    def take(self) -> list:
        """Every block pending now, in release order: a slice under the takers' (reentrant) lock.  A finalizer
        the collector runs inside it may take too: the outer take sees ``_takes`` changed and looks again."""
        with self._lock:
            self._takes += 1
            while True:
                begun = self._takes
                count = len(self)
                taken = self[:count]  # an allocation: the collector may run a finalizer that takes
                if self._takes == begun:
                    del self[:count]
                    break
            self.nbytes = 0
        return taken


def gate(source, cu, *, deferral, owner, ordered: Callable[[Block], None],
         pending: Pending | None = None, free_async: Callable | None = None,
         keep: Callable[[Block], bool] | None = None, free: Callable[[Block], object] | None = None,
         ledger: bool = False, orphaned: Callable[[Block], bool] | None = None,
         on_dropped: Callable[[], None] | None = None, note: Callable[[int], None] | None = None,
         graph: bool = False, beside: Callable[[Block], bool] | None = None) -> Callable[[Block], None]:
    """``release(block)`` for the blocks of ``source`` (its ``dropped`` is rule 12's mark). ``cu``: the driver
    object (:mod:`numba_pool.cuda.driver`); ``deferral``: ``defer_cleanup``'s :class:`~.waits.Deferral`; ``owner``:
    the :class:`~numba_pool.cuda.context.OwnerContext` (rule 10); ``ordered(block)``: the ordered release, never
    raising (:meth:`~.waits.StreamWaits.release`). The legacy stream's blocks go to ``pending``, the other streams'
    to ``keep`` (kept idle for the stream, rule 7a) or ``free_async`` (``cuMemFreeAsync``), each None: ordered; or
    ``free(block)`` (off the hot paths; returns an error or None). ``ledger``: rule 12 by the block's ``ledger``
    (popped), else by ``source.dropped``; ``orphaned``: after the ledger pop, True when it freed a host cache's
    orphan (left by a reset to it); ``on_dropped``: run when a pending append finds the source dropped (the reset
    may have taken the rest); ``note``: the usage tracker's event sink (``~bytes`` per release; None: not counted);
    ``graph``: graph blocks (:class:`~.graph_blocks.GraphBlocks`), freed in their own capture; ``beside(block)``:
    whether a release during a capture is made at once, in relaxed capture mode (Note [Released beside a capture])."""
    append = pending.append if pending is not None else None

    def release(block: Block, in_relaxed_mode: bool = False) -> None:
        # Any thread, from a finalizer, no lock, never raises; once per block.
        if underway and not in_relaxed_mode:  # 1. rule 13
            if graph and capture_id(cu, block.stream.handle) == block.capture:
                free_in_capture(block)
                return
            if still_capturing(cu):
                if beside is not None and beside(block):
                    with relaxed(cu):
                        release(block, True)
                    return
                defer(partial(release, block))
                return
        if ledger:  # 2. rule 12
            popped = block.ledger.pop(block.ptr, None)
            if orphaned is not None and orphaned(block):
                return
            if popped is None:
                return
        elif source.dropped:
            return
        size = block.size
        if note is not None:  # 3.
            note(~size)
        stream = block.stream
        if deferral.depth or block.waits is not None or stream.thread is not None:  # 4. rules 2 and 8a
            ordered(block)
            return
        block.state = AWAITING_FREE  # 5.
        if stream is LEGACY and append is not None:
            append(block)
            pending.nbytes += size
            if on_dropped is not None and source.dropped:
                on_dropped()
            return
        if keep is not None and not source.dropped and keep(block):  # kept idle for its stream (rule 7a)
            if on_dropped is not None and source.dropped:
                on_dropped()
            return
        if free_async is not None:
            err, = free_async(block.ptr, stream.handle)  # the stream's handle names it in any context
        elif free is not None:
            err = free(block)
        else:
            ordered(block)
            return
        if err:  # 6. rule 10
            if in_relaxed_mode and not owner.needed():  # S began capturing meanwhile: held back (rule 13), ordered
                defer(partial(ordered, block))
                return
            in_owner_context(owner, ordered, err, block)

    def free_in_capture(block: Block) -> None:
        if block.ledger.pop(block.ptr, None) is not None:
            report_failure(cu.cuMemFreeAsync(block.ptr, block.stream.handle),
                           f"cuMemFreeAsync({block.address:#x}) in a capture")

    return release


def in_owner_context(owner, ordered: Callable[[Block], None], err, block: Block) -> None:
    """Rule 10: a free on the stream's own handle fails where no context is current; the
    owner's context then runs the ordered release (nothing was freed yet)."""
    if owner.needed():
        owner.run(ordered, block)
        return
    report_failure((err,), f"cuMemFreeAsync({block.address:#x})")
