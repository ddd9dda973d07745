"""Arena, scratch pool and allocation log on a real GPU."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from helpers import CUDA_IMPORT, GPU, cuda, run_json

pytestmark = pytest.mark.gpu

if GPU:
    import numba_pool
    from kernels import fill_kernel
    from numba_pool.cuda.mempool import pointer_mempool

    from gpu_helpers import THREADS, blocks

ARENA = os.environ.get("NUMBA_POOL_ARENA", "0") == "1"
needs_arena = pytest.mark.skipif(not ARENA, reason="arena mode only (NUMBA_POOL_ARENA=1)")


def manager():
    return cuda.current_context().memory_manager


@needs_arena
def test_small_requests_come_from_arena_slabs_large_ones_from_the_pool():
    gc.collect()
    before = numba_pool.stats()
    small = cuda.device_array(1000, dtype=np.uint8)
    large = cuda.device_array(4 << 20, dtype=np.uint8)
    address = small.device_ctypes_pointer.value
    arena = manager().allocator.arena
    assert arena.block_size(address) == 1024
    assert arena.block_size(large.device_ctypes_pointer.value) is None
    assert pointer_mempool(address) == int(manager().allocator.pool.handle)  # slabs come from our mempool
    during = numba_pool.stats()
    assert during.arena_in_use_bytes == before.arena_in_use_bytes + 1024
    assert during.bytes_in_use == before.bytes_in_use + 1000 + (4 << 20)
    assert during.arena_reserved_bytes >= during.arena_in_use_bytes > 0


@needs_arena
def test_arena_blocks_are_aligned_and_hold_their_values():
    sizes = [1, 3, 255, 256, 257, 1000, 4096, 65_536, 100_000, 1 << 20]
    arrays = [cuda.device_array(max(1, n // 4), dtype=np.float32) for n in sizes]
    for k, a in enumerate(arrays):
        assert a.device_ctypes_pointer.value % 256 == 0
        fill_kernel[blocks(a.size), THREADS](a, np.float32(k))
    for k, a in enumerate(arrays):
        assert (a.copy_to_host() == k).all()


@needs_arena
def test_arena_trim_returns_empty_slabs():
    arrays = [cuda.device_array(100_000, dtype=np.uint8) for _ in range(200)]
    del arrays
    gc.collect()
    numba_pool.trim()
    s = numba_pool.stats()
    assert s.arena_reserved_bytes == manager().allocator.arena.statistics().reserved
    assert s.arena_in_use_bytes == 0 or s.arena_reserved_bytes < (20 << 20)


def test_scratch_bump_allocates_and_outliving_arrays_stay_valid():
    gc.collect()
    cuda.synchronize()
    base = numba_pool.stats()
    with numba_pool.scratch(1 << 20) as block:
        a = cuda.device_array(100, dtype=np.float32)  # 400 B -> 512
        b = cuda.device_array(1000, dtype=np.float32)
        too_big = cuda.device_array(1 << 20, dtype=np.uint8)  # more than is left: normal path
        assert b.device_ctypes_pointer.value == a.device_ctypes_pointer.value + 512
        assert a.device_ctypes_pointer.value == block.base
        assert not block.base <= too_big.device_ctypes_pointer.value < block.base + block.size
        fill_kernel[blocks(100), THREADS](a, np.float32(1))
        fill_kernel[blocks(1000), THREADS](b, np.float32(2))
    del too_big
    assert (a.copy_to_host() == 1).all() and (b.copy_to_host() == 2).all()
    mid = numba_pool.stats()
    assert mid.blocks_in_use == base.blocks_in_use + 1  # the scratch block is still held by a and b
    fill_kernel[blocks(1000), THREADS](b, np.float32(3))  # b outlived the scope: still valid
    assert (b.copy_to_host() == 3).all()
    del a, b
    gc.collect()
    cuda.synchronize()
    after = numba_pool.stats()
    assert after.blocks_in_use == base.blocks_in_use and after.bytes_in_use == base.bytes_in_use


def test_scratch_rejects_bad_sizes():
    with pytest.raises(ValueError, match="positive number of bytes"):
        with numba_pool.scratch(0):
            pass


def test_allocation_log_records_every_allocate_and_free(tmp_path):
    path = tmp_path / "log.csv"
    facts = run_json(f"""
import json, numpy as np
{CUDA_IMPORT}
import numba_pool
arrays = [cuda.device_array(n, dtype=np.uint8) for n in (16, 1000, 70000, 5 << 20)]
addresses = [a.device_ctypes_pointer.value for a in arrays]
del arrays
try:
    cuda.device_array(1 << 50, dtype=np.uint8)
except Exception:
    pass
cuda.current_context().memory_manager.reset()  # flushes the log
print(json.dumps({{"addresses": addresses}}))
""", env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_POOL_LOG": str(path)})
    from numba_pool_tools.replay import parse_log

    parsed = parse_log(open(path))
    allocations = [op for op in parsed.operations if op.action == "allocate"]
    frees = [op for op in parsed.operations if op.action == "free"]
    assert [op.pointer for op in allocations] == facts["addresses"]
    assert [op.size for op in allocations] == [16, 1000, 70000, 5 << 20]
    assert sorted(op.pointer for op in frees) == sorted(facts["addresses"])
    assert parsed.failures == 1 and all(op.stream == 1 for op in parsed.operations)
