""":class:`Block`, one per block handed out.  The core's contract (RMM's ``device_memory_resource``, cuda.core's
``MemoryResource``) is stream-ordered and knows no frontend: ``allocate(nbytes, stream) -> Block`` and
``deallocate(block, stream)`` (:meth:`.device.DeviceAllocator.allocate`).  A *door* wraps a block in its frontend's
object: the EMM plugin's :class:`numba_pool.cuda.pointers.PoolPointer`, whose finalizer calls ``block.release(block)``.

Note [A Block replaces the release's partial]
    A :class:`Block` is made with ``Block()`` (the type's C ``tp_new``: no ``__init__`` frame, no argument tuple)
    and its fields set by the source; its ``release`` is the source's gate (:mod:`.release`), a closure made once,
    so the record costs what a per-allocation ``functools.partial`` cost (docs/perf-notes.md)."""

from __future__ import annotations

from ..cuda.streams import LEGACY

ALLOCATED, AWAITING_FREE, FREE = "allocated", "awaiting_free", "free"  #: :attr:`Block.state` values: snapshot names.


class Block:
    """One block a source handed out, until its release.  Set by every source at the allocation (what a release reads):

    * ``ptr``: the device address (``CUdeviceptr``); a host cache's block: its int address;
    * ``start``: the address as an int (:attr:`address`; the doors' tables' key: no ``int()`` per allocation);
    * ``size``: bytes requested;
    * ``stream``: the allocation stream (:class:`~numba_pool.cuda.streams.StreamRef`), which orders the release;
    * ``release``: ``release(block)``, the source's deallocation of it (never raises; runs once);
    * ``waits``: what its release waits for besides its stream (rule 2), or None: the ``record_stream`` streams and
      the holds (:class:`~numba_pool.allocator.waits.Hold`);
    * ``state``: :data:`ALLOCATED`, then :data:`AWAITING_FREE` from its release (the gate) until reusable,
      :data:`FREE` in the arena's ready cache.

    Set by the sources that need them (unset: ``AttributeError``): ``rounded`` (bytes
    carved), ``domain`` (a scoped arena block's), ``ledger`` (its reset generation: the live table its release pops,
    which a reset swaps or empties; the arena's generation is its ``dropped``), ``capture`` (whose graph allocated it,
    rule 13), ``ref`` (the source's record: a :class:`~numba_pool.allocator.host_blocks.HostBlock`, a scratch block)."""

    __slots__ = ("ptr", "size", "stream", "release", "waits", "state",
                 "start", "rounded", "domain", "ledger", "capture", "ref")

    @property
    def address(self) -> int:
        """The device address (an int)."""
        return self.start

    def free(self) -> None:
        """Give the block back on its allocation stream, once, by whoever owns it: ``release(block)``, as
        :meth:`~numba_pool.allocator.device.DeviceAllocator.deallocate` with no other stream."""
        self.release(self)

    def __repr__(self) -> str:
        return f"Block({self.address:#x}, {self.size} bytes, stream {self.stream.value:#x})"


class LegacyBlock(Block):
    """A block whose allocation stream is the legacy stream: ``stream`` is a class-level default, one store fewer
    on the arena's hot path (Note [A Block replaces the release's partial]).  Its ``stream`` cannot be set."""

    __slots__ = ()
    stream = LEGACY


def make_block(ptr, size: int, stream, release) -> Block:
    """A :class:`Block` with the fields every source sets (off the hot paths), allocated."""
    block = Block()
    block.ptr, block.start, block.size, block.stream, block.release = ptr, int(ptr), size, stream, release
    block.waits, block.state = None, ALLOCATED
    return block


def add_wait(block: Block, what) -> None:
    """Make ``block``'s release wait for ``what`` (a stream, or a hold), under the caller's lock."""
    waits = block.waits
    if waits is None:
        block.waits = [what]
    else:
        waits.append(what)


def take_waits(block: Block) -> list:
    """``block``'s waits, taken (its release reads them once)."""
    waits, block.waits = block.waits, None
    return waits or []
