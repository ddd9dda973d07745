"""The arena's free list, plain Python (no CUDA, streams or threads): a :class:`Heap` knows only which bytes of a
domain's slabs are free; the arena (:mod:`.arena`) decides reuse and serializes calls.  Blocks are 256-byte aligned as
``cuMemAlloc``'s (sizes: :func:`round_up`).  :meth:`Heap.allocate` splits the best fit from size bins; :meth:`Heap.free`
coalesces slab neighbours.  The *top* (dlmalloc's "top chunk") stays unbinned, cut cheaply for common requests."""

from __future__ import annotations

import bisect
from ..config import ALIGNMENT


def round_up(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGNMENT` bytes, at least one unit (for 0 bytes)."""
    return (nbytes + ALIGNMENT - 1) & -ALIGNMENT or ALIGNMENT


class ArenaError(ValueError):
    """A request the arena cannot serve, or bookkeeping that does not add up."""


class Heap:
    """One domain's slabs and free blocks, in bytes; sizes passed in are rounded (:func:`round_up`)."""

    __slots__ = ("slabs", "reserved", "by_start", "by_end", "bins", "sizes", "top_start", "top_size")

    def __init__(self):
        self.slabs: dict[int, int] = {}  # start -> size
        self.reserved = 0
        self.by_start: dict[int, int] = {}  # binned free blocks: start -> size
        self.by_end: dict[int, int] = {}  # end -> start
        self.bins: dict[int, dict[int, None]] = {}  # size -> starts (an insertion-ordered set)
        self.sizes: list[int] = []  # the sizes present in bins, ascending
        self.top_start = 0
        self.top_size = 0  # 0: no top block

    def add_slab(self, start: int, size: int) -> None:
        """A new slab, all free; it becomes the top block (the old top goes to the bins)."""
        if start % ALIGNMENT or size % ALIGNMENT or size <= 0:
            raise ArenaError(f"slab of {size} bytes at {start:#x} is not {ALIGNMENT}-byte aligned")
        self.slabs[start] = size
        self.reserved += size
        if self.top_size:
            self._bin(self.top_start, self.top_size)
        self.top_start, self.top_size = start, size

    def is_empty_slab(self, start: int, size: int) -> bool:
        """Whether the free block (start, size) is a whole slab."""
        return self.slabs.get(start) == size

    def empty_slabs(self) -> list[tuple[int, int]]:
        """Every slab that is wholly free, as (start, size)."""
        return [(start, size) for start, size in self.free_blocks() if self.slabs.get(start) == size]

    def remove_slab(self, start: int) -> int:
        """Take a wholly free slab out of the heap, returning its size.  :raises ArenaError: if ``start`` is not one."""
        size = self.slabs.get(start)
        if size is None:
            raise ArenaError(f"{start:#x} is not a slab of this heap")
        if self.top_size and self.top_start == start and self.top_size == size:
            self.top_size = 0
        elif self.by_start.get(start) == size:
            self._unbin(start, size)
        else:
            raise ArenaError(f"slab {start:#x} is not wholly free")
        del self.slabs[start]
        self.reserved -= size
        return size

    def allocate(self, size: int) -> int | None:
        """Best fit: the start of the smallest free block of at least ``size`` bytes, split off its front; the top
        block is chosen unless a smaller binned block fits.  None when no free block is large enough."""
        sizes = self.sizes
        i = bisect.bisect_left(sizes, size)
        binned = sizes[i] if i < len(sizes) else 0
        top = self.top_size
        if top >= size and (not binned or top < binned):
            start = self.top_start
            self.top_start, self.top_size = start + size, top - size
            return start
        if not binned:
            return None
        bin_ = self.bins[binned]
        start, _ = bin_.popitem()  # the latest freed of that size
        if not bin_:
            del self.bins[binned]
            del sizes[i]
        del self.by_start[start]
        del self.by_end[start + binned]
        if binned > size:  # the rest (no free neighbour, by invariant) becomes the top: dlmalloc's designated victim
            if self.top_size:
                self._bin(self.top_start, self.top_size)
            self.top_start, self.top_size = start + size, binned - size
        return start

    def free(self, start: int, size: int) -> tuple[int, int]:
        """Add a free block, coalescing it with free neighbours in its slab; returns the merged (start, size)."""
        end = start + size
        slabs = self.slabs
        merged_top = False
        if end not in slabs:  # the next block is in the same slab
            if self.top_size and end == self.top_start:
                size += self.top_size
                self.top_size = 0
                merged_top = True
            else:
                next_size = self.by_start.get(end)
                if next_size is not None:
                    self._unbin(end, next_size)
                    size += next_size
        if start not in slabs:  # the previous block is in the same slab
            if self.top_size and self.top_start + self.top_size == start:
                start, size = self.top_start, self.top_size + size
                self.top_size = 0
                merged_top = True
            else:
                previous = self.by_end.get(start)
                if previous is not None:
                    previous_size = self.by_start[previous]
                    self._unbin(previous, previous_size)
                    start, size = previous, size + previous_size
        if merged_top or not self.top_size:
            self.top_start, self.top_size = start, size
        else:
            self._bin(start, size)
        return start, size

    def free_blocks(self) -> list[tuple[int, int]]:
        """Every free block (start, size), the top included."""
        found = list(self.by_start.items())
        if self.top_size:
            found.append((self.top_start, self.top_size))
        return found

    def free_bytes(self) -> int:
        return sum(self.by_start.values()) + self.top_size

    def largest_free(self) -> int:
        return max(self.sizes[-1] if self.sizes else 0, self.top_size)

    def _bin(self, start: int, size: int) -> None:
        self.by_start[start] = size
        self.by_end[start + size] = start
        bin_ = self.bins.get(size)
        if bin_ is None:
            self.bins[size] = {start: None}
            bisect.insort(self.sizes, size)
        else:
            bin_[start] = None

    def _unbin(self, start: int, size: int) -> None:
        del self.by_start[start]
        del self.by_end[start + size]
        bin_ = self.bins[size]
        del bin_[start]
        if not bin_:
            del self.bins[size]
            del self.sizes[bisect.bisect_left(self.sizes, size)]

    def check_invariants(self, taken: dict[int, int]) -> None:
        """Raise AssertionError unless the slabs are tiled exactly (no gap, no overlap) by the free blocks and
        ``taken``'s (start -> size) in them, all 256-aligned, no two adjacent free blocks, byte counts agreeing."""
        assert len(self.by_start) == len(self.by_end) == sum(len(b) for b in self.bins.values())
        assert self.sizes == sorted(self.bins), "size bins out of order"
        for s, n in self.by_start.items():
            assert self.by_end[s + n] == s and s in self.bins[n]
        assert not self.top_size or self.top_start not in self.by_start
        pieces = {s: (n, True) for s, n in self.free_blocks()}
        for start, size in taken.items():
            if any(s <= start < s + n for s, n in self.slabs.items()):
                assert start not in pieces, f"block {start:#x} is both free and taken"
                pieces[start] = (size, False)
        for start, size in self.slabs.items():
            at = start
            while at < start + size:
                assert at in pieces, f"gap or overlap at {at:#x} in slab {start:#x}"
                n, is_free = pieces.pop(at)
                assert at % ALIGNMENT == 0 and n % ALIGNMENT == 0 and n > 0
                following = pieces.get(at + n)
                if is_free and at + n < start + size and following is not None:
                    assert not following[1], f"adjacent free blocks at {at:#x} not coalesced"
                at += n
            assert at == start + size, f"a block crosses the end of slab {start:#x}"
        assert not pieces, f"free blocks outside every slab: {sorted(pieces)[:4]}"
        assert self.reserved == sum(self.slabs.values())
