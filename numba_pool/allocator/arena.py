"""The arena: blocks carved from slabs, one domain per stream (rules 1, 3-6 of :mod:`numba_pool.allocator`).

* Up to ``max_block`` bytes, rounded to 256 B, from the stream's domain (:mod:`.domains`); larger and
  ``numba_pool.scratch`` requests go to :attr:`ArenaBlocks.delegate`.
* Legacy hot path: a lock-free ``list.pop`` off the ready cache (Note [A ready block is its Block]); a miss locks,
  collects fenced batches (rule 4: :mod:`.quarantine`, :mod:`.fences`), fences if due, carves best fit or adds a slab.
* A legacy release is one ``list.append`` (the release gate's pending, :mod:`.release`); another stream's
  records the domain's event and queues the block for the next allocation (rules 3 and 5).
* A wholly free slab goes back over the release threshold, or when its domain has another.
* Threads: releases take no lock; everything else runs under ``_lock``.

Note [A ready block is its Block]
    A carved block's :class:`~.block.Block` stays in :attr:`ArenaBlocks.taken` until back in a heap, reused from the
    ready cache: no ``Block()`` or ``CUdeviceptr`` per allocation; the address table costs the hot path nothing."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Callable

from ..cuda.capture import is_capturing
from ..cuda.driver import OUT_OF_MEMORY, check
from ..cuda.errors import CudaAPIError
from ..cuda.pointers import PoolPointer
from ..cuda.streams import LEGACY, StreamRef
from .block import ALLOCATED, Block, LegacyBlock
from .doors import ArenaDoor
from .captures import released_beside, underway
from .domains import Domain, Domains
from .fences import PrivateStream
from .free_list import ALIGNMENT, ArenaError, round_up
from .quarantine import Quarantine
from .release import gate
from .sources import BlockSource
from .waits import StreamWaits

QUARANTINE_BLOCKS = 256  #: Quarantine at most this many blocks before a fence, whatever their bytes.
REFILL_AT = 32  #: A legacy ready-cache miss fences (refilling it) once this many blocks are quarantined.
CACHE_BLOCKS = 64  #: Ready blocks kept per size in the cache in front of the legacy domain.


@dataclass(frozen=True)
class ArenaStatistics:
    """An arena's bytes, counts (all domains): in_use + cached + quarantined + free == reserved; ``fences`` so far."""

    reserved: int
    in_use: int
    cached: int
    quarantined: int
    free: int
    free_blocks: int
    largest_free_block: int
    slabs: int
    domains: int
    fences: int


class ArenaBlocks(ArenaDoor, BlockSource):
    """Blocks of up to ``max_block`` bytes in mempool slabs of ``slab_size`` bytes at most.  ``release_threshold``: slab
    bytes kept (None: all); ``delegate``/``delegate_block`` serve the rest; ``return_stream`` returns non-legacy slabs.
    :raises ArenaError: for sizes not multiples of 256, or ``max_block`` > ``slab_size``."""

    def __init__(self, cu, pool_handle, context, waits: StreamWaits, usage, on_out_of_memory, *,
                 slab_size: int, max_block: int, release_threshold: int | None = None,
                 delegate: Callable[[int], PoolPointer] | None = None,
                 delegate_block: Callable[[int, StreamRef, bool], Block] | None = None, after_reset: Callable | None = None,
                 pointer: type, return_stream: PrivateStream | None = None, **shared):
        if slab_size % ALIGNMENT or max_block % ALIGNMENT or not 0 < max_block <= slab_size:
            raise ArenaError(f"slab size ({slab_size}) and largest block ({max_block}) must be multiples of "
                             f"{ALIGNMENT} bytes with 0 < largest block <= slab size")
        super().__init__(cu, pool_handle, context, waits, usage, on_out_of_memory, after_reset, pointer=pointer,
                         **shared)
        self._device_pointer = cu.CUdeviceptr
        self.max_block = max_block
        self.delegate = delegate if delegate is not None else partial(_not_served, max_block)
        #: The core's delegate, ``(size, stream, not_capturing) -> Block``: the mempool blocks' ``allocate_block``.
        self.delegate_block = delegate_block if delegate_block is not None else partial(_not_served_block, max_block)
        self.quarantine_limit = QUARANTINE_BLOCKS  # tests set -1: fence before every miss
        self._lock = threading.Lock()
        self.taken: dict[int, Block] = {}  # out of the heaps: start -> Block (Note [A ready block is its Block]); _lock
        self._domains = Domains(cu, pool_handle, slab_size=slab_size, release_threshold=release_threshold,
                                alloc_stream=self.alloc_stream,
                                return_stream=return_stream or PrivateStream(cu, "arena slab returns"))
        self._legacy = self._domains.legacy
        self.quarantine = Quarantine(CACHE_BLOCKS, self.fences)  # its cache_limit: ready blocks kept per size
        self.ready = self.quarantine.ready  # popped by the hot path without the lock
        self.pending = self.quarantine.waiting  # appended to by the release gate
        self._released: deque = deque()  # blocks released on other streams, to publish
        self._release_bound = gate(self, cu, deferral=waits.deferral, owner=waits.owner,  # made once, not per block
                                   note=self._note, ordered=self._ordered, pending=self.pending,
                                   beside=partial(released_beside, cu))

    def allocate_block(self, size: int, stream: StreamRef, not_capturing: bool = False) -> Block:
        """The core's contract (:mod:`.block`): ``size`` bytes for work on ``stream``, above
        ``max_block`` from :attr:`delegate_block`; rule 13 and errors as :meth:`allocate` (``not_capturing``: as
        :meth:`.mempool_blocks.PooledBlocks.allocate_block`'s)."""
        if underway:  # rule 13: no arena block while a capture is under way
            return self.capture_router(size, stream)
        if size > self.max_block:
            return self.delegate_block(size, stream, not_capturing)
        if stream is not LEGACY:
            if not not_capturing and is_capturing(self._cu, stream.handle):  # rule 13: an allocation node, not a carve
                return self.capture_router(size, stream)
            return self.allocate_scoped(size, stream)
        rounded = round_up(size)
        ready = self.ready.get(rounded)
        block = None
        if ready:
            try:
                block = ready.pop()
            except IndexError:  # another thread took the last one
                pass
        if block is None:
            block = self._allocate(rounded, LEGACY, self._take_legacy)
            if block is None:  # a reset overtook this allocation
                return self.after_reset(size, LEGACY)
        elif self.dropped:  # rule 12: a reset began before the pop; it frees the block's slab
            return self.after_reset(size, LEGACY)
        self._note(size)
        block.size, block.waits, block.state = size, None, ALLOCATED
        return block

    def allocate_scoped(self, size: int, stream: StreamRef) -> Block:
        """``size`` bytes for work on ``stream`` (a ``using_stream`` scope): its domain's heap."""
        block = self._allocate(round_up(size), stream, self._take_scoped)
        if block is None:  # a reset overtook this allocation
            return self.after_reset(size, stream)
        self._note(size)
        block.size, block.waits, block.state = size, None, ALLOCATED
        return block

    def _allocate(self, rounded: int, stream: StreamRef, take):
        """``take(rounded, stream)`` under the lock (None once a reset dropped the arena)."""
        if rounded > self.max_block:
            raise ArenaError(f"{rounded} bytes is above the arena's largest block ({self.max_block} bytes)")
        self._drain_if_due()
        try:
            return self._take_locked(take, rounded, stream)
        except CudaAPIError as err:
            if err.code != OUT_OF_MEMORY:
                raise
        return self._on_out_of_memory(rounded, partial(self._take_locked, take, rounded, stream))

    def _take_locked(self, take, rounded: int, stream: StreamRef):
        with self._lock:
            return None if self.dropped else take(rounded, stream)

    def _take_legacy(self, rounded: int, stream: StreamRef) -> Block:
        self._publish_released()
        quarantine = self.quarantine
        quarantine.fence_if_due(REFILL_AT, self.quarantine_limit, self._deferral)
        if self.fences.batches or self.fences.unseen:  # rule 4: the blocks whose fence the host has seen complete
            self._free_into_legacy(quarantine.collect())
            ready = self.ready.get(rounded)
            if ready:
                return ready.pop()
        legacy = self._legacy
        block = self._carve(legacy, rounded, LEGACY)
        if block is None:
            self._domains.add_slab(legacy, None, rounded)  # None: on the private allocation stream
            block = self._carve(legacy, rounded, LEGACY)
        return block

    def _take_scoped(self, rounded: int, stream: StreamRef) -> Block:
        self._publish_released()
        self.quarantine.fence_if_due(QUARANTINE_BLOCKS, self.quarantine_limit, self._deferral)
        if self.fences.batches or self.fences.unseen:  # their blocks, and the releases waiting for them
            self._free_into_legacy(self.quarantine.collect())
        domain = self._domains.of_stream(stream)
        block = self._carve(domain, rounded, stream)
        if block is None:
            self._domains.add_slab(domain, stream, rounded)
            block = self._carve(domain, rounded, stream)
        return block

    def _carve(self, domain: Domain, rounded: int, stream: StreamRef) -> Block | None:
        start = domain.heap.allocate(rounded)  # the one place a Block is made (Note [A ready block is its Block])
        if start is None:
            return None
        if stream is LEGACY:
            block = LegacyBlock()
        else:
            block = Block()
            block.stream, block.domain = stream, domain
        block.ptr, block.start, block.rounded, block.release = self._device_pointer(start), start, rounded, self._release_bound
        block.waits, block.state = None, ALLOCATED  # before it is in taken, where snapshots read it
        self.taken[start] = block
        return block

    def _ordered(self, block: Block) -> None:
        stream = block.stream  # the gate's ordered release, a scoped block's: rule 5's event on its stream
        if stream is LEGACY:
            self._waits.release(block, LEGACY, partial(self._quarantine_block, block))
            return
        self._waits.release(block, stream, partial(self._publish_scoped, block), partial(self._settle_scoped, block.domain))

    def _quarantine_block(self, block: Block, on: StreamRef | None) -> None:
        self.pending.add([block])  # the next fence orders it, whatever `on`

    def _settle_scoped(self, domain: Domain, stream: StreamRef) -> None:
        # Rule 5, at the drop (Note [A release made free later orders now] in .waits).
        check(self._cu.cuEventRecord(domain.event, stream.handle), "cuEventRecord (arena release)")

    def _publish_scoped(self, block: Block, on: StreamRef | None) -> None:
        if not self.dropped:
            self._released.append(block)

    def _publish_released(self) -> None:
        released = self._released
        while released:
            block = released.popleft()
            self._free_into(block.domain, block)

    def _free_into_legacy(self, blocks: list[Block]) -> None:
        for block in sorted(blocks, key=attrgetter("start")):
            self._free_into(self._legacy, block)

    def _flush_ready(self) -> None:
        self._free_into_legacy(self.quarantine.take_ready())

    def _free_into(self, domain: Domain, block: Block) -> None:
        self.taken.pop(block.start, None)
        self._domains.free(domain, block.start, block.rounded)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of slabs held now (every domain)."""
        return self._domains.reserved

    def flush_cache(self) -> None:
        """Give every ready block back to the legacy heap, coalescing."""
        with self._lock:
            if not self.dropped:
                self._flush_ready()

    def take_released(self, releases: list) -> list[list[Block]]:
        """Rule 4's snapshot before a synchronize, for :meth:`release_cached`."""
        with self._lock:
            return self.quarantine.take_released(releases)

    def release_cached(self, idle: list[list[Block]] = ()) -> int:
        """After a synchronize: ``idle`` into the heap, empty slabs to the mempool; returns the bytes freed."""
        with self._lock:
            if self.dropped:  # a reset freed the slabs
                return 0
            self._publish_released()
            for taken in idle:
                self._free_into_legacy(self.quarantine.make_ready(taken))
            self._flush_ready()
            before = self._domains.reserved
            self._domains.return_empty_slabs()
            return before - self._domains.reserved

    def drop_all(self) -> list[tuple[int, int]]:
        """Forget everything (reset); returns the slabs (start, size) for the caller to free."""
        with self._lock:
            self.dropped = True
            self.taken.clear()
            slabs = self._domains.drop_all()
            self._released.clear()
            self.quarantine.empty()  # in place: the release gate holds its pending list
            self.quarantine.cache_limit = 0
            return slabs

    # -- read-only views: record_stream, IPC, statistics, tests ---------------------------------
    def block_size(self, address: int) -> int | None:
        """The rounded size of the live block starting at ``address``, else None."""
        with self._lock:
            block = self.taken.get(address)
            return None if block is None or block.state != ALLOCATED else block.rounded

    def containing_block(self, address: int) -> Block | None:
        """The live block containing ``address`` (a release a capture holds is live), else None."""
        with self._lock:
            for start, block in self.taken.items():
                if start <= address < start + block.rounded:
                    return block if block.state == ALLOCATED else None
            return None

    def slab_of(self, address: int) -> tuple[int, int] | None:
        """``(start, size)`` of the slab holding ``address``, else None."""
        with self._lock:
            return self._domains.slab_of(address)

    def statistics(self) -> ArenaStatistics:
        """The arena's bytes and counts now (:class:`ArenaStatistics`)."""
        with self._lock:
            self._publish_released()
            quarantined, cached = self.quarantine.bytes()
            in_use = sum(block.rounded for block in self.taken.values()) - quarantined - cached
            return ArenaStatistics(reserved=self._domains.reserved, in_use=in_use, cached=cached,
                                   quarantined=quarantined, fences=self.fences.recorded,
                                   **self._domains.free_figures())

    def check_invariants(self) -> None:
        """:raises AssertionError: unless free and taken blocks tile the slabs and counts add up."""
        with self._lock:
            self._publish_released()
            taken = {start: block.rounded for start, block in self.taken.items()}
            self.quarantine.check_invariants(taken)
            self._domains.check_invariants(taken)

    def layout(self) -> list[tuple[int, int, object, list[tuple[int, int, str]]]]:
        """Every slab as ``(start, size, domain key, blocks)``, blocks ``(start, size, state)`` in address
        order, state the Block's (``"allocated"``, ``"awaiting_free"``) or ``"free"``; takes the lock."""
        with self._lock:
            self._publish_released()
            slabs = []
            for domain in self._domains:
                heap = domain.heap
                free = heap.free_blocks()
                for slab_start, slab_size in sorted(heap.slabs.items()):
                    end = slab_start + slab_size
                    blocks = [(s, n, "free") for s, n in free if slab_start <= s < end]
                    for start, block in self.taken.items():
                        if slab_start <= start < end:
                            blocks.append((start, block.rounded, block.state))
                    slabs.append((slab_start, slab_size, domain.key, sorted(blocks)))
            return slabs


def _not_served(max_block: int, size: int) -> PoolPointer:
    raise ArenaError(f"{size} bytes is above the arena's largest block ({max_block} bytes) "
                     "or inside a scratch scope, and no delegate is set")


def _not_served_block(max_block: int, size: int, stream, not_capturing: bool = False) -> Block:
    raise ArenaError(f"{size} bytes is above the arena's largest block ({max_block} bytes), and no delegate is set")
