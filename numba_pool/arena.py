"""A sub-allocating arena: small blocks carved out of slabs, in plain Python with no CUDA.

Slabs come from an :class:`Upstream` (on the GPU, the stream-ordered mempool; in tests, host
memory).  Blocks are 256-byte aligned (what ``cuMemAlloc`` guarantees).  Free blocks are kept in
size bins and found by best fit; a block larger than needed is split, and a freed block is
coalesced with its free neighbours in the same slab and the same stream domain.

Stream-safety rule (the same as the mempool path's, see :mod:`numba_pool.manager`)
---------------------------------------------------------------------------------
A block is never handed to work that can run before the last use of its previous owner has
finished.

A free here enqueues nothing on the GPU, so the ordering must come from somewhere else.  Every
free block belongs to the *domain* of one stream, the stream its previous owner's work is
ordered on:

1. A block freed on a stream S (inside ``using_stream(S)``) goes straight into S's domain and
   is reusable at once by later allocations on S: S runs the new owner's work after the old.
2. A block freed on the *fenced stream* (the legacy default stream, outside any scope) was
   used by work on any of Numba's blocking streams.  It waits in *quarantine* until the arena
   issues a *fence*, one operation on the legacy stream (``Upstream.fence``), which runs after
   all earlier work of every blocking stream and before all later work: then it joins the
   legacy domain.  One fence releases every block quarantined so far, so its cost is shared;
   the arena fences when a request finds nothing else (before it would take a new slab), or
   when more than :attr:`Arena.quarantine_limit` blocks wait.
3. An allocation on stream T that finds nothing in T's domain may take over another domain K:
   ``Upstream.order(K, T)`` makes T wait (on the device, for an event recorded on K when its
   blocks were freed, so K may have been destroyed since) for the work that used K's free
   blocks, and then all of them join T's domain.  Quarantined blocks
   count as the legacy domain's here (an event recorded on the legacy stream orders all earlier
   blocking-stream work too).
4. ``record_stream`` is honoured by the caller before the free (it makes the free's stream wait
   for the recorded streams), so rules 1-3 cover it.

No host synchronization anywhere on these paths.  :meth:`Arena.consolidate` merges all
domains, and is only for callers that have just synchronized the device.

The ready cache (glibc's "tcache" idea): a few blocks per size that are *ready* for the fenced
stream (quarantined blocks that a fence has released) wait in
:attr:`Arena.cache`, so that an allocation of that size on the legacy stream is one atomic
``list.pop``, with no lock.  Cached blocks count as allocated in the arena's bookkeeping (they
stay in :attr:`Arena.live`), so the invariants below hold; :meth:`flush_cache` (called by
``consolidate``, ``trim`` and ``drop_all``) gives them back for coalescing.

Threads: :meth:`Arena.release` (the finalizers' path) takes no lock: on the fenced stream it
appends the block to the quarantine list of its size (the block stays in :attr:`Arena.live`
until a fence), on another stream it queues it for coalescing at the next operation; each step
is one atomic operation.
Everything else runs under one lock.  A finalizer run by the garbage collector inside the
locked section therefore cannot deadlock.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from dataclasses import dataclass
from typing import Hashable, Protocol

ALIGNMENT = 256
#: Quarantine at most this many blocks before a fence, whatever their bytes.
QUARANTINE_BLOCKS = 256
#: The first slab's size (bytes), unless the largest slab is smaller.
FIRST_SLAB = 64 << 10
#: A new slab is about 1/GROWTH of what the arena reserves already: slabs grow with the
#: arena, so the last, partly used slab stays a small fraction of the total (~3%).
GROWTH = 32
#: A new slab holds at least this many blocks of the request that needs it, so that a
#: workload of one block size does not fence (or take a slab) at every allocation.
BLOCKS_PER_SLAB = 64
#: Ready blocks kept per size in the cache in front of the arena.
CACHE_BLOCKS = 64
#: An allocation on the fenced stream that misses the cache fences once this many blocks are
#: quarantined, refilling the cache: one fence (a driver call) per about this many allocations.
REFILL_AT = 32


def round_up(nbytes: int) -> int:
    """``nbytes`` rounded up to :data:`ALIGNMENT` (at least one unit, for 0 bytes)."""
    return max(ALIGNMENT, (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT)


class Upstream(Protocol):
    """Where slabs come from and how streams are ordered (on the GPU: the mempool and events)."""

    def allocate_slab(self, nbytes: int, stream: Hashable) -> int:
        """Return the address of ``nbytes`` of memory usable by work on ``stream``; raise on
        failure (the arena leaves its state unchanged)."""

    def free_slab(self, address: int, nbytes: int, stream: Hashable) -> None:
        """Give a slab back, ordered after the work queued on ``stream``."""

    def fence(self, stream: Hashable) -> None:
        """Enqueue one operation on the fenced stream (the legacy default stream)."""

    def order(self, earlier: Hashable, later: Hashable) -> None:
        """Make work queued on ``later`` from now on wait for the work that used the free
        blocks of ``earlier``'s domain (on the GPU: an event recorded on ``earlier`` when they
        were freed, so ``earlier`` itself may be gone by now)."""

    def forget(self, stream: Hashable) -> None:
        """The arena holds no free block of ``stream``'s domain any more."""


class ArenaError(ValueError):
    """A free of an address the arena did not hand out, or a request it cannot serve."""


@dataclass(frozen=True)
class ArenaStatistics:
    """Bytes and counts of an arena: ``reserved`` (slabs), ``in_use`` (blocks held by their
    owners, rounded to 256 B), ``cached`` (ready blocks in the cache), ``free``/``free_blocks``/
    ``largest_free_block`` (reusable or quarantined free blocks; in_use + cached + free ==
    reserved), ``quarantined`` (bytes waiting for a fence), ``slabs``, ``fences`` and
    ``orderings`` issued so far."""

    reserved: int
    in_use: int
    cached: int
    free: int
    free_blocks: int
    largest_free_block: int
    quarantined: int
    slabs: int
    fences: int
    orderings: int


class _Domain:
    """The free blocks reusable by allocations ordered on one stream.

    One free block, the *top* (dlmalloc's "top chunk": usually a slab's untouched remainder),
    is kept out of the bins: a request that no smaller binned block fits is cut off its front,
    and a freed block adjacent to it merges into it, each with a few integer operations.  It is
    a free block like the others for best fit and coalescing.
    """

    __slots__ = ("by_start", "by_end", "bins", "sizes", "top_start", "top_size")

    def __init__(self):
        self.by_start: dict[int, int] = {}  # start -> size
        self.by_end: dict[int, int] = {}  # end -> start
        self.bins: dict[int, dict[int, None]] = {}  # size -> starts (insertion-ordered set)
        self.sizes: list[int] = []  # the sizes present in bins, ascending
        self.top_start = 0
        self.top_size = 0  # 0: no top block

    def add(self, start: int, size: int) -> None:
        self.by_start[start] = size
        self.by_end[start + size] = start
        bin_ = self.bins.get(size)
        if bin_ is None:
            self.bins[size] = {start: None}
            bisect.insort(self.sizes, size)
        else:
            bin_[start] = None

    def remove(self, start: int, size: int) -> None:
        del self.by_start[start]
        del self.by_end[start + size]
        bin_ = self.bins[size]
        del bin_[start]
        if not bin_:
            del self.bins[size]
            del self.sizes[bisect.bisect_left(self.sizes, size)]

    def best_fit(self, nbytes: int) -> tuple[int, int] | None:
        """Take the smallest free block of at least ``nbytes`` (the latest freed of that size)."""
        sizes = self.sizes
        i = bisect.bisect_left(sizes, nbytes)
        if i == len(sizes):
            return None
        size = sizes[i]
        bin_ = self.bins[size]
        start, _ = bin_.popitem()
        if not bin_:
            del self.bins[size]
            del sizes[i]
        del self.by_start[start]
        del self.by_end[start + size]
        return start, size

    def largest(self) -> int:
        return max(self.sizes[-1] if self.sizes else 0, self.top_size)

    def blocks(self) -> list[tuple[int, int]]:
        """Every free block (start, size), the top included."""
        found = list(self.by_start.items())
        if self.top_size:
            found.append((self.top_start, self.top_size))
        return found

    def count(self) -> int:
        return len(self.by_start) + (1 if self.top_size else 0)


class Arena:
    """Sub-allocates blocks of up to ``max_block`` bytes from slabs of up to ``slab_size``
    bytes.  Slabs start at :data:`FIRST_SLAB` and grow with the arena (:meth:`next_slab_size`).

    :param upstream: source of slabs and stream ordering (:class:`Upstream`).
    :param fenced_stream: the key of the legacy default stream (rule 2 of the module docstring).
    :param release_threshold: bytes of slabs kept when a slab becomes empty; beyond it an empty
        slab goes back to the upstream at once.  ``None`` keeps them all (until :meth:`trim`).
    :raises ArenaError: for a ``slab_size`` or ``max_block`` that is not a multiple of 256 or
        a ``max_block`` above ``slab_size``.
    """

    def __init__(self, upstream: Upstream, *, slab_size: int, max_block: int, fenced_stream: Hashable,
                 release_threshold: int | None = None):
        if slab_size % ALIGNMENT or max_block % ALIGNMENT or not 0 < max_block <= slab_size:
            raise ArenaError(f"slab_size ({slab_size}) and max_block ({max_block}) must be multiples of "
                             f"{ALIGNMENT} with 0 < max_block <= slab_size")
        self.upstream = upstream
        self.slab_size = slab_size
        self.max_block = max_block
        self.fenced_stream = fenced_stream
        self.release_threshold = release_threshold
        #: Fence once more than this many blocks wait in quarantine (tests set -1: fence before
        #: every allocation that follows a free, so a freed block is reusable at once).
        self.quarantine_limit = QUARANTINE_BLOCKS
        self._lock = threading.Lock()
        # (address, stream) pairs freed by finalizers, applied under the lock at the next operation;
        # appending to it is what release() does.
        self._released: deque = deque()
        self._slabs: dict[int, int] = {}  # start -> size
        self._domains: dict[Hashable, _Domain] = {}
        #: Blocks not in the free structures, start -> rounded size: held by their owners, by the
        #: cache, or waiting in quarantine.
        self.live: dict[int, int] = {}
        #: Blocks freed on the fenced stream and not yet fenced, size -> starts.  Appending is
        #: the lock-free free path (:meth:`free_fenced`); a fence moves whole lists at once.
        self.quarantine: dict[int, list[int]] = {}
        #: (stream, size) -> starts of ready blocks, held as live (see the module docstring).
        self.cache: dict[tuple, list[int]] = {}
        #: The fenced stream's part of the cache, size -> ready starts (the same lists).
        self.ready: dict[int, list[int]] = {}
        self.cache_limit = CACHE_BLOCKS
        self._reserved = 0
        self.fences = 0
        self.orderings = 0
        self.dropped = False  # set by drop_all(): finalizers of abandoned blocks then do nothing

    # -- the public operations ------------------------------------------------------------

    def allocate(self, nbytes: int, stream: Hashable) -> int:
        """Return the address of a block of at least ``nbytes`` (rounded up to 256) usable by
        work ordered on ``stream``.

        :raises ArenaError: when ``nbytes`` is above ``max_block``.
        :raises Exception: whatever the upstream raises when a new slab is needed and refused.
        """
        size = (nbytes + ALIGNMENT - 1) & -ALIGNMENT or ALIGNMENT  # round_up(), inlined
        if size > self.max_block:
            raise ArenaError(f"{nbytes} bytes is above the arena's largest block ({self.max_block} bytes)")
        ready = self.cache.get((stream, size))
        if ready:
            try:
                return ready.pop()  # the lock-free fast path: a ready block of this size
            except IndexError:  # another thread took the last one
                pass
        with self._lock:
            if self._released:
                self._apply_releases()
            quarantined = self._quarantined_blocks()
            if quarantined and (quarantined > self.quarantine_limit
                                or (quarantined >= REFILL_AT and stream == self.fenced_stream)):
                self._fence()
                ready = self.cache.get((stream, size))
                if ready:
                    return ready.pop()
            domain = self._domains.get(stream)
            if domain is not None:
                top = domain.top_size
                if top >= size:
                    sizes = domain.sizes
                    # Best fit: the top block is chosen unless a smaller binned block fits.
                    if not sizes or sizes[-1] < size or sizes[bisect.bisect_left(sizes, size)] > top:
                        start = domain.top_start  # the fast path: cut the request off the top
                        domain.top_start = start + size
                        domain.top_size = top - size
                        self.live[start] = size
                        return start
            start = self._allocate_binned(stream, size)
            self.live[start] = size
            return start

    def _allocate_binned(self, stream: Hashable, size: int) -> int:
        found = self._take(stream, size)
        if found is None:
            found = self._take_slowly(stream, size)
        start, block = found
        if block > size:
            # Split.  The rest has no free neighbour in this domain (invariant), and becomes the
            # top block so that the next requests are cut off it (dlmalloc's "designated
            # victim"); the previous top goes to the bins.
            domain = self._domain(stream)
            if domain.top_size:
                domain.add(domain.top_start, domain.top_size)
            domain.top_start, domain.top_size = start + size, block - size
        return start

    def release(self, address: int, stream: Hashable) -> None:
        """Free a block without taking the lock: safe from finalizers and any thread.  A block of
        another stream than the fenced one is coalesced at the next operation."""
        if stream == self.fenced_stream:
            self.free_fenced(address)
        else:
            self._released.append((address, stream))

    def free_fenced(self, address: int) -> None:
        """Free a block used on the fenced stream: it waits in quarantine for the next fence.
        Lock-free (two atomic operations); an unknown address is ignored (a block abandoned by
        :meth:`drop_all`)."""
        size = self.live.get(address)
        if size is not None:
            self._quarantine_list(size).append(address)

    def _quarantine_list(self, size: int) -> list[int]:
        waiting = self.quarantine.get(size)
        return waiting if waiting is not None else self.quarantine.setdefault(size, [])

    def _quarantined_blocks(self) -> int:
        return sum(map(len, list(self.quarantine.values())))

    def free(self, address: int, stream: Hashable) -> None:
        """Free a block now.

        :raises ArenaError: when ``address`` is not a live block of this arena (double free or
            foreign address); the arena is unchanged.
        """
        with self._lock:
            if self._released:
                self._apply_releases()
            size = self.live.get(address)
            if size is None or address in self.quarantine.get(size, ()) or address in self.ready.get(size, ()):
                # not handed out, or already freed (waiting in quarantine or in the cache)
                raise ArenaError(f"free of {address:#x}, which is not a live block of this arena (double free?)")
            if stream == self.fenced_stream:
                self._quarantine_list(size).append(address)
            else:
                del self.live[address]
                self._insert(self._domain(stream), stream, address, size)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of slabs held now."""
        return self._reserved

    def block_size(self, address: int) -> int | None:
        """The rounded size of the live block starting at ``address``, else None."""
        return self.live.get(address)

    def containing_block(self, address: int) -> int | None:
        """The start of the live block that contains ``address``, else None."""
        if address in self.live:
            return address
        for start, size in list(self.live.items()):
            if start <= address < start + size:
                return start
        return None

    def statistics(self) -> ArenaStatistics:
        with self._lock:
            if self._released:
                self._apply_releases()
            quarantine = [(size, len(waiting)) for size, waiting in list(self.quarantine.items()) if waiting]
            quarantined = sum(size * n for size, n in quarantine)
            cached = sum(size * len(ready) for (_, size), ready in list(self.cache.items()))
            in_use = sum(list(self.live.values())) - cached - quarantined
            free_blocks = sum(d.count() for d in self._domains.values()) + sum(n for _, n in quarantine)
            largest = max([d.largest() for d in self._domains.values()] + [s for s, _ in quarantine] + [0])
            return ArenaStatistics(
                reserved=self._reserved, in_use=in_use, free=self._reserved - in_use - cached, cached=cached,
                free_blocks=free_blocks, largest_free_block=largest, quarantined=quarantined,
                slabs=len(self._slabs), fences=self.fences, orderings=self.orderings)

    def flush_cache(self) -> None:
        """Give every cached block back to its stream's domain, coalescing."""
        with self._lock:
            self._flush_cache()

    def _flush_cache(self) -> None:
        for (stream, size), ready in list(self.cache.items()):
            while ready:
                start = ready.pop()
                if self.live.pop(start, None) is not None:
                    self._insert(self._domain(stream), stream, start, size)

    def consolidate(self) -> None:
        """Merge every domain, the cache and the quarantine into the fenced stream's domain,
        coalescing.  Only correct right after the caller synchronized the device: no earlier
        work remains."""
        with self._lock:
            if self._released:
                self._apply_releases()
            self._flush_cache()
            self._move_quarantine()
            target = self._domain(self.fenced_stream)
            for key, domain in list(self._domains.items()):
                if domain is not target:
                    self._absorb(target, domain)
                    del self._domains[key]
                    self.upstream.forget(key)

    def trim(self) -> int:
        """Give every empty slab back to the upstream; returns the bytes released.  Call
        :meth:`consolidate` first (after a synchronize) to find slabs split across domains."""
        with self._lock:
            if self._released:
                self._apply_releases()
            self._flush_cache()
            released = 0
            for stream, domain in self._domains.items():
                for start, size in list(domain.by_start.items()):
                    if self._slabs.get(start) == size:
                        domain.remove(start, size)
                        released += self._give_back(start, size, stream)
                if domain.top_size and self._slabs.get(domain.top_start) == domain.top_size:
                    released += self._give_back(domain.top_start, domain.top_size, stream)
                    domain.top_size = 0
            return released

    def drop_all(self) -> list[tuple[int, int]]:
        """Forget everything (for a reset): return the slabs as (address, size) for the caller
        to free; blocks still live are abandoned."""
        with self._lock:
            self.dropped = True
            slabs = list(self._slabs.items())
            self._released.clear()
            self._slabs.clear()
            self._domains.clear()
            self.live.clear()
            self.quarantine.clear()
            self.cache.clear()
            self.ready.clear()
            self._reserved = 0
            return slabs

    # -- internals (called with the lock held) --------------------------------------------

    def _domain(self, stream: Hashable) -> _Domain:
        domain = self._domains.get(stream)
        if domain is None:
            domain = self._domains[stream] = _Domain()
        return domain

    def _take(self, stream: Hashable, size: int) -> tuple[int, int] | None:
        """Best fit over the binned blocks and the top block of ``stream``'s domain."""
        domain = self._domains.get(stream)
        if domain is None:
            return None
        sizes = domain.sizes
        i = bisect.bisect_left(sizes, size)
        binned = sizes[i] if i < len(sizes) else None
        if domain.top_size >= size and (binned is None or domain.top_size < binned):
            start, block = domain.top_start, domain.top_size
            domain.top_size = 0
            return start, block
        return domain.best_fit(size)

    def _take_slowly(self, stream: Hashable, size: int) -> tuple[int, int]:
        if stream == self.fenced_stream and self._quarantined_blocks():
            self._fence()
            ready = self.cache.get((stream, size))
            if ready:
                return ready.pop(), size  # still marked live: the caller marks it again
            found = self._take(stream, size)
            if found is not None:
                return found
        donor = self._donor_for(stream, size)
        if donor is not None:
            self.upstream.order(donor, stream)
            self.orderings += 1
            if donor == self.fenced_stream:
                self._move_quarantine()
                self._flush_cache()
            domain = self._domains.pop(donor, None)
            if domain is not None:
                self._absorb(self._domain(stream), domain)
            self.upstream.forget(donor)
            found = self._take(stream, size)
            if found is not None:
                return found
        self._new_slab(stream, size)
        return self._take(stream, size)

    def _donor_for(self, stream: Hashable, size: int) -> Hashable | None:
        """Another domain (or the quarantine, as the fenced stream's) with a block that fits."""
        for key, domain in self._domains.items():
            if key != stream and domain.largest() >= size:
                return key
        if stream != self.fenced_stream and (
                any(s >= size and waiting for s, waiting in list(self.quarantine.items()))
                or any(s >= size and ready for (_, s), ready in self.cache.items())):
            return self.fenced_stream
        return None

    def next_slab_size(self, need: int) -> int:
        """The size of the next slab for a request of ``need`` bytes: the power of two nearest
        above 1/GROWTH of the bytes reserved, or BLOCKS_PER_SLAB requests if more, between
        FIRST_SLAB and ``slab_size``, and at least ``need``."""
        target = 1 << max(0, (self._reserved // GROWTH - 1).bit_length())
        return max(need, min(self.slab_size, max(FIRST_SLAB, target, BLOCKS_PER_SLAB * need)))

    def _new_slab(self, stream: Hashable, need: int) -> None:
        size = self.next_slab_size(need)
        start = self.upstream.allocate_slab(size, stream)
        if start % ALIGNMENT:
            raise ArenaError(f"upstream returned a slab at {start:#x}, not {ALIGNMENT}-byte aligned")
        self._slabs[start] = size
        self._reserved += size
        domain = self._domain(stream)
        if domain.top_size:  # the old top goes to the bins; the new slab becomes the top
            domain.add(domain.top_start, domain.top_size)
        domain.top_start, domain.top_size = start, size

    def _apply_releases(self) -> None:
        released, live = self._released, self.live
        while released:
            address, stream = released.popleft()
            size = live.pop(address, None)
            if size is not None:  # else: a finalizer of a block dropped by drop_all()
                self._insert(self._domain(stream), stream, address, size)

    def _fence(self) -> None:
        self.upstream.fence(self.fenced_stream)
        self.fences += 1
        self._move_quarantine()

    def _move_quarantine(self) -> None:
        fenced, live, limit = self.fenced_stream, self.live, self.cache_limit
        rest = []
        for size, waiting in list(self.quarantine.items()):
            count = len(waiting)
            if not count:
                continue
            # Take the first `count` entries in two C-level steps; a finalizer appending
            # meanwhile adds after them and stays for the next fence.
            blocks = waiting[:count]
            del waiting[:count]
            ready = self.ready.get(size)
            if ready is None:
                ready = self.cache[(fenced, size)] = self.ready[size] = []
            room = limit - len(ready)
            if room > 0:  # fenced now: ready blocks fill the cache first (they stay in live)
                ready.extend(blocks[:room])
                blocks = blocks[room:]
            for start in blocks:
                del live[start]
                rest.append((start, size))
        if not rest:
            return
        domain = self._domain(fenced)
        slabs = self._slabs
        run_start = run_end = None
        # Merge address-contiguous runs first (cheap), then coalesce each run with the domain.
        for start, size in sorted(rest):
            if start == run_end and start not in slabs:
                run_end += size
                continue
            if run_start is not None:
                self._insert(domain, self.fenced_stream, run_start, run_end - run_start)
            run_start, run_end = start, start + size
        self._insert(domain, self.fenced_stream, run_start, run_end - run_start)

    def _absorb(self, target: _Domain, donor: _Domain) -> None:
        stream = next(k for k, d in self._domains.items() if d is target)
        for start, size in donor.blocks():
            self._insert(target, stream, start, size)

    def _insert(self, domain: _Domain, stream: Hashable, start: int, size: int) -> None:
        """Add a free block to ``domain``, coalescing with free neighbours in the same slab
        (binned blocks or the top block)."""
        slabs = self._slabs
        end = start + size
        merged_top = False
        if end not in slabs:  # the next block is in the same slab
            if domain.top_size and end == domain.top_start:
                size += domain.top_size
                domain.top_size = 0
                merged_top = True
            else:
                next_size = domain.by_start.get(end)
                if next_size is not None:
                    domain.remove(end, next_size)
                    size += next_size
        if start not in slabs:  # the previous block is in the same slab
            if domain.top_size and domain.top_start + domain.top_size == start:
                start, size = domain.top_start, domain.top_size + size
                domain.top_size = 0
                merged_top = True
            else:
                previous = domain.by_end.get(start)
                if previous is not None:
                    previous_size = domain.by_start[previous]
                    domain.remove(previous, previous_size)
                    start, size = previous, size + previous_size
        if slabs.get(start) == size and self._over_threshold():
            self._give_back(start, size, stream)
            return
        if merged_top or not domain.top_size:
            domain.top_start, domain.top_size = start, size
        else:
            domain.add(start, size)

    def _over_threshold(self) -> bool:
        return self.release_threshold is not None and self._reserved > self.release_threshold

    def _give_back(self, start: int, size: int, stream: Hashable) -> int:
        del self._slabs[start]
        self._reserved -= size
        self.upstream.free_slab(start, size, stream)
        return size

    # -- checking (tests, replay) ---------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError unless: slabs are tiled exactly by live, free and quarantined
        blocks (no overlap, no gap), all 256-aligned; in-use plus free equals reserved; no two
        adjacent free blocks of one domain remain in a slab; the counters agree."""
        with self._lock:
            if self._released:
                self._apply_releases()
            pieces = [(s, n, "live", None) for s, n in self.live.items()]  # cached and quarantined too
            for key, domain in self._domains.items():
                assert len(domain.by_start) == len(domain.by_end) == sum(len(b) for b in domain.bins.values())
                assert domain.sizes == sorted(domain.bins), "size bins out of order"
                for s, n in domain.by_start.items():
                    assert domain.by_end[s + n] == s and s in domain.bins[n]
                    pieces.append((s, n, "free", key))
                if domain.top_size:
                    assert domain.top_start not in domain.by_start
                    pieces.append((domain.top_start, domain.top_size, "free", key))
            pieces.sort()
            by_start = {p[0]: p for p in pieces}
            assert len(by_start) == len(pieces), "two blocks start at the same address"
            for start, size in self._slabs.items():
                at = start
                while at < start + size:
                    piece = by_start.get(at)
                    assert piece is not None, f"gap or overlap at {at:#x} in slab {start:#x}"
                    s, n, kind, key = piece
                    assert s % ALIGNMENT == 0 and n % ALIGNMENT == 0 and n > 0
                    nxt = by_start.get(s + n)
                    if kind == "free" and s + n < start + size and nxt is not None:
                        assert not (nxt[2] == "free" and nxt[3] == key), f"adjacent free blocks at {s:#x} not coalesced"
                    at += n
                assert at == start + size, f"a block crosses the end of slab {start:#x}"
            assert sum(n for _, n, _, _ in pieces) == self._reserved == sum(self._slabs.values())

