"""Ownership of device memory: violations, granule ownership, the pool's address space, pools
and allocations ("Stream Ordered Memory Allocator": reuse, reserved and used bytes, trim)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional

from .ordering import Op, describe_stream, op_a_precedes

# --------------------------------------------------------------------------- violations


@dataclass
class Violation:
    """A broken rule: ``kind`` is ``"unordered reuse"``, ``"use of unallocated memory"``,
    ``"invalid stream"``, ``"invalid event"``, ``"invalid pool"``, ``"free of unknown pointer
    / double free"`` or ``"deadlock"`` (:mod:`cuda_model.deadlock`), among others.
    ``start``/``end`` is the address range concerned (0, 0 if none)."""

    kind: str
    start: int = 0
    end: int = 0
    prev_owner: Any = None
    prev_stream: Optional[int] = None
    prev_stream_id: Optional[int] = None
    prev_site: Optional[str] = None
    new_owner: Any = None
    new_stream: Optional[int] = None
    new_stream_id: Optional[int] = None
    new_site: Optional[str] = None
    detail: str = ""

    def __str__(self) -> str:
        where = f" [{self.start:#x}, {self.end:#x}) ({self.end - self.start} B)" if self.end > self.start else ""
        text = f"{self.kind}{where}" + (f": {self.detail}" if self.detail else "")
        if self.prev_owner is not None or self.prev_site is not None:
            text += (f"\n  previous owner {self.prev_owner!r} on "
                     f"{describe_stream(self.prev_stream, self.prev_stream_id)} at {self.prev_site};")
        new = f"new owner {self.new_owner!r} on " if self.new_owner is not None else "on "
        return text + f"\n  {new}{describe_stream(self.new_stream, self.new_stream_id)} at {self.new_site}"


@dataclass(frozen=True, eq=False)
class _Use:
    op: Op
    owner: Hashable
    site: str


class _Seg:
    __slots__ = ("start", "end", "owner", "frontier")

    def __init__(self, start: int, end: int, owner: Hashable, frontier: tuple):
        self.start, self.end, self.owner, self.frontier = start, end, owner, frontier

    def same_state(self, other: "_Seg") -> bool:
        return (self.end == other.start and self.owner == other.owner
                and len(self.frontier) == len(other.frontier)
                and all(a is b for a, b in zip(self.frontier, other.frontier)))


class _Granules:
    """Owner and use frontier of every granule ever used, as an interval map (sorted,
    disjoint segments of uniform state; bisect on their starts), so 64 MiB arrays are cheap.

    The frontier of a segment holds its owner's maximal uses: a new use of the same owner
    drops the uses it is ordered after.  A new owner must be ordered after all of them.
    """

    def __init__(self):
        self._starts: list[int] = []
        self._segs: list[_Seg] = []

    def __len__(self) -> int:
        return len(self._segs)

    def _split_at(self, x: int) -> None:
        i = bisect.bisect_right(self._starts, x) - 1
        if i >= 0 and self._segs[i].start < x < self._segs[i].end:
            seg = self._segs[i]
            self._segs.insert(i + 1, _Seg(x, seg.end, seg.owner, seg.frontier))
            self._starts.insert(i + 1, x)
            seg.end = x

    def _merge_at(self, i: int) -> None:
        """Merge segment i into segment i-1 when they are contiguous with the same state."""
        if 0 < i < len(self._segs) and self._segs[i - 1].same_state(self._segs[i]):
            self._segs[i - 1].end = self._segs[i].end
            del self._segs[i], self._starts[i]

    @staticmethod
    def _update(seg: _Seg, use: _Use, conflicts: list) -> None:
        vc = use.op.vc
        if seg.owner != use.owner:
            for prev in seg.frontier:
                if not op_a_precedes(prev.op, vc):
                    last = conflicts[-1] if conflicts else None
                    if last is not None and last[2] is prev and last[1] == seg.start:
                        last[1] = seg.end
                    else:
                        conflicts.append([seg.start, seg.end, prev])
            seg.owner, seg.frontier = use.owner, (use,)
        else:
            seg.frontier = tuple(u for u in seg.frontier if not op_a_precedes(u.op, vc)) + (use,)

    def owners(self, lo: int, hi: int) -> list:
        """``(start, end, owner)`` of the granules in [lo, hi) used so far (stream capture:
        whether a kernel node's memory still belongs to the owner it was captured with)."""
        i = max(0, bisect.bisect_right(self._starts, lo) - 1)
        out = []
        for seg in self._segs[i:]:
            if seg.start >= hi:
                break
            if seg.end > lo:
                out.append((max(seg.start, lo), min(seg.end, hi), seg.owner))
        return out

    def use(self, lo: int, hi: int, use: _Use) -> list:
        """Record ``use`` of granules [lo, hi); return ``[start, end, previous_use]`` for each
        range whose previous owner's use is not ordered before it."""
        self._split_at(lo)
        self._split_at(hi)
        i0, i1 = bisect.bisect_left(self._starts, lo), bisect.bisect_left(self._starts, hi)
        conflicts: list = []
        region: list[_Seg] = []
        pos = lo
        for seg in self._segs[i0:i1]:
            if pos < seg.start:
                region.append(_Seg(pos, seg.start, use.owner, (use,)))
            self._update(seg, use, conflicts)
            region.append(seg)
            pos = seg.end
        if pos < hi:
            region.append(_Seg(pos, hi, use.owner, (use,)))
        merged = [region[0]]
        for seg in region[1:]:
            if merged[-1].same_state(seg):
                merged[-1].end = seg.end
            else:
                merged.append(seg)
        self._segs[i0:i1] = merged
        self._starts[i0:i1] = [s.start for s in merged]
        self._merge_at(i0 + len(merged))
        self._merge_at(i0)
        return conflicts


# --------------------------------------------------------------------------- memory


@dataclass(eq=False)
class _Piece:
    """A free block of a pool: freed by ``free_op``; ``order`` grows with each free."""

    base: int
    size: int
    free_op: Op
    order: int


@dataclass(eq=False)
class _Allocation:
    base: int
    size: int
    pool: "_Pool"
    op: Op
    site: str


class _AddressSpace:
    """Device virtual addresses: unmapped holes are reused first (first fit), then new
    addresses are taken above everything handed out so far."""

    def __init__(self, base: int):
        self._next = base
        self._holes: list[list[int]] = []  # sorted, disjoint, coalesced [start, end)

    def map(self, nbytes: int) -> int:
        for i, hole in enumerate(self._holes):
            if hole[1] - hole[0] >= nbytes:
                base = hole[0]
                hole[0] += nbytes
                if hole[0] == hole[1]:
                    del self._holes[i]
                return base
        base, self._next = self._next, self._next + nbytes
        return base

    def unmap(self, base: int, nbytes: int) -> None:
        i = bisect.bisect_left(self._holes, [base, base])
        self._holes.insert(i, [base, base + nbytes])
        for j in (i + 1, i):
            if 0 < j < len(self._holes) and self._holes[j - 1][1] == self._holes[j][0]:
                self._holes[j - 1][1] = self._holes[j][1]
                del self._holes[j]


class _Pool:
    """One memory pool: its free pieces and its accounting (``CU_MEMPOOL_ATTR_*``).

    reserved = live bytes + free pieces not unmapped; used = live bytes."""

    def __init__(self, handle: int, max_size: int, is_default: bool, managed: bool = False):
        self.handle, self.max_size, self.is_default = handle, max_size, is_default
        self.managed = managed  # CU_MEM_ALLOCATION_TYPE_MANAGED: the host may use its memory
        self.exportable = False  # handleTypes other than NONE: graphs' allocation nodes refuse it
        self.alive = True
        self.threshold = 0
        self.reserved = self.used = self.reserved_high = self.used_high = 0
        self.pieces: list[_Piece] = []

    def note_high(self) -> None:
        self.reserved_high = max(self.reserved_high, self.reserved)
        self.used_high = max(self.used_high, self.used)

    def take(self, nbytes: int, eligible: Callable[[_Piece], bool]) -> Optional[tuple[int, list[_Piece]]]:
        """Carve ``nbytes`` out of eligible free pieces, the most recently freed first: one
        piece large enough, else a run of address-contiguous eligible pieces.  Returns the base
        and the pieces used (as they were), or None."""
        ok = [p for p in self.pieces if eligible(p)]
        single = [p for p in ok if p.size >= nbytes]
        if single:
            run = [max(single, key=lambda p: p.order)]
        else:
            run = self._best_run(ok, nbytes)
            if run is None:
                return None
        base, used, need = run[0].base, [], nbytes
        for piece in run:
            part = min(need, piece.size)
            used.append(_Piece(piece.base, part, piece.free_op, piece.order))
            piece.base, piece.size, need = piece.base + part, piece.size - part, need - part
            if piece.size == 0:
                self.pieces.remove(piece)
        self.used += nbytes
        self.note_high()
        return base, used

    @staticmethod
    def _best_run(ok: list[_Piece], nbytes: int) -> Optional[list[_Piece]]:
        runs: list[list[_Piece]] = []
        for piece in sorted(ok, key=lambda p: p.base):
            if runs and runs[-1][-1].base + runs[-1][-1].size == piece.base:
                runs[-1].append(piece)
            else:
                runs.append([piece])
        fits = []
        for run in runs:  # the shortest prefix of each run that is large enough
            total = 0
            for k, piece in enumerate(run):
                total += piece.size
                if total >= nbytes:
                    fits.append(run[:k + 1])
                    break
        return max(fits, key=lambda r: max(p.order for p in r), default=None)

    def trim(self, keep: int, complete: Callable[[Op], bool], space: _AddressSpace) -> int:
        """Unmap free pieces whose free is known complete, oldest first, until reserved <=
        ``keep``; return the bytes unmapped."""
        unmapped = 0
        for piece in sorted(self.pieces, key=lambda p: p.order):
            if self.reserved <= keep:
                break
            if complete(piece.free_op):
                self.pieces.remove(piece)
                self.reserved -= piece.size
                unmapped += piece.size
                space.unmap(piece.base, piece.size)
        return unmapped


class _Memory:
    """All pools, the live allocations (sorted by address) and the device's capacity."""

    FIRST_POOL_HANDLE, POOL_HANDLE_STEP = 0x9000, 0x10

    def __init__(self, device_total: int, base_address: int):
        self.device_total = device_total
        self.space = _AddressSpace(base_address)
        self.pools: dict[int, _Pool] = {}  # alive, by handle
        self.dying: list[_Pool] = []  # destroyed with memory still reserved
        self.default: Optional[_Pool] = None
        self._next_handle = self.FIRST_POOL_HANDLE
        self._live_starts: list[int] = []
        self.live: dict[int, _Allocation] = {}
        self._free_order = 0

    def create_pool(self, max_size: int, is_default: bool = False, managed: bool = False) -> _Pool:
        pool = self.pools[self._next_handle] = _Pool(self._next_handle, max_size, is_default, managed)
        self._next_handle += self.POOL_HANDLE_STEP
        return pool

    def destroy_pool(self, pool: _Pool) -> None:
        pool.alive = False
        del self.pools[pool.handle]
        self.dying.append(pool)

    def all_pools(self) -> list[_Pool]:
        return list(self.pools.values()) + self.dying

    def total_reserved(self) -> int:
        return sum(p.reserved for p in self.all_pools())

    def fits(self, pool: _Pool, nbytes: int) -> bool:
        if pool.max_size and pool.reserved + nbytes > pool.max_size:
            return False
        return self.total_reserved() + nbytes <= self.device_total

    def map_fresh(self, pool: _Pool, nbytes: int) -> int:
        pool.reserved += nbytes
        pool.used += nbytes
        pool.note_high()
        return self.space.map(nbytes)

    def add_live(self, alloc: _Allocation) -> None:
        bisect.insort(self._live_starts, alloc.base)
        self.live[alloc.base] = alloc

    def free(self, base: int, op: Op) -> Optional[_Allocation]:
        """Turn the live allocation at ``base`` into a free piece of its pool."""
        alloc = self.live.pop(base, None)
        if alloc is None:
            return None
        del self._live_starts[bisect.bisect_left(self._live_starts, base)]
        self._free_order += 1
        alloc.pool.pieces.append(_Piece(base, alloc.size, op, self._free_order))
        alloc.pool.used -= alloc.size
        return alloc

    def find(self, address: int) -> Optional[_Allocation]:
        i = bisect.bisect_right(self._live_starts, address) - 1
        if i >= 0:
            alloc = self.live[self._live_starts[i]]
            if address < alloc.base + alloc.size:
                return alloc
        return None

    def uncovered(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The parts of [lo, hi) outside every live allocation."""
        gaps, pos = [], lo
        i = max(0, bisect.bisect_right(self._live_starts, lo) - 1)
        while pos < hi and i < len(self._live_starts):
            alloc = self.live[self._live_starts[i]]
            if alloc.base > pos:
                gaps.append((pos, min(alloc.base, hi)))
            pos = max(pos, alloc.base + alloc.size)
            i += 1
        if pos < hi:
            gaps.append((pos, hi))
        return gaps

    def trim_pool(self, pool: _Pool, keep: int, complete: Callable[[Op], bool]) -> int:
        unmapped = pool.trim(keep, complete, self.space)
        if not pool.alive and pool.reserved == 0 and pool in self.dying:
            self.dying.remove(pool)
        return unmapped

    def trim_to_thresholds(self, complete: Callable[[Op], bool]) -> int:
        """What the driver does at each synchronize: every pool down to its release threshold
        (a destroyed pool down to 0)."""
        return sum(self.trim_pool(p, p.threshold if p.alive else 0, complete) for p in self.all_pools())
