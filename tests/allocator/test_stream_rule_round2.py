"""The second round of stream-safety defects, one regression test each, on the CUDA model: each
program is legal under the README's stream semantics and safe under Numba's default manager
(whose ``cuMemFree``/``cuMemFreeHost`` take no stream and synchronize), and each failed on the
code before the fix (commit a00ee0f): the failure is named in each test.

1. A release made free later (``defer_cleanup``, an IPC lease) used its stream's handle after the
   program destroyed the stream and the driver gave the handle to a new one.
2. An allocation racing ``reset()`` was carved out of the memory the reset freed.
3. ``get_ipc_handle`` exported a block whose previous owner's kernel could still be running.
4. A release in a thread where another context of the device is current was ordered on that
   context's legacy stream.
5. A scoped arena release racing ``reset()`` recorded an event the reset destroyed.
6. ``reset()`` inside an open ``defer_cleanup`` block ended the hold-back for the next generation.
7. A pinned release straddling ``reset()`` was cached without being counted.
8. A pinned release falling back part-way through recording its events leaked one event.
"""

from __future__ import annotations

import gc
import threading

import pytest

from cuda.bindings import driver as real_cu
from cuda_model.checks import assert_clean, assert_no_fallback, eager
from cuda_model.harness import LEGACY, Program
from numba_pool.allocator import host_blocks

MODES = pytest.mark.parametrize("arena", [False, True], ids=["pool", "arena"])
SMALL, LARGE = 1000, 100_000  # an arena block, a mempool block (the harness's arena: 4 KiB blocks)


class Pinned:
    """A pinned buffer from the host cache: the host writes it at once, as its new owner."""

    def __init__(self, p: Program, size: int = 4096):
        self.p, self.size = p, size
        self.mem = p.mm.memhostalloc(size)
        self.address = self.mem.host_pointer
        self.owner = f"pinned@{self.address:#x}#{id(self)}"
        p.model.host_use(self.address, size, self.owner)


def _sync(p: Program, stream: int) -> None:
    assert p.model.cuStreamSynchronize(real_cu.CUstream(stream))[0] == 0


# -- 1. a release made free later uses no stream handle after the drop ----------------------

def _destroy_and_reuse_handle(p: Program, s: int) -> int:
    assert p.destroy_stream(s)
    s2 = p.create_stream(False)
    assert s2 == s, "the model gives a destroyed stream's handle to the next new stream"
    return s2


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["arena-block", "mempool-block"])
def test_deferred_release_on_a_stream_whose_handle_a_new_stream_got(programs, size):
    # Before: at the block's exit the held-back release freed on (mempool) or recorded the
    # domain's event on (arena) the new stream: the block (or its slab) went to a new owner
    # while the old stream's kernel ran.
    p = programs(arena=True, release_threshold=0)  # an empty slab goes back at once
    eager(p)
    s = p.create_stream(False)
    with p.mm.defer_cleanup():
        a = p.allocate(size, stream=s)
        p.launch(s, [a])
        p.drop(a, legalize="record")
        s2 = _destroy_and_reuse_handle(p, s)
    b = p.allocate(size, stream=s2)  # the mempool hands s2 what was freed on s2
    p.launch(s2, [b])
    c = p.allocate(size)  # a slab given back on the legacy stream, reused there
    p.launch(LEGACY, [c])
    assert_clean(p)
    p.finish()


def test_deferred_pinned_release_with_a_recorded_stream_whose_handle_came_back(programs):
    # Before: the host events were recorded at the exit, on the new stream: the CPU got the
    # buffer while the old stream's copy still read it.
    p = programs(arena=False, host=True)
    s = p.create_stream(False)
    a = Pinned(p)
    with p.mm.defer_cleanup():
        p.model.copy_async(s, a.address, a.size, a.owner)
        p.mm.record_stream(a.mem, s)
        a.mem = None
        gc.collect()
        s2 = _destroy_and_reuse_handle(p, s)
    _sync(p, s2)
    _sync(p, LEGACY)
    Pinned(p)  # written at once by the host
    assert_clean(p)


@MODES
def test_ipc_lease_let_go_after_the_stream_was_destroyed(programs, arena):
    # Before: the kept release ordered on the stream's handle when the last importer let go.
    p = programs(arena=arena, release_threshold=0)  # an empty slab goes back at once
    eager(p)
    s = p.create_stream(False)
    size = SMALL if arena else LARGE
    a = p.allocate(size, stream=s)
    assert p.hold(a)
    p.launch(s, [a])
    p.drop(a, legalize="record")
    s2 = _destroy_and_reuse_handle(p, s)
    p.let_go(0, bare=True)
    b = p.allocate(size, stream=s2)
    p.launch(s2, [b])
    c = p.allocate(size)  # a slab given back on the legacy stream, reused there
    p.launch(LEGACY, [c])
    assert_clean(p)
    p.finish()


# -- 2 and 5: a reset landing inside an allocation or a release ----------------------------

def _every_line(make, act, during: str, lines: int) -> None:
    """Run ``act(p)`` (an allocation or a drop: ``during``) once per line: a reset lands at that
    line of numba_pool's code in it."""
    for line in range(1, lines + 1):
        p = make()
        p.inject_reset(line, during)
        act(p)
        p.inject = None
        assert_clean(p)
        assert not p.problems, (line, p.problems)
        p.finish()


@pytest.mark.parametrize("stream", ["legacy", "scoped"])
@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["arena-block", "mempool-block"])
def test_an_allocation_racing_a_reset_is_served_by_the_next_generation(programs, stream, size):
    # Before: past the ready cache and before the arena's lock, the allocation carved its block
    # out of the heap the reset had just freed (ResetInjection.judge's problem); a mempool
    # allocation named the destroyed pool (the model's "invalid pool").
    def make():
        p = programs(arena=True)
        p.s = p.create_stream(False)
        for _ in range(3):  # blocks in the ready cache and the heaps
            p.drop(p.allocate(size, stream=p.s if stream == "scoped" else None), legalize="sync")
        return p

    def act(p):
        f = p.allocate(size, stream=p.s if stream == "scoped" else None)
        if f is not None and not f.zombie:
            p.launch(f.stream, [f])
            g = p.allocate(size)  # a second block of the new generation must not alias it
            p.launch(LEGACY, [g])

    _every_line(make, act, "allocate", 70)


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["arena-block", "mempool-block"])
def test_a_release_racing_a_reset_records_no_destroyed_event(programs, size):
    # Before: a scoped arena release checked "not dropped", the reset destroyed the domain's
    # event, then the release recorded it (the model's "invalid event").
    def make():
        p = programs(arena=True)
        s = p.create_stream(False)
        p.a = p.allocate(size, stream=s)
        p.launch(s, [p.a])
        return p

    _every_line(make, lambda p: p.drop(p.a, legalize="record"), "drop", 59)


# -- 3. an export is ordered before the importer ---------------------------------------------

@MODES
def test_an_exported_block_reused_from_a_running_kernel_is_ordered_before_the_importer(programs, arena):
    # Before: get_ipc_handle exported the block at once; the importer's first write raced the
    # previous owner's kernel on a non-blocking stream.
    p = programs(arena=arena)
    eager(p)
    s = p.create_stream(False)
    size = SMALL if arena else LARGE
    a = p.allocate(size)
    p.launch(s, [a])
    p.drop(a, legalize="record")
    b = p.allocate(size)
    assert b.address == a.address
    handle = p.mm.get_ipc_handle(b.refs[0])  # the real export path (the lease is ours)
    p.model.launch(p.importer_stream, [(b.address, b.size, b.id)])  # the producer fills it at once
    assert_clean(p)
    handle.lease.export, handle = None, None
    p.drop(b, legalize="sync")
    gc.collect()


# -- 4. another context of the device current where the array is dropped -----------------

@MODES
def test_a_release_where_another_context_of_the_device_is_current(programs, arena):
    # Before (one device: rule 10's check was off): cuMemFreeAsync on the foreign context's
    # legacy stream, which orders nothing of ours; that context's synchronize then made the
    # block reusable while our blocking stream's kernel still ran.
    p = programs(arena=arena)
    eager(p)
    blocking, other = p.create_stream(True), p.create_stream(False)
    arrays = [p.allocate(LARGE), p.allocate(SMALL, stream=other), p.allocate(LARGE, stream=other)]
    for f in arrays:
        p.launch(blocking if f.stream == LEGACY else f.stream, [f])
    for f in arrays:
        p.drop(f, legalize="wait", how="foreign")
    p.foreign.submit(p.model.cuCtxSynchronize).result()
    again = [p.allocate(LARGE, stream=other), p.allocate(SMALL, stream=other), p.allocate(LARGE, stream=other)]
    for f in again:
        p.launch(other, [f])
    assert_clean(p)
    assert_no_fallback(p)
    p.finish()


def test_a_pinned_release_where_another_context_is_current(programs):
    # Before: the events were created and recorded in the foreign context, on its legacy
    # stream: its synchronize made the block look complete while our copy still read it.
    p = programs(arena=False, host=True)
    blocking = p.create_stream(True)
    a = Pinned(p)
    p.model.copy_async(blocking, a.address, a.size, a.owner)
    holder, a.mem = [a.mem], None
    p.foreign.submit(holder.clear).result()
    p.foreign.submit(p.model.cuCtxSynchronize).result()
    Pinned(p)
    assert_clean(p)


# -- 6. a reset inside an open defer_cleanup block -----------------------------------------

@MODES
def test_a_reset_inside_defer_cleanup_keeps_holding_back(programs, arena):
    # Before: the new generation's depth was 0: an array dropped in the still-open block was
    # released at once, while the non-blocking stream's kernel that relied on the block ran.
    p = programs(arena=arena)
    eager(p)
    s = p.create_stream(False)
    p.open_defer()
    p.reset()
    a = p.allocate(LARGE)
    p.launch(s, [a])  # ordered after the allocation by the program's own event
    p.drop(a, legalize="scope")  # relies on the block: the program synchronizes before its exit
    b = p.allocate(LARGE)
    p.launch(LEGACY, [b])
    assert_clean(p)
    p.close_defer()
    p.finish()


# -- 7 and 8: the pinned cache's accounting and events ---------------------------------------

@pytest.mark.parametrize("recorded", [False, True], ids=["legacy", "recorded-stream"])
def test_a_pinned_release_straddling_a_reset_is_counted(programs, recorded):
    # Before: the block landed in the new cache uncounted: in use + cached != reserved.  A
    # legacy-stream release makes no driver call (Note [A release records nothing on the legacy
    # stream]); with a record_stream stream, it records an event there in the owner's context,
    # a longer path for the reset to land in.
    for line in range(1, 40):
        p = programs(arena=False, host=True)
        a = Pinned(p)
        if recorded:
            p.mm.record_stream(a.mem, p.create_stream(False))
        p.inject_reset(line, "drop")
        holder, a.mem = [a.mem], None
        p.run(0, holder.clear)
        p.inject = None
        Pinned(p)
        host = p.mm.host
        stats = host_blocks.statistics(host)
        assert stats["host_in_use_bytes"] + stats["host_cached_bytes"] == stats["host_reserved_bytes"], (line, stats)
        assert host.reserved == p.model.host_stats()["reserved"], line


def test_a_pinned_release_that_falls_back_part_way_leaks_no_event(programs):
    # Before: the legacy stream's event was recorded, the next (another thread's per-thread
    # stream) failed, and the first event was lost: one CUevent per such release.
    p = programs(arena=False, host=True)
    host = p.mm.host
    for _ in range(5):
        a = Pinned(p)
        other = threading.Thread(target=p.mm.record_stream, args=(a.mem, 2))  # its per-thread stream
        other.start()
        other.join()
        a.mem = None
        gc.collect()
    cached = sum(len(b.events) for bin_ in host.bins.values() for b in bin_)
    cached += sum(len(b.ref.events) for b in host.released)
    assert p.model.live_events() == len(host._free_events) + cached
