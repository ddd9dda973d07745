"""The fences of the host-rule caches (pinned and managed blocks, numba_pool/allocator/host_blocks.py
and ``HostFences`` in numba_pool/allocator/fences.py) on the CUDA model: a release enqueues nothing on
the legacy stream (Note [A release records nothing on the legacy stream]); an allocation records one
fence for a batch of released blocks, never while a ``defer_cleanup`` is open; a block is reused
only once fenced and seen complete by the host; planted bugs that break it are caught."""

from __future__ import annotations

import gc

import pytest
from cuda_model.harness import LEGACY, Program
from numba_pool.allocator.fences import HostFences
from test_host_blocks import Pinned, fence_at_every_allocation, sync


@pytest.fixture
def prog(frontend_name):
    """A manager with the pinned cache on (and the managed one, as by default), on each
    frontend's classes in turn."""
    p = Program(arena=False, host=True, frontend=frontend_name)
    yield p
    p.close()


def test_a_release_is_not_fenced_until_enough_blocks_wait(prog):
    # The fence is one legacy-stream event for a batch: an allocation records it once
    # fences.fence_blocks released blocks wait (FENCE_BLOCKS by default), never per release;
    # until then no synchronize of the program makes a released block reusable.
    fences = prog.mm.host.fences
    fences.fence_blocks = 3
    first = [Pinned(prog, 4096) for _ in range(3)]
    addresses = {p.address for p in first}
    first[0].drop()
    first[1].drop()
    prog.model.cuCtxSynchronize()
    later = [Pinned(prog, 4096), Pinned(prog, 4096)]  # two unfenced: no fence, new blocks
    assert fences.recorded == 0 and not addresses & {p.address for p in later}
    first[2].drop()
    prog.model.cuCtxSynchronize()
    fresh = Pinned(prog, 4096)  # three wait: one fence for all three, not yet complete
    assert fences.recorded == 1 and fresh.address not in addresses
    assert all(b.fenced for bin_ in prog.mm.host.bins.values() for b in bin_)
    sync(prog, LEGACY)
    again = [Pinned(prog, 4096) for _ in range(3)]
    assert {p.address for p in again} == addresses and fences.recorded == 1
    prog.check()


def test_a_fence_is_one_event_whatever_the_batch(prog):
    # A fence of N released blocks is one event record on the legacy stream, shared by the
    # batch (it recorded one per block before: 32 driver calls per fence); the shared event
    # goes back to the cache's events only once every block of the batch was reused.
    fences = prog.mm.host.fences
    fences.fence_blocks = 5
    blocks = [Pinned(prog, 4096) for _ in range(5)]
    for b in blocks:
        b.drop()
    before = _legacy_ops(prog)
    fresh = Pinned(prog, 4096)  # five wait: this allocation fences them
    assert fences.recorded == 1 and _legacy_ops(prog) - before == 1
    binned = [b for bin_ in prog.mm.host.bins.values() for b in bin_]
    assert len(binned) == 5 and len({id(b.fence) for b in binned}) == 1 and binned[0].fence.users == 5
    sync(prog, LEGACY)
    reused = [Pinned(prog, 4096) for _ in range(4)]
    assert binned[0].fence is None and [b for bin_ in prog.mm.host.bins.values() for b in bin_][0].fence.users == 1
    del fresh, reused
    prog.check()


def test_over_the_cap_an_allocation_synchronizes_instead_of_fencing_a_few_blocks(frontend_name):
    # Over the cap the cache must free cached blocks now: a barrier, as out of memory is. It
    # synchronizes the context (whose cost the default manager's frees pay too) rather than
    # record a fence for the two blocks released so far: a fence is due only at 32 blocks.
    p = Program(arena=False, host=True, host_max_size=3 * 4096, frontend=frontend_name)
    try:
        fences = p.mm.host.fences
        blocks = [Pinned(p, 4096) for _ in range(3)]
        blocks[0].drop()
        blocks[1].drop()
        before = _legacy_ops(p)
        big = Pinned(p, 8192)  # over the cap: the two released blocks are freed
        assert fences.recorded == 0 and _legacy_ops(p) == before
        assert p.mm.host.reserved <= 3 * 4096  # the cap holds
        del big, blocks
        p.check()
    finally:
        p.close()


def _legacy_ops(prog) -> int:
    """numba_pool's operations on a legacy stream so far, in every call the program made and
    elsewhere (:mod:`cuda_model.costs`)."""
    cost = prog.model.legacy_cost()
    return cost.elsewhere + sum(f.ops + f.excused_ops for f in cost.by_call.values())


def test_inside_defer_cleanup_nothing_goes_on_the_legacy_stream(prog):
    # Issue 33: while a defer_cleanup is open, a pinned and a managed release and allocations
    # of both enqueue nothing on the legacy stream (a kernel may wait for a later copy on
    # another blocking stream); the released blocks, and those released before the scope and
    # not yet fenced, are fenced only after the scope exits, by the next allocation, and
    # reused once that fence completed.
    host, managed = prog.mm.host, prog.mm.managed
    fence_at_every_allocation(prog)
    managed.fences.fence_blocks = 1  # a fence not held back would show at the first allocation
    s = prog.create_stream(blocking=True)
    spare_p, spare_m = Pinned(prog, 4096), prog.allocate_managed(4096)
    pinned, used = Pinned(prog, 4096), prog.allocate_managed(4096)
    pinned.copy(s)
    prog.launch(s, [used])
    spare_p.drop()
    prog.drop(spare_m)
    gc.collect()
    fencing = Pinned(prog, 100), prog.allocate_managed(100)  # another size: fence the spares,
    prog.model.cuCtxSynchronize()  # and see them complete: the scope's allocations reuse them
    assert (fencing[0].address, fencing[1].address) != (spare_p.address, spare_m.address)
    fences = host.fences.recorded, managed.fences.recorded
    waiting, waiting_m = Pinned(prog, 8192), prog.allocate_managed(8192)
    waiting.drop()  # released before the scope, not fenced yet
    prog.drop(waiting_m)
    gc.collect()
    before = _legacy_ops(prog)
    with prog.defer_cleanup():
        with prog.attributed("release", "pinned"):
            pinned.drop()
        prog.drop(used)
        gc.collect()
        with prog.attributed("allocation", "pinned"):
            inner = [Pinned(prog, 4096), Pinned(prog, 4096)]  # a cached block, then a new one
        inner_m = prog.allocate_managed(4096)  # a cached block
        assert inner[0].address == spare_p.address and inner_m.address == spare_m.address
        assert _legacy_ops(prog) == before, prog.model.legacy_cost()
        assert (host.fences.recorded, managed.fences.recorded) == fences
        assert pinned.address in [b.ptr for b in host.held.values()] and used.address in [b.ptr for b in managed.held.values()]
        assert [b.host for b in host.fences.unfenced] == [waiting.address]  # binned, not fenced
        assert [b.host for b in managed.fences.unfenced] == [waiting_m.address]
    assert _legacy_ops(prog) == before  # the exit puts the blocks back, unfenced
    assert [b.ptr for b in host.released] == [pinned.address] and not host.released[0].ref.fenced
    assert [b.ptr for b in managed.released] == [used.address] and not managed.released[0].ref.fenced
    a = Pinned(prog, 4096)  # one fence for both pinned blocks (after s's copy): not complete yet
    b = prog.allocate_managed(4096)  # and for both managed blocks (after s's kernel)
    assert not host.fences.unfenced and not managed.fences.unfenced
    assert (host.fences.recorded, managed.fences.recorded) == (fences[0] + 1, fences[1] + 1)
    assert a.address != pinned.address and b.address != used.address
    sync(prog, LEGACY)
    assert Pinned(prog, 4096).address == pinned.address
    assert prog.allocate_managed(4096).address == used.address
    prog.check()


def test_planted_fence_that_records_nothing_is_caught(prog, monkeypatch):
    def fenced_without_an_event(self):  # the bug: blocks marked fenced, no legacy-stream event
        for block in self.unfenced:
            block.fenced = True
        self.unfenced.clear()

    monkeypatch.setattr(HostFences, "fence", fenced_without_an_event)
    fence_at_every_allocation(prog)
    s = prog.create_stream(blocking=True)
    a = Pinned(prog, 4096)
    a.copy(s)
    a.drop()
    b = Pinned(prog, 4096)  # handed out while s's copy may run, and written by the host
    assert b.address == a.address
    text = "\n".join(map(str, prog.model.violations))
    assert "unordered reuse of host memory" in text, text
    prog.model.violations.clear()


def test_a_new_managed_block_inside_defer_cleanup_enqueues_nothing_on_the_legacy_stream(frontend_name):
    p = Program(arena=False, frontend=frontend_name)
    try:
        s, other = p.create_stream(blocking=True), p.create_stream(blocking=True)
        p.launch_waiting(s)  # spins until the copy on `other`
        with p.defer_cleanup():
            assert p.allocate_managed(4096) is not None  # nothing cached: a new block
        p.release_waiting(other)
        sync(p, s)
        violations = [str(v) for v in p.model.violations]  # a deadlock, as on a GPU
        ops = p.model.legacy_cost().figures("allocation", deferred=True).ops
    finally:
        p.close()
    del p  # the failure's traceback keeps no manager alive (snapshots list every manager)
    gc.collect()
    assert violations == [] and ops == 0, (violations, ops)
