"""The core's contract (:mod:`numba_pool.allocator.block`) on the CUDA model: a door calls
``DeviceAllocator.allocate(nbytes, stream) -> Block`` and ``deallocate(block, stream)`` with a
stream it owns, no ``using_stream`` scope and no frontend."""

from __future__ import annotations

import pytest
from cuda.bindings import driver as real_cu

from numba_pool.allocator import device as device_module
from numba_pool.allocator.block import Block
from numba_pool.cuda.streams import LEGACY, StreamRef
from cuda_model.checks import assert_clean
from cuda_model.harness import Program


def _allocator(p: Program):
    return p.mm.allocator


@pytest.mark.parametrize("arena, size", [(True, 1000), (False, 1000), (True, 100_000)])
def test_a_block_from_the_contract_is_a_record_given_back_once(programs, arena, size):
    p = programs(arena=arena)
    allocator = _allocator(p)
    stream = StreamRef(p.model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1])
    before = allocator.pool.usage().used
    block = allocator.allocate(size, stream)
    assert isinstance(block, Block) and block.size == size and block.stream is stream and block.address
    legacy = allocator.allocate(size, LEGACY)
    assert legacy.stream is LEGACY and legacy.address != block.address
    allocator.deallocate(block, stream)
    allocator.deallocate(legacy)
    again = allocator.allocate(size, stream)  # the stream's own block is free for it at once
    assert again.address == block.address
    allocator.deallocate(again, stream)
    allocator.trim(0)
    assert allocator.pool.usage().used == before


def _reuse_across_a_door_stream(p: Program) -> bool:
    """A door allocates on stream A, a kernel on stream B uses the block, the door deallocates
    it on B (B used it last); a new block on A is used by a kernel (the model reports a use of the
    first block's memory before B's kernel ends).  Whether the new block took the same memory."""
    allocator = _allocator(p)
    flags = real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING
    a, b = (StreamRef(p.model.cuStreamCreate(flags)[1]) for _ in range(2))
    block = allocator.allocate(1000, a)
    p.model.wait(b.handle, a.handle)  # the door orders B's use after the allocation
    p.model.launch(b.handle, [(block.address, 1000, "first")])
    allocator.deallocate(block, b)
    again = allocator.allocate(1000, a)
    p.model.launch(a.handle, [(again.address, 1000, "second")])
    allocator.deallocate(again, a)
    return again.address == block.address


@pytest.mark.parametrize("arena", [True, False])
def test_deallocate_on_another_stream_waits_for_it(programs, monkeypatch, arena):
    control = programs(arena=arena)
    _reuse_across_a_door_stream(control)
    assert_clean(control)

    def ignore_the_stream(self, block, stream=None):  # planted: the last user's stream forgotten
        block.release(block)

    monkeypatch.setattr(device_module.DeviceAllocator, "deallocate", ignore_the_stream)
    p = programs(arena=arena)
    assert _reuse_across_a_door_stream(p)
    assert any(v.kind == "unordered reuse" for v in p.model.violations), p.model.violations
    p.model.violations.clear()


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_record_stream_takes_a_cuda_core_buffer(programs, arena):
    # Issue 35, item 6: record_stream accepts a cuda.core Buffer (a non-owning one over a door's
    # block here: cuda.core's Buffer needs no GPU to name an address) and registers on the block.
    from cuda.core import Buffer

    p = programs(arena=arena)
    stream = p.create_stream(False)
    family = p.allocate_door(1000)
    p.mm.record_stream(Buffer.from_handle(family.address, family.size), p.stream_objects[stream])
    assert [wait.value for wait in family.refs[0].block.waits] == [stream]
    p.drop(family)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_deallocate_naming_another_threads_per_thread_stream_waits_for_it(programs, arena):
    # Thread 1's per-thread default stream used the block last; thread 0, the owner, deallocates it naming that
    # stream.  Both handles are CU_STREAM_PER_THREAD, yet they are two streams: the release cannot wait for the
    # other thread's from here, so it synchronizes (and says so) rather than free it under thread 1's kernel.
    import warnings

    from numba_pool.cuda.streams import as_stream_ref
    from cuda_model.checks import FALLBACK

    per_thread = int(real_cu.CU_STREAM_PER_THREAD)
    p = programs(arena=arena, threads=2)
    mine, theirs = p.run(0, as_stream_ref, per_thread), p.run(1, as_stream_ref, per_thread)
    block = p.run(0, _allocator(p).allocate, 1000, mine)
    p.run(1, p.model.launch, per_thread, [(block.address, 1000, "thread 1's kernel")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p.run(0, _allocator(p).deallocate, block, theirs)
    assert any(FALLBACK in str(w.message) for w in caught), [str(w.message) for w in caught]
    again = p.run(0, _allocator(p).allocate, 1000, mine)
    p.run(0, p.model.launch, per_thread, [(again.address, 1000, "thread 0's next kernel")])
    p.run(0, _allocator(p).deallocate, again, mine)
    assert_clean(p)
