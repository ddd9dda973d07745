"""One record per block: :class:`Block`, what the allocator knows of one block it handed out.

The core's contract (RMM's ``device_memory_resource`` and cuda.core's ``MemoryResource`` shape)
is stream-ordered and knows no frontend: a block source, and the device allocator over them,
offer ``allocate(nbytes, stream) -> Block`` and ``deallocate(block, stream)``
(:meth:`numba_pool.allocator.device.DeviceAllocator.allocate`).  A *door* turns a block into
its frontend's object: the Numba EMM plugin's door is the pointer class the sources are given
(:class:`numba_pool.cuda.pointers.PoolPointer`), which holds the block and, at its finalizer,
calls ``block.release(block)``: the deallocation on the block's allocation stream (the stream
rule, :mod:`numba_pool.allocator`).

Note [A Block replaces the release's partial]
    Before, each allocation made a ``functools.partial`` (the pointer's release) holding the
    source's release method and the block's fields.  A :class:`Block` takes its place: it is
    made with ``Block()`` and its fields set by the source that knows them (no Python
    ``__init__`` frame), and its ``release`` is the source's release gate (:mod:`.release`, a
    closure made once per source), which the pointer calls with the block.  So the record costs
    what the partial cost and the release calls one function where it called a partial calling one.  ``Block()`` (no ``__init__``
    defined: the type's own C ``tp_new``) is cheaper than ``object.__new__(Block)``, whose
    wrapper builds an argument tuple.
"""

from __future__ import annotations

from ..cuda.streams import LEGACY

#: A block's states (:attr:`Block.state`), named as a snapshot names them.
ALLOCATED, AWAITING_FREE, FREE = "allocated", "awaiting_free", "free"


class Block:
    """One block handed out by a block source, until its release.

    Set by every source at the allocation (the fields a release reads):

    * ``ptr``: the device address (``CUdeviceptr``; :attr:`address` is its int); a host
      cache's block (pinned, managed) its address as an int;
    * ``size``: bytes requested;
    * ``stream``: the allocation stream (:class:`~numba_pool.cuda.streams.StreamRef`), on
      which the release is ordered;
    * ``release``: ``release(block)``, the source's deallocation of it (never raises; runs once);
    * ``waits``: what its release waits for besides its stream (rule 2): the streams given to
      ``record_stream`` (:class:`~numba_pool.cuda.streams.StreamRef`) and the *holds*
      (:class:`~numba_pool.allocator.waits.Hold`, IPC exports), or None;
    * ``state``: :data:`ALLOCATED` while its owner has it, :data:`AWAITING_FREE` from its
      release (the gate, :mod:`.release`) until it can be reused, :data:`FREE` in a cache
      (the arena's ready blocks): a snapshot's block states.

    Set by the sources that need them: ``start`` (the address as an int, the arena's key),
    ``rounded`` (bytes the arena carved), ``domain`` (the arena domain of a scoped block),
    ``ledger`` (its reset generation: the table of live blocks its release pops, the mempool
    blocks' generation's, a host cache's, the graph blocks'; a reset swaps or empties it, so a
    late release finds nothing; the arena's generation is the source's ``dropped``), ``capture`` (the id of the stream capture whose graph allocated it, rule
    13), ``ref`` (the source's own record: a host cache's :class:`HostBlock
    <numba_pool.allocator.host_blocks.HostBlock>`, a scratch block).  A field not set raises
    ``AttributeError`` when read: each source reads only its own.
    """

    __slots__ = ("ptr", "size", "stream", "release", "waits", "state",
                 "start", "rounded", "domain", "ledger", "capture", "ref")

    @property
    def address(self) -> int:
        """The device address (bytes)."""
        return int(self.ptr)

    def free(self) -> None:
        """Give the block back on its allocation stream (``release(block)``, as
        :meth:`DeviceAllocator.deallocate <numba_pool.allocator.device.DeviceAllocator.deallocate>`
        with no other stream); once, by whoever owns it."""
        self.release(self)

    def __repr__(self) -> str:
        return f"Block({self.address:#x}, {self.size} bytes, stream {self.stream.value:#x})"


class LegacyBlock(Block):
    """A block whose allocation stream is the legacy stream: ``stream`` is a class-level
    default, one store fewer on the arena's hot path (Note [A Block replaces the release's
    partial]).  Its ``stream`` cannot be set."""

    __slots__ = ()
    stream = LEGACY


def make_block(ptr, size: int, stream, release) -> Block:
    """A :class:`Block` with the fields every source sets (off the hot paths), allocated."""
    block = Block()
    block.ptr, block.size, block.stream, block.release = ptr, size, stream, release
    block.waits, block.state = None, ALLOCATED
    return block


def add_wait(block: Block, what) -> None:
    """Make ``block``'s release wait for ``what`` (a stream, or a hold); the caller holds the
    lock its source names for registrations (two at once must not lose one)."""
    waits = block.waits
    if waits is None:
        block.waits = [what]
    else:
        waits.append(what)


def take_waits(block: Block) -> list:
    """``block``'s waits, taken (its release reads them once)."""
    waits, block.waits = block.waits, None
    return waits or []
