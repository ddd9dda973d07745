"""The arena's domains and slabs (rules 1, 5, 6 of :mod:`numba_pool.allocator`).  A *domain* is one stream's heap of
slabs (:class:`~.free_list.Heap`), each a mempool allocation on its stream (the legacy domain's on the private
allocation stream: always idle, rule 4).  Memory moves between streams only as wholly free slabs back to the mempool
(:meth:`Domains.return_slab`), never on the legacy stream (barriers).  All methods run under the arena's lock."""

from __future__ import annotations

import weakref

from ..cuda.capture import relaxed
from ..cuda.driver import EVENT_FLAGS, check
from ..cuda.streams import LEGACY, StreamRef
from .free_list import Heap

FIRST_SLAB = 64 << 10  #: The first slab's size (bytes), unless the largest slab is smaller.
GROWTH = 32  #: A new slab is ~1/GROWTH of the arena's reserve: slabs grow with it, the last, partly used one ~3% of it.
BLOCKS_PER_SLAB = 64  #: A new slab fits >= this many of its request: one size does not fence (or add a slab) each time.


class Domain:
    """One stream's free blocks (rule 1): a heap of its slabs and, but for the legacy domain, rule 5's event."""

    __slots__ = ("key", "heap", "event")

    def __init__(self, key, event=None):
        self.key = key  # the stream's driver id (rule 6), or LEGACY.key
        self.heap = Heap()  # its slabs and free blocks
        self.event = event  # rule 5: recorded on the stream after each release and slab; None for legacy


class Domains:
    """Every domain of an arena by stream key, and their slabs' bytes.  Slabs come from mempool ``pool_handle``, at
    most ``slab_size`` bytes; ``release_threshold`` bytes are kept when one empties (None: all); the legacy
    domain's come and go on private stream ``alloc_stream``, others' go back on ``return_stream``."""

    def __init__(self, cu, pool_handle, *, slab_size: int, release_threshold: int | None,
                 alloc_stream, return_stream):
        self._cu = cu
        self._alloc_async = cu.cuMemAllocFromPoolAsync
        self._pool = pool_handle
        self.slab_size = slab_size
        self.release_threshold = release_threshold
        self._alloc_stream, self._return_stream = alloc_stream, return_stream
        self.legacy = Domain(LEGACY.key)
        self._by_key: dict = {LEGACY.key: self.legacy}  # stream key -> Domain
        self.reserved = 0  # bytes of slabs held, every domain

    def __iter__(self):
        return iter(list(self._by_key.values()))

    def of_stream(self, stream: StreamRef) -> Domain:
        """``stream``'s domain (not legacy), made at first use with rule 5's event; key: ``cuStreamGetId`` (rule 6)."""
        key = stream.key
        if key is None:
            key = stream.key = check(self._cu.cuStreamGetId(stream.handle), "cuStreamGetId")
        domain = self._by_key.get(key)
        if domain is None:
            event = check(self._cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
            domain = self._by_key[key] = Domain(key, event)
        return domain

    def next_slab_size(self, need: int) -> int:
        """The next slab's size for a request of ``need`` bytes: the power of two nearest above 1/GROWTH of the
        bytes reserved, or BLOCKS_PER_SLAB requests if more, within FIRST_SLAB..``slab_size``, at least ``need``."""
        target = 1 << max(0, (self.reserved // GROWTH - 1).bit_length())
        return max(need, min(self.slab_size, max(FIRST_SLAB, target, BLOCKS_PER_SLAB * need)))

    def add_slab(self, domain: Domain, stream: StreamRef | None, need: int) -> None:
        """A slab of at least ``need`` bytes for ``domain``, on ``stream`` (None: the private allocation stream).
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` (or another driver error)."""
        size = self.next_slab_size(need)
        handle = self._alloc_stream.handle if stream is None else stream.handle
        ptr = check(self._alloc_async(size, self._pool, handle),
                    f"cuMemAllocFromPoolAsync({size}) for an arena slab")
        if domain.event is not None:  # rule 5: the slab is usable from this point of the stream on
            check(self._cu.cuEventRecord(domain.event, handle), "cuEventRecord (arena slab)")
        else:  # rule 4: the legacy domain's blocks are idle, so its slab's allocation is complete
            self._alloc_stream.complete()
        domain.heap.add_slab(int(ptr), size)
        self.reserved += size

    def free(self, domain: Domain, start: int, size: int) -> None:
        """Put a block back in ``domain``'s heap (coalescing); a slab now wholly free goes back to the mempool when
        the arena is over its release threshold, or when it is not a stream domain's only slab."""
        heap = domain.heap
        start, size = heap.free(start, size)
        if heap.is_empty_slab(start, size) and self._gives_back(domain):
            self.return_slab(domain, start)

    def _gives_back(self, domain: Domain) -> bool:
        # An empty slab stays under the release threshold; a stream's domain keeps one (gone streams hold one each).
        if self.release_threshold is not None and self.reserved > self.release_threshold:
            return True
        return domain is not self.legacy and len(domain.heap.slabs) > 1

    def return_slab(self, domain: Domain, start: int) -> None:
        """A wholly free slab back to the mempool after its domain's last release: the legacy domain's are idle;
        others' go on the return stream after their event (rule 5: never the domain's stream, which may be gone).
        In relaxed capture mode (rule 13): ``stats()`` during a global capture may publish the release that empties
        the slab, and the driver refuses a free on another stream there otherwise (the capture invalidated)."""
        cu = self._cu
        with relaxed(cu):
            if domain.event is None:
                on = self._alloc_stream.handle
            else:
                on = self._return_stream.handle
                check(cu.cuStreamWaitEvent(on, domain.event, 0), "cuStreamWaitEvent (arena slab)")
            check(cu.cuMemFreeAsync(cu.CUdeviceptr(start), on), "cuMemFreeAsync (arena slab)")
        self.reserved -= domain.heap.remove_slab(start)
        if domain is not self.legacy and not domain.heap.slabs:
            del self._by_key[domain.key]
            cu.cuEventDestroy(domain.event)  # the driver keeps it until pending waits are done

    def return_empty_slabs(self) -> None:
        """Every wholly free slab of every domain back to the mempool (stream-ordered)."""
        for domain in self:
            for start, _ in domain.heap.empty_slabs():
                self.return_slab(domain, start)

    def drop_all(self) -> list[tuple[int, int]]:
        """Forget every domain (reset); returns the slabs (start, size) to free.  A release that saw it undropped may
        still record its domain's event: events go when this object (only its arena's) is collected."""
        slabs = [slab for domain in self for slab in domain.heap.slabs.items()]
        events = [domain.event for domain in self if domain.event is not None]
        weakref.finalize(self, _destroy_events, self._cu, events).atexit = False
        self._by_key.clear()
        self.reserved = 0
        return slabs

    def slab_of(self, address: int) -> tuple[int, int] | None:
        """``(start, size)`` of the slab holding ``address``, else None."""
        for domain in self:
            for start, size in domain.heap.slabs.items():
                if start <= address < start + size:
                    return start, size
        return None

    def free_figures(self) -> dict[str, int]:
        """What the heaps hold: ``free`` bytes, ``free_blocks``, ``largest_free_block``, ``slabs``, ``domains``."""
        heaps = [domain.heap for domain in self]
        return {"free": sum(h.free_bytes() for h in heaps), "free_blocks": sum(len(h.free_blocks()) for h in heaps),
                "largest_free_block": max([h.largest_free() for h in heaps] + [0]),
                "slabs": sum(len(h.slabs) for h in heaps), "domains": len(heaps)}

    def check_invariants(self, taken: dict[int, int]) -> None:
        """Heaps tiled by free blocks and ``taken``'s; reserved bytes add up.  :raises AssertionError: if not."""
        for domain in self:
            domain.heap.check_invariants(taken)
        assert sum(d.heap.reserved for d in self) == self.reserved
        in_slabs = sum(taken.values()) + sum(d.heap.free_bytes() for d in self)
        assert in_slabs == self.reserved, f"{in_slabs} bytes in blocks, {self.reserved} in slabs"


def _destroy_events(cu, events: list) -> None:
    for event in events:  # once unrecordable; with no current context the calls fail (the events go with it)
        cu.cuEventDestroy(event)
