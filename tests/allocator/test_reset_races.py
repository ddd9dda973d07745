"""Issue 34: what another thread does while ``reset()`` runs, on the CUDA model.

Each race is interleaved deterministically: the other thread's step is injected at the exact
point of the reset where it lands (a patched method of the reset's own path, named in each
test), not left to timing.  Each test failed on the code before its fix (seen once):

1. An arena allocation popping a ready block after the reset marked the arena dropped and before
   it emptied the ready lists got a block of a slab the reset frees (and, checked alike, a
   mempool allocation popping an idle block).
2. A ``numba_pool.scratch`` carve after the reset's snapshot of the mempool ledger (which holds
   the scratch block) and before the scratch blocks were forgotten got memory the reset frees.
3. A pinned block released while the host cache's reset moved its live table and marked the
   blocks orphaned was never freed.

(1) and (2): "an allocation never completes against a reset generation" (rule 12 of
:mod:`numba_pool.allocator`): the racing allocation must be served by the next generation.
"""

from __future__ import annotations

import gc
import threading

import pytest

from cuda_model.harness import LEGACY, Program
from numba_pool.allocator.host_blocks import HostBlock

SMALL = 1000  # an arena block (the harness's arena serves up to 4 KiB)
WAIT = 60  # seconds: only a hang (a broken test) ever waits this long


def _inside_reset(p: Program, monkeypatch, owner, name: str, step, *, after: bool = False):
    """Run ``p.mm.reset()`` in the program's reset thread; where the reset calls
    ``owner.name`` (the injection point: just before that call, or just ``after`` it), run
    ``step()`` in worker thread 0, as another thread landing there, until it returns or waits
    for the next generation (the manager's ``initialize``, whose lock the reset holds: it goes
    on once the reset is done).  Returns what ``step`` returned."""
    landed = threading.Event()
    worker: list[int] = []
    results: list = []

    initialize = p.mm.initialize

    def initialize_marked():
        if threading.get_ident() in worker:  # the step waits for the next generation now
            landed.set()
        return initialize()

    monkeypatch.setattr(p.mm, "initialize", initialize_marked)
    original = getattr(owner, name)

    def land():
        def run():
            worker.append(threading.get_ident())
            try:
                return step()
            finally:
                landed.set()
        results.append(p.workers[0].submit(run))
        assert landed.wait(WAIT), "the injected step neither returned nor waited for the next generation"

    def injected(*args, **kwargs):
        if results:
            return original(*args, **kwargs)
        if not after:
            land()
            return original(*args, **kwargs)
        returned = original(*args, **kwargs)
        land()
        return returned

    monkeypatch.setattr(owner, name, injected)
    p.resetter.submit(p.mm.reset).result(WAIT)
    p.after_reset()
    assert results, f"the reset never called {name}"
    return results[0].result(WAIT)


def _assert_next_generation(p: Program, pointer, what: str) -> None:
    """``pointer`` is a live block of the generation now in place, and a later allocation
    there does not alias it."""
    address = int(pointer.device_pointer_value)
    allocator = p.mm.allocator
    assert allocator is not None and allocator.allocation_of(address) is not None, (
        f"{what} completed against the generation the reset dropped: {address:#x} lies in memory the reset freed")
    other = p.mm.memalloc(pointer.size)
    assert int(other.device_pointer_value) != address
    other.free()


# -- 1. an arena allocation popping a ready block --------------------------------------------

def test_an_arena_allocation_popping_a_ready_block_during_a_reset(programs, monkeypatch):
    p = programs(arena=True)
    arena = p.mm.allocator.arena
    arena.quarantine_limit = -1  # fence before every miss: released blocks become ready soon
    for _ in range(4):
        f = p.allocate(SMALL)
        p.launch(LEGACY, [f])
        p.drop(f, legalize="sync")
    assert p.model.cuCtxSynchronize()[0] == 0
    p.drop(p.allocate(SMALL), legalize="sync")  # moves the fenced, complete blocks into the ready cache
    assert any(arena.ready.values()), "no ready block to pop: the test sets nothing up"
    allocate = p.mm.memalloc  # the other thread is in the allocation path when the reset begins

    # Injection point: the reset has marked the arena dropped (under its lock) and is about to
    # empty the ready lists, which the allocation's hot path pops without the lock.
    pointer = _inside_reset(p, monkeypatch, arena.quarantine, "empty", lambda: allocate(SMALL))
    _assert_next_generation(p, pointer, "an arena allocation")
    pointer.free()


@pytest.mark.parametrize("path", ["door", "settled"])
def test_a_mempool_allocation_popping_an_idle_block_during_a_reset(programs, monkeypatch, path):
    # The mempool path's idle cache is the same kind of lock-free pop (Note [Idle blocks are kept
    # by size] in numba_pool.allocator.mempool_blocks), of the Block itself: on the EMM door's
    # inlined hot path ("door"), or after the allocation settled a fence (PooledBlocks.reuse).
    p = programs(arena=False)
    blocks = p.mm.allocator.mempool_blocks
    blocks.fences.fence_blocks = 1  # fence each release at the next allocation
    for _ in range(3):
        f = p.allocate(SMALL)
        p.launch(LEGACY, [f])
        p.drop(f, legalize="sync")
        assert p.model.cuCtxSynchronize()[0] == 0
    kept = [p.mm.memalloc(2 * SMALL)]  # fences the last release; the earlier ones go idle
    if path == "door":
        assert p.model.cuCtxSynchronize()[0] == 0
        kept.append(p.mm.memalloc(3 * SMALL))  # the last one idle too: nothing pending, no fence
    settles = bool(blocks.pending or blocks.fences.batches)
    assert blocks.idle.get(SMALL) and settles == (path == "settled"), "the test sets nothing up"
    allocate = p.mm.memalloc

    # Injection point: the reset has marked the source dropped and swapped its live table, and
    # is about to take the idle blocks, which the allocation's hot path pops without a lock.
    pointer = _inside_reset(p, monkeypatch, blocks, "take_released", lambda: allocate(SMALL))
    _assert_next_generation(p, pointer, "a mempool allocation")
    pointer.free()
    for kept_pointer in kept:
        kept_pointer.free()


def test_a_mempool_allocation_popping_its_streams_idle_block_during_a_reset(programs, monkeypatch):
    # Rule 7a's idle list (Note [Idle blocks of a stream]), popped and handed out inline by
    # PooledBlocks.allocate_block on a non-blocking stream's allocation, without a lock.
    p = programs(arena=False)
    blocks = p.mm.allocator.mempool_blocks
    s = p.create_stream(False)
    f = p.allocate(SMALL, stream=s)
    p.launch(s, [f])
    p.drop(f)
    assert any(blocks.stream_idle.lists.values()), "the test sets nothing up"
    allocate = p.mm.memalloc  # the generation the reset drops

    def allocate_on_s():
        with p.using_stream(s):
            return allocate(SMALL)
    # Injection point: as above; the reset is about to take the streams' idle lists too.
    pointer = _inside_reset(p, monkeypatch, blocks, "take_released", allocate_on_s)
    _assert_next_generation(p, pointer, "a mempool allocation on its stream")
    pointer.free()


# -- 2. a scratch carve ----------------------------------------------------------------------

@pytest.mark.parametrize("arena", [False, True], ids=["pool", "arena"])
def test_a_scratch_carve_during_a_reset(programs, monkeypatch, arena):
    import numba_pool

    p = programs(arena=arena)
    scope = numba_pool.scratch(1 << 16, manager=p.mm)  # a mempool block: above the arena's largest
    p.workers[0].submit(scope.__enter__).result()
    try:
        first = p.workers[0].submit(p.mm.memalloc, SMALL).result()  # carved
        allocate = p.mm.memalloc  # the other thread is in the allocation path when the reset begins
        # Injection point: the reset has just taken its snapshot of the mempool ledger (which
        # holds the scratch block, freed with it) and has not yet forgotten the scratch blocks.
        pointer = _inside_reset(p, monkeypatch, p.mm.allocator.mempool_blocks, "take_all", lambda: allocate(SMALL),
                                after=True)
        _assert_next_generation(p, pointer, "a scratch carve")
    finally:
        p.workers[0].submit(scope.__exit__, None, None, None).result()
    pointer.free()
    first.free()


# -- 3. a pinned release landing in the host cache's reset ----------------------------------

class _ReleasedWhenMarked(HostBlock):
    """A live block whose release (the array dropped in another thread) lands when the reset
    marks it orphaned: ``before`` or ``after`` the mark is set."""

    __slots__ = ()
    when = "before"
    release = None

    @property
    def orphan(self):
        return self.__dict__.get("orphan", False)

    @orphan.setter
    def orphan(self, value):
        release = type(self).release
        if release is not None and value and self.when == "before":
            type(self).release = None
            release()
        self.__dict__["orphan"] = value
        if release is not None and value and self.when == "after":
            type(self).release = None
            release()


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_pinned_release_landing_in_a_reset_is_freed(programs, when):
    p = programs(arena=False, host=True)
    mem = p.mm.memhostalloc(4096)
    address = mem.host_pointer
    p.model.host_use(address, 4096, "the array")
    held = [mem]
    del mem

    def drop():  # the other thread drops the array: its release runs (no lock)
        held.clear()
        gc.collect()

    block = p.mm.host.live[address].ref
    marked = type(f"Marked{when.title()}", (_ReleasedWhenMarked,), {"when": when, "release": staticmethod(drop)})
    block.__class__ = marked  # injection point: the reset's mark of this live block as orphaned
    p.mm.reset()
    assert not held and marked.release is None, "the release did not land in the reset"
    p.mm.trim()  # frees what the cache holds (a block released before the mark is cached)
    assert p.model.host_stats()["live"] == 0, "the released block was never freed"
    p.check()
