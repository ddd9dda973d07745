"""Rule 4's fences (issue 33) on the CUDA model: what a fresh-eyed review found, as regressions.

Each fails on the code before its fix (seen once): statistics read during a capture queried a
fence outside relaxed mode and invalidated the capture; a reset lost a release waiting for a
fence (Note [The legacy stream recorded]), leaking its block."""

from __future__ import annotations

from cuda.bindings import driver as cu

from numba_pool.allocator import captures

from cuda_model.harness import LEGACY

GLOBAL = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL


def _fenced(p, n: int = 40, size: int = 1000) -> None:
    """``n`` legacy blocks used and dropped, then an allocation that records their fence."""
    families = [p.allocate(size) for _ in range(n)]
    for family in families:
        p.launch(LEGACY, [family])
    for family in families:
        p.drop(family)
    p.allocate(size)
    assert p.mm.allocator.mempool_blocks.fences.batches  # a fence not yet seen complete


def test_statistics_during_a_capture_leave_the_fences_alone(programs):
    p = programs(arena=False)
    _fenced(p)
    stream = p.create_stream(True)
    handle = cu.CUstream(stream)
    try:
        with p.using_stream(stream):
            assert p.model.cuStreamBeginCapture(handle, GLOBAL)[0] == cu.CUresult.CUDA_SUCCESS
            p.mm.memalloc(256)  # numba_pool learns of the capture
            assert captures.underway
            p.mm.get_memory_info()  # was: cuEventQuery of the fence in global mode
            err = p.model.cuStreamEndCapture(handle)[0]
    finally:
        captures.underway.clear()
        captures._deferred.take()
    assert err == cu.CUresult.CUDA_SUCCESS, [str(v) for v in p.model.violations]


def test_a_reset_frees_a_block_that_waited_for_the_next_fence(programs):
    p = programs(arena=False)
    s = p.create_stream(False)
    f = p.allocate(1000, s)
    address = f.address
    p.launch(LEGACY, [f])  # used on the legacy stream too
    p.drop(f, legalize="record")  # record_stream(f, legacy): Note [The legacy stream recorded]
    assert p.mm.allocator.waits.after_fence
    p.reset()
    p.model.cuCtxSynchronize()
    assert p.model._memory.find(address) is None  # was: still allocated, the release lost
