"""Issue 34, defect 5: a managed block is handed out only once the host has seen its allocation
complete.

``cuda.managed_array`` gives the block to the host, which writes it at once.  At 7ab5064 a fresh
managed block was a managed mempool's ``cuMemAllocFromPoolAsync`` on the legacy stream, handed out
before it completed; issue 33 completed it on a private stream first.  Since 2026-11-27 managed
blocks come from ``cuMemAllocManaged``, which is synchronous (Note [Managed blocks are not from a
mempool], :class:`numba_pool.allocator.backings.ManagedBacking`).  The model reports a host use of
managed memory before the host observed its allocation complete (``cuda_model.managed``), so each
path that can hand out a block the driver has just allocated is run here: the first block, a cached
block, a block after a trim gave the cached ones back, and one under ``using_stream``."""

from __future__ import annotations

import gc

import pytest
from cuda.bindings import driver as real_cu


from cuda_model.harness import LEGACY, Program

KIND = "host use of managed memory before its allocation completed"


@pytest.fixture
def prog(frontend_name):
    p = Program(arena=False, frontend=frontend_name)
    yield p
    p.close()


def _handed_out_complete(prog: Program, stream: int | None = None):
    """A managed array (the host writes it at once, ``Program.allocate_managed``): no violation."""
    family = prog.allocate_managed(4096, stream=stream)
    bad = [str(v) for v in prog.model.violations if v.kind == KIND]
    assert not bad, bad
    return family


def test_the_first_managed_block(prog):
    _handed_out_complete(prog)
    prog.check()


def test_a_cached_block_then_a_fresh_one(prog):
    a = _handed_out_complete(prog)
    prog.launch(LEGACY, [a])
    prog.drop(a, legalize="record")
    gc.collect()
    prog.mm.managed.fences.fence_blocks = 1  # fence at the next allocation (else once 32 wait)
    b = _handed_out_complete(prog)  # records the fence: not reusable yet, a fresh block
    assert prog.model.cuStreamSynchronize(real_cu.CUstream(LEGACY))[0] == 0
    c = _handed_out_complete(prog)  # the fence seen complete: the cached block
    assert c.address == a.address and b.address != a.address
    prog.check()


def test_a_block_after_a_trim(prog):
    a = _handed_out_complete(prog)
    address = a.address
    prog.drop(a, legalize="sync")
    gc.collect()
    prog.mm.trim()
    assert prog.mm.managed.cached == 0  # given back to the driver (cuMemFree)
    b = _handed_out_complete(prog)  # the driver's block again, a new cuMemAllocManaged
    assert b.address == address
    prog.check()


def test_a_block_under_using_stream(prog):
    s = prog.create_stream(False)
    f = _handed_out_complete(prog, stream=s)
    prog.launch(s, [f])
    blocking = prog.create_stream(True)
    _handed_out_complete(prog, stream=blocking)
    prog.check()


def test_the_model_reports_a_host_use_before_the_allocation_completed():
    # The model's side of the check: a managed pool's allocation on a stream, used by the host
    # before and after the host saw that stream complete.
    p = Program(arena=False)
    try:
        model = p.model
        props = real_cu.CUmemPoolProps()
        props.allocType = real_cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED
        err, pool = model.cuMemPoolCreate(props)
        err, stream = model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
        err, ptr = model.cuMemAllocFromPoolAsync(4096, pool, stream)
        assert err == real_cu.CUresult.CUDA_SUCCESS
        model.host_use(int(ptr), 4096, "early")
        assert [v.kind for v in model.violations] == [KIND]
        model.violations.clear()
        assert model.cuStreamSynchronize(stream)[0] == 0
        model.host_use(int(ptr), 4096, "after the synchronize")
        assert model.violations == []
        assert model.cuMemFreeAsync(ptr, stream)[0] == 0
        assert model.cuStreamSynchronize(stream)[0] == 0
        model.cuStreamDestroy(stream)
    finally:
        p.close()
