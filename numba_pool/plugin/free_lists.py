"""The doors' free lists, in C (:class:`numba_pool.cuda._native.DoorCallbacks`): what a door that has one (PyTorch's
callbacks, the cuda.core :class:`~.resource.MemoryResource`, the CuPy allocator) shares, and the manager's
:class:`DoorFreeLists`, which gives their blocks back.

Note [The doors' free lists]
    PyTorch's caching allocator and CuPy's ``MemoryPool`` give a block freed on a stream to the next request of its
    size on that stream, in C; cuda.core's ``DeviceMemoryResource`` leaves that to the driver's pool.  Through
    Python each allocation would cost 2-3 µs more (docs/perf-notes.md, "The PyTorch door's free list", "The doors'
    free lists"), so a door's calls go through its compiled callbacks (``DoorCallbacks``), which do the same without
    Python for the legacy stream (PyTorch's and CuPy's null stream, handles 0 and ``CU_STREAM_LEGACY``; cuda.core's
    ``LEGACY_DEFAULT_STREAM``) and, for PyTorch and cuda.core, for a non-blocking stream of the program's:
    - A block is *live* there when the door made it with nothing recorded (no history, no log) on the legacy stream,
      or, a mempool block (rule 7), on a non-blocking stream S not capturing (``cuStreamGetFlags``,
      ``cuStreamIsCapturing``), keyed by S's driver id (``cuStreamGetId``, unique for the process's life; rule 6),
      never by its handle.  (An arena block of S is its domain's, which serves S at once, rule 3: its domain event
      is recorded on S only, rule 5, which a give-back that never names S could not keep.)  Its free naming its
      allocation stream (for cuda.core also no stream, for a legacy-stream buffer) keeps it, by (device, size,
      stream), at most 8 per size and stream and ``MAX_CACHED_BYTES`` (64 MiB) per device and door, half of it at
      most for streams other than the legacy one (a destroyed stream's blocks, reused by no one until a give-back,
      never crowd the legacy stream's out; the keys of empty stacks go when the key table fills); the next
      allocation of that size on that stream takes it.  For S, the free's and the allocation's handles are asked
      their id and whether they capture (capture first: an id query invalidates a capture): a destroyed S's handle
      given to a new stream has another id, and a capturing S neither keeps nor takes (rule 13's graph memory).
      The previous owner's work was queued on the stream before the free, and the new owner's comes after: that
      stream's order is the release's, as in the library's own pool and rule 7a; no stream waits, no alloc or free
      call is made.  Only a non-blocking S: a free on a blocking one waits for the legacy stream's earlier work,
      which keeping would not (Note [Idle blocks of a stream]).  Its uses on other streams, blocking ones too, are
      the program's to order before the free or to record, as the library's own pool requires (rule 14; rule 4's
      fence, which covers blocking streams for Numba's arrays, is not taken).  The block stays allocated in the
      pool meanwhile, like PyTorch's reserved bytes.
    - Anything else reaches Python: graph memory (an allocation in a capturing thread, the legacy stream's too, is
      an allocation node, rule 13), a blocking stream's blocks, a per-thread default stream's (it may be captured),
      CuPy's streams', a free naming another stream, a block a wait was added to since (``record_stream``, an IPC
      hold: the allocator's ``on_wait`` takes it out of the live blocks first; on a kept block, whose owner freed it,
      it releases it and the wait is refused, as on any freed memory), a block freed while a ``defer_cleanup`` block
      of its manager is open (held back to the outermost exit, rule 8a), and every block while a history records
      (:meth:`ProcessState.set_recording` switches the doors off before it starts, giving the kept ones back).
    - What is kept for the legacy stream goes back through the door's ``_free`` (rule 14, as if its owner freed it
      then) before every figure (``stats()``, ``memory_summary()``, ``get_memory_info()``, ``reset_peak()``). Every
      kept block goes back before a trim, a snapshot and an out-of-memory retry, when a history starts, and when the
      door is collected; those kept for a stream S after a synchronize, never naming S (Note [A kept block whose
      stream is gone]; during a capture, after it, counted as freed meanwhile). A reset, in every door and in one C
      step at its start and again at its end, gives the device's kept blocks back, forgets its live ones (their late
      frees reach the door's table, Note [An address a reset gave again]) and moves the device's generation on; in
      between nothing is kept, taken or entered for the device. So no block of the generation it drops (another
      thread's ``_malloc`` it overtook, read the generation before) is kept. A device served by another manager
      forgets the first one's blocks, kept and live, the same way.
    - Blocks are taken off the tables into a C array before any Python object is made (a collection may run an
      owner's free), and released after; a release that raises stops none of the others.  No Python runs between
      a reuse's checks and its return (the usage trackers' periodic drain, and the CUDA model's stream queries, come
      before them; a give's queries run before the tables change, and its entry is found again after them).  Every
      entry and kept block of a device counts in its manager's tracker: a new manager's is set before the device's
      blocks are cleared, a block is entered only while its manager's tracker is the device's, and the door joins
      the manager's free lists before it enters one (a ``record_stream`` finds it).
    - The statistics count every allocation: a reuse appends the previous owner's free and its allocation to the
      manager's usage events.  A kept block counts as in use in the events until it is reused or given back; the
      figures give the legacy stream's back first and count those kept for a stream as freed
      (:meth:`DoorFreeLists.kept_on_streams`), so a peak may include kept bytes, at most the bound above.
    - The tables are C arrays guarded by the GIL: every call holds it, and none of their C code calls Python while
      a table is half changed."""

from __future__ import annotations

import weakref
from functools import partial

from ..allocator import captures
from ..cuda.driver import GONE, report_failure, warn
from ..cuda.streams import LEGACY, StreamRef
from .state import process


class KeepsFreedBlocks:
    """A door with a compiled free list (Note [The doors' free lists]): ``native``, its
    :class:`~numba_pool.cuda._native.DoorCallbacks` (None: no compiled module), whose Python ends are the door's
    ``_malloc(size, device, stream)`` (an address) and ``_free(address, size, device, stream)``."""

    native = None

    def _keep_freed_blocks(self, free_list: bool = True) -> None:
        # Made at the door's __init__: the compiled callbacks over its Python ends (a weak reference), counted
        # among the process's doors (switched off there while a history records).
        try:
            from ..cuda._native import DoorCallbacks
        except ImportError:
            return
        self.native = DoorCallbacks(free_list=free_list, owner=self)
        self._gone_later = {}  # address -> (bytes, UsageTracker, device, Block): off the list, unreleased (_free_gone)
        process.add_free_list_door(self)

    def __del__(self):
        # A door collected gives its kept blocks back: its managers may not (the releases never raise, rule 8)
        native = getattr(self, "native", None)
        if native is not None:
            native.drain(free=self._free, gone=self._free_gone)

    def _free_gone(self, blocks: list) -> None:
        """Note [A kept block whose stream is gone]
            A block kept for a stream S (its owner freed it there, Note [The doors' free lists]) is reused only by an
            allocation naming S, whose id the driver gives for S's handle while S lives. Given back, it never names S:
            S may have been destroyed since (a cuda.core ``Stream.close()``, legal once its buffers are closed), its
            last work perhaps still running and its handle perhaps a new stream's (the driver gives handles again),
            and a call on a destroyed stream's handle is an error. So the blocks ``[(address, size, device,
            UsageTracker)]`` are given back after a synchronize of their owner's context (once for all; as rule 7a's
            idle blocks of a dropped stream wait for a trim's synchronize), each released on the allocator's private
            stream (no legacy-stream operation): no earlier work remains. Only trims, out-of-memory retries, resets,
            snapshots, a history's start and a door's collection give them back. From the moment they leave the free
            list until their release they are in ``_gone_later``, which the figures count as freed (as they count the
            kept ones): during the synchronize, which another thread's figures may overtake; during a capture
            numba_pool knows of, after which they go (rule 13: a synchronize would invalidate it); and where the
            synchronize failed (a capture numba_pool does not know of), until a later give-back's succeeds. Each goes
            back once, by whoever claims its record first (one dict operation); one acting on a stale record leaves
            the address's next owner alone. A release that raises stops none of the others (the first error is raised
            last); none raises otherwise (rule 8)."""
        later, records = self._gone_later, []
        for address, size, device, usage in blocks:
            held = self._blocks.get(address)
            if held is not None:  # (a fresh tuple: its identity claims the release, _claim)
                record = later[address] = (size, usage, device, held[0])
                records.append((address, record))
        self._release_gone(records)

    def _release_gone(self, records: list) -> None:
        # ``[(address, record)]`` of ``_gone_later``: each released once, by whoever claims its record first, after a
        # synchronize; a block released meanwhile (its address perhaps another owner's now) is left alone.
        synchronized, failed, first = set(), set(), None
        for address, record in records:
            held = self._blocks.get(address)
            if held is None or held[0] is not record[3]:
                self._claim(address, record)  # (gone from the table: nothing to release)
                continue
            source = held[1]
            if captures.underway and captures.still_capturing(source.cu):  # asked for each block: one may begin
                captures.defer(partial(self._release_gone, [(address, record)]))
                continue
            if source not in synchronized and source not in failed:
                (synchronized if _synchronize(source) else failed).add(source)
            if source in failed or not self._claim(address, record):  # (failed: a later give-back tries again)
                continue
            try:
                self._release_synchronized(record[3], source, address, record[0], record[2])
            except BaseException as error:  # noqa: BLE001 - the others released all the same; raised last
                first = first or error
        if first is not None:
            raise first

    def _claim(self, address: int, record: tuple) -> bool:
        # Take ``record`` out of ``_gone_later`` if it is still there (one dict operation): True for one caller only
        got = self._gone_later.pop(address, None)
        if got is record:
            return True
        if got is not None:  # another block's, at an address given again: put back
            self._gone_later.setdefault(address, got)
        return False

    def _release_synchronized(self, block, source, address: int, size: int, device: int) -> None:
        # A mempool block (the only kind kept for a stream: no domain event to record on S, Note [The doors' free
        # lists]), its earlier work done: freed on the allocator's own stream (no legacy-stream operation).
        done = StreamRef(source.private_streams[1].handle)
        done.idle_key = False  # kept idle for no stream
        block.stream = done
        self._free(address, size, device, done.value)  # (its own stream: no wait)

    def _retry_gone(self) -> None:
        # The blocks whose give-back found the synchronize failing (not those a capture holds back: they are after it)
        if self._gone_later and not captures.underway:
            self._release_gone(list(self._gone_later.items()))

    def kept_on_streams(self, usage) -> tuple[int, int]:
        """``(blocks, bytes)`` kept for streams other than the legacy one, or taken off and not yet released
        (``_gone_later``), counting in ``usage`` (a ``UsageTracker``): freed as far as its figures go."""
        if self.native is None:
            return 0, 0
        blocks, nbytes = self.native.kept_on_streams(usage)
        for size, tracker, _, _ in list(self._gone_later.values()):
            if tracker is usage:
                blocks, nbytes = blocks + 1, nbytes + size
        return blocks, nbytes

    def give_back(self, device: int = -1, usage=None, streams: bool = True) -> int:
        """Release the blocks the free list keeps for ``device`` (-1: every device; with ``usage``, a device whose
        blocks count in that ``UsageTracker``; without ``streams``, the legacy stream's only), as PyTorch's
        ``empty_cache``; returns how many."""
        if self.native is None:
            return 0
        if streams:
            self._retry_gone()
        return self.native.drain(device, usage, streams=streams)

    def forget(self, address: int) -> bool:
        """The block at ``address`` (its start) must not be kept when freed: it waits for another stream or a hold
        (``record_stream``, an IPC export).  True when it was kept (its owner freed it): released now."""
        return self.native is not None and self.native.forget(address)

    def forget_device(self, device: int, pause: int = 0) -> None:
        """A reset of ``device`` (``pause`` 1 at its start, -1 at its end): what is kept there goes back, the live
        blocks' frees reach the door's table (Note [An address a reset gave again]), nothing is kept meanwhile."""
        if self.native is not None:
            self.native.forget_device(device, pause)


def may_keep(entry: tuple, on_a_stream: bool) -> bool:
    """Whether a door's table entry ``(block, its allocator, record)`` may be kept by its free list (the allocator's
    ``door_may_keep``; None, a reset's, may not)."""
    allocator = entry[1]
    return allocator is not None and allocator.door_may_keep(entry[0], on_a_stream)


def _synchronize(allocator) -> bool:
    # ``cuCtxSynchronize`` in the allocator's owner context (a give-back may run in any thread): whether the blocks
    # may go back (done; or the context is gone, and its memory with it).  A failure is warned of.
    try:
        result = allocator.waits.owner.call(allocator.cu.cuCtxSynchronize)
    except Exception as err:  # noqa: BLE001 - the owner's context could not be pushed: not synchronized
        warn(f"cuCtxSynchronize (blocks kept for a stream given back): {err}")
        return False
    return report_failure(result, "cuCtxSynchronize (blocks kept for a stream given back)") or result[0] in GONE


class DoorFreeLists:
    """The doors whose free lists may keep one manager's blocks (Note [The doors' free lists]), which
    its figures, trims, resets and out-of-memory retries give back from: a weak set (a door collected gives its own
    back).  The manager's and its allocator's (``on_wait``), neither holding the other."""

    __slots__ = ("_doors", "_usage")

    def __init__(self, usage):
        self._doors = weakref.WeakSet()
        self._usage = usage  # the manager's UsageTracker: a door's blocks counting in it are the manager's

    def add(self, door: KeepsFreedBlocks) -> None:
        """``door`` keeps this manager's blocks from now on (called at each live block: the test is cheap)."""
        if door not in self._doors:
            self._doors.add(door)

    def give_back(self, streams: bool = True) -> None:
        """Release every block the doors keep for this manager (without ``streams``, the legacy stream's only: the
        figures', which count the others as freed, :meth:`kept_on_streams`)."""
        if self._doors:
            for door in list(self._doors):
                door.give_back(-1, self._usage, streams)

    def kept_on_streams(self) -> tuple[int, int]:
        """``(blocks, bytes)`` the doors keep for this manager on streams other than the legacy one."""
        blocks = nbytes = 0
        if self._doors:
            for door in list(self._doors):
                more, more_bytes = door.kept_on_streams(self._usage)
                blocks, nbytes = blocks + more, nbytes + more_bytes
        return blocks, nbytes

    def forget(self, address: int) -> bool:
        """The allocator's ``on_wait``: the block starting at ``address`` waits for another stream or a hold from
        now on, so no door may keep it.  True when a door kept it (its owner freed it): released now."""
        released = False
        if self._doors:
            for door in list(self._doors):
                released = door.forget(address) or released
        return released
