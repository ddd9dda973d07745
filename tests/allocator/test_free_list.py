"""The arena's heap (best fit, split, coalesce, slabs) against host memory: unit tests and a
hypothesis state machine.  Streams and ordering are tested on the CUDA model (test_ordering.py,
test_fuzz.py)."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from numba_pool.allocator.free_list import ALIGNMENT, ArenaError, Heap, round_up

SLAB = 64 << 10


class HostSlabs:
    """Slabs of real host memory (256-byte aligned ctypes buffers), so overlaps show up as
    corrupted byte patterns."""

    def __init__(self):
        self.buffers = {}

    def new(self, nbytes: int) -> int:
        buf = ctypes.create_string_buffer(nbytes + ALIGNMENT)
        address = (ctypes.addressof(buf) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        self.buffers[address] = buf
        return address


def heap_with_slab(size=SLAB):
    heap, slabs = Heap(), HostSlabs()
    heap.add_slab(slabs.new(size), size)
    return heap, slabs


@pytest.mark.parametrize("nbytes, rounded", [(0, 256), (1, 256), (255, 256), (256, 256), (257, 512), (1000, 1024)])
def test_round_up_to_whole_256_byte_units(nbytes, rounded):
    assert round_up(nbytes) == rounded


def test_split_then_coalesce_back_into_one_slab_block():
    heap, _ = heap_with_slab()
    a, b, c = (heap.allocate(1024) for _ in range(3))
    assert b == a + 1024 and c == b + 1024  # cut off the top in turn
    heap.free(b, 1024)
    heap.free(a, 1024)  # merges with b's block
    assert heap.free(c, 1024) == (a, SLAB)  # merges with a+b and with the top
    assert heap.free_blocks() == [(a, SLAB)] and heap.empty_slabs() == [(a, SLAB)]
    heap.check_invariants({})


def test_best_fit_picks_the_smallest_block_that_fits():
    heap, _ = heap_with_slab()
    blocks = [heap.allocate(n) for n in (4096, 256, 1024, 256, 2048, 256)]
    for i in (0, 2, 4):  # free 4096, 1024, 2048: separated by held 256-byte blocks
        heap.free(blocks[i], (4096, 256, 1024, 256, 2048, 256)[i])
    assert heap.allocate(1024) == blocks[2]
    assert heap.allocate(1536) == blocks[4]  # the 2048 block, split
    assert heap.allocate(256) == blocks[4] + 1536  # the split's rest became the top: cut from it
    held = {blocks[1]: 256, blocks[3]: 256, blocks[5]: 256, blocks[2]: 1024, blocks[4]: 1536, blocks[4] + 1536: 256}
    heap.check_invariants(held)


def test_nothing_fits_gives_none_and_a_new_slab_becomes_the_top():
    heap, slabs = heap_with_slab(4096)
    assert heap.allocate(4096) is not None and heap.allocate(256) is None
    second = slabs.new(8192)
    heap.add_slab(second, 8192)
    assert heap.allocate(512) == second and heap.reserved == 4096 + 8192


def test_blocks_of_two_slabs_never_coalesce_across_them():
    heap, slabs = Heap(), HostSlabs()
    base = slabs.new(2 * 4096)
    heap.add_slab(base, 4096)
    heap.add_slab(base + 4096, 4096)  # adjacent slabs
    a = heap.allocate(4096)
    b = heap.allocate(4096)
    heap.free(a, 4096)
    heap.free(b, 4096)
    assert sorted(heap.empty_slabs()) == [(base, 4096), (base + 4096, 4096)]
    heap.check_invariants({})


def test_remove_slab_takes_only_wholly_free_slabs():
    heap, _ = heap_with_slab(4096)
    start = heap.allocate(256)
    with pytest.raises(ArenaError, match="not wholly free"):
        heap.remove_slab(start)
    with pytest.raises(ArenaError, match="not a slab"):
        heap.remove_slab(start + 256)
    heap.free(start, 256)
    assert heap.remove_slab(start) == 4096 and heap.reserved == 0 and heap.free_blocks() == []


def test_misaligned_slab_is_refused():
    with pytest.raises(ArenaError, match="aligned"):
        Heap().add_slab(4096 + 8, 4096)


class HeapMachine(RuleBasedStateMachine):
    """Random allocate/free/add-slab/remove-slab sequences; every held block carries a byte
    pattern in host memory, checked when it is freed, so an overlap shows up as corruption."""

    blocks = Bundle("blocks")

    def __init__(self):
        super().__init__()
        self.heap, self.slabs = Heap(), HostSlabs()
        self.held: dict[int, tuple[int, int]] = {}  # start -> (size, pattern)
        self.counter = 0

    @rule(target=blocks, nbytes=st.integers(0, 6 << 10), slab=st.sampled_from([4 << 10, 16 << 10]))
    def allocate(self, nbytes, slab):
        size = round_up(nbytes)
        start = self.heap.allocate(size)
        if start is None:
            slab = max(slab, size)
            self.heap.add_slab(self.slabs.new(slab), slab)
            start = self.heap.allocate(size)
        assert start is not None and start not in self.held
        self.counter = self.counter % 250 + 1
        ctypes.memset(start, self.counter, size)
        self.held[start] = (size, self.counter)
        return start

    @rule(start=consumes(blocks))
    def free(self, start):
        size, pattern = self.held.pop(start)
        assert ctypes.string_at(start, size) == bytes([pattern]) * size, "a held block was overwritten: blocks overlap"
        self.heap.free(start, size)

    @rule()
    def remove_empty_slabs(self):
        for start, size in self.heap.empty_slabs():
            assert self.heap.remove_slab(start) == size

    @invariant()
    def consistent(self):
        self.heap.check_invariants({s: n for s, (n, _) in self.held.items()})
        assert self.heap.free_bytes() + sum(n for n, _ in self.held.values()) == self.heap.reserved


HeapMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestHeapStateMachine = HeapMachine.TestCase
