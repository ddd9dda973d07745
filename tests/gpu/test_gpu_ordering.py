"""Stream ordering on a real GPU, in both modes: kernels that would see corruption if a block
were handed to work that can run before its previous owner's last use had finished.

Run in both modes: ``pytest -m gpu`` and ``NUMBA_POOL_ARENA=1 pytest -m gpu``.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from helpers import CUDA_IMPORT, GPU, cuda, run_json

pytestmark = pytest.mark.gpu

if GPU:
    import numba_pool
    from kernels import fill_kernel

    from gpu_helpers import THREADS, blocks, non_blocking_stream

    @cuda.jit
    def count_not_equal_after_delay(a, value, delay_us, hits):
        """Sleep, then count the elements of ``a`` that are not ``value``: another owner's
        writes, if the block was handed over too early."""
        for _ in range(delay_us):
            cuda.nanosleep(1000)
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, a.size, stride):
            if a[i] != value:
                cuda.atomic.add(hits, 0, 1)


def _alternate(streams, nbytes, rounds, delay_us=20):
    """Allocate on each stream in turn (``None``: the legacy stream, no scope), fill on it and
    check on it after a delay, then drop: returns (reuses, corrupted elements)."""
    n = nbytes // 4
    hits = cuda.to_device(np.zeros(1, dtype=np.int64))
    seen: dict = {}
    reuses = 0
    for i in range(rounds):
        stream = streams[i % len(streams)]
        kernel_stream = stream if stream is not None else cuda.default_stream()
        scope = numba_pool.using_stream(stream) if stream is not None else _nothing()
        with scope:
            a = cuda.device_array(n, dtype=np.float32)
        address = a.device_ctypes_pointer.value
        reuses += address in seen
        seen[address] = i
        fill_kernel[blocks(n), THREADS, kernel_stream](a, np.float32(i))
        count_not_equal_after_delay[16, THREADS, kernel_stream](a, np.float32(i), delay_us, hits)
        del a
    cuda.synchronize()
    return reuses, int(hits.copy_to_host()[0])


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("nbytes", [4 << 10, 1 << 20])
@pytest.mark.parametrize("count", [2, 3])
def test_alternating_non_blocking_streams_and_legacy_never_corrupt(count, nbytes):
    with non_blocking_stream() as s1, non_blocking_stream() as s2, non_blocking_stream() as s3:
        streams = [s1, s2, s3][:count] + [None]
        reuses, corrupted = _alternate(streams, nbytes, 1000)
    print(f"\n{count} non-blocking streams + legacy, {nbytes} bytes, 1000 allocations: "
          f"reuses {reuses}, corrupted elements {corrupted}")
    assert reuses > 0 and corrupted == 0


def test_three_allocations_on_two_streams_then_every_later_allocation_works():
    a = cuda.device_array(250, np.float32)
    with numba_pool.using_stream(cuda.stream()):
        b = cuda.device_array(250, np.float32)
    c = cuda.device_array(250, np.float32)
    for _ in range(200):  # every later miss too
        d = cuda.device_array(250, np.float32)
        del d
    fill_kernel[blocks(250), THREADS](c, np.float32(5))
    assert (c.copy_to_host() == 5).all()
    del a, b


def test_cycles_collected_while_allocating_on_three_streams():
    """Arrays in reference cycles, freed by the collector at whatever allocation it runs in,
    while the program allocates on three non-blocking streams: no error, no corruption."""
    threshold = gc.get_threshold()
    problems = []
    import sys
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: problems.append(repr(u.exc_value))
    gc.set_threshold(60)
    try:
        with non_blocking_stream() as s1, non_blocking_stream() as s2, non_blocking_stream() as s3:
            hits = cuda.to_device(np.zeros(1, dtype=np.int64))
            for i in range(1500):
                stream = (s1, s2, s3)[i % 3]
                with numba_pool.using_stream(stream):
                    a = cuda.device_array(64 + 64 * (i % 7), dtype=np.float32)
                fill_kernel[blocks(a.size), THREADS, stream](a, np.float32(i))
                count_not_equal_after_delay[4, THREADS, stream](a, np.float32(i), 5, hits)
                holder = {"array": a}
                holder["self"] = holder  # a cycle: only the collector frees it
                del a, holder
            cuda.synchronize()
            corrupted = int(hits.copy_to_host()[0])
            gc.collect()  # before the streams go: a stream must outlive the arrays allocated on it
    finally:
        gc.set_threshold(*threshold)
        sys.unraisablehook = hook
    print(f"\ncycles on three streams: corrupted elements {corrupted}, errors {problems}")
    assert problems == [] and corrupted == 0


def test_reset_then_a_small_allocation_works():
    facts = run_json(f"""
import json, numpy as np
{CUDA_IMPORT}
import numba_pool
numba_pool.install()
a = cuda.device_array(100, dtype=np.float32)
cuda.current_context().memory_manager.reset()
b = cuda.device_array(100, dtype=np.float32)  # small: the arena's path in arena mode
b.copy_to_device(np.arange(100, dtype=np.float32))
print(json.dumps({{"ok": bool((b.copy_to_host() == np.arange(100)).all())}}))
""")
    assert facts["ok"]


def test_logs_of_free_reuse_scratch_and_threads_replay(tmp_path):
    from numba_pool_tools.replay import parse_log, replay

    path = tmp_path / "log.csv"
    facts = run_json(f"""
import json, threading, traceback, numpy as np
{CUDA_IMPORT}
import numba_pool
errors = []
def work():
  try:
    for i in range(300):
        a = cuda.device_array(100 + i % 50, dtype=np.float32)
        a.gpu_data.free()  # released now: the next allocation may reuse the block at once
        b = cuda.device_array(100 + i % 50, dtype=np.float32)
        with numba_pool.scratch(1 << 16):
            c = [cuda.device_array(n, dtype=np.uint8) for n in (10, 3000, 70000)]
        del b, c
  except Exception:
    errors.append(traceback.format_exc())
cuda.current_context()  # initialize CUDA before the threads: Numba's first initialization is not thread-safe
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
cuda.current_context().memory_manager.reset()
print(json.dumps({{"errors": errors}}))
""", env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_POOL_LOG": str(path)})
    assert facts["errors"] == []
    parsed = parse_log(open(path, newline=""), source=str(path))
    report = replay(parsed, slab_size=4 << 20, max_block=64 << 10)
    print(f"\nlog: {report.operations} operations replayed, {report.fragmentation:.4f}")
    assert report.operations == 4 * 300 * 5 * 2  # every allocation and its free


def test_a_blocking_stream_destroyed_before_the_fence_still_orders_the_reuse():
    """A default-stream array used on a blocking stream and dropped waits for a legacy-stream fence
    (rule 4); the stream is destroyed before that fence is recorded.  The driver orders the fence
    after the destroyed stream's remaining work (measured: docs/perf-notes.md, "A destroyed stream
    and the legacy stream"), so the block is reused only once the reader is done, even by a
    non-blocking stream's fill: the reader sees no poison.  Planted (the fence taken as complete at
    once, ``PLANT_FENCE_DONE=1``): the reader sees the fill's poison."""
    import os
    from cuda.bindings import driver as cu

    from gpu_helpers import POISON, read_after_delay

    n = (16 << 20) // 4  # above the arena's largest block: the mempool's legacy path in both modes
    fences = cuda.current_context().memory_manager.allocator.mempool_blocks.fences
    saved = fences.fence_blocks, fences._query
    if os.environ.get("PLANT_FENCE_DONE") == "1":
        fences._query = lambda event: (cu.CUresult.CUDA_SUCCESS,)
    hits = cuda.to_device(np.zeros(1, dtype=np.int64))
    reused = 0
    try:
        with non_blocking_stream() as filler:
            for _ in range(6):
                handle = cu.cuStreamCreate(0)[1]  # blocking: ordered with the legacy stream
                fences.fence_blocks = 1 << 20  # the drop's fence waits until after the destroy
                a = cuda.device_array(n, dtype=np.float32)
                fill_kernel[blocks(n), THREADS](a, np.float32(1.0))
                cuda.synchronize()
                read_after_delay[32, THREADS, cuda.external_stream(int(handle))](a, POISON, 200_000, hits)
                address = a.device_ctypes_pointer.value
                del a  # no gc.collect(): with Numba's heap it may outlast the reader's delay
                assert cu.cuStreamDestroy(handle)[0] == cu.CUresult.CUDA_SUCCESS
                fences.fence_blocks = 1
                b = cuda.device_array(n // 2, dtype=np.float32)  # records the fence, after the destroy
                c = cuda.device_array(n, dtype=np.float32)  # A's block once the fence completed
                reused += c.device_ctypes_pointer.value == address
                fill_kernel[blocks(n), THREADS, filler](c, POISON)
                cuda.synchronize()
                del b, c
    finally:
        fences.fence_blocks, fences._query = saved
    assert int(hits.copy_to_host()[0]) == 0, f"reused {reused} of 6 times while the reader ran"


def test_a_destroyed_streams_idle_block_never_goes_to_a_stream_given_its_handle():
    """A block released on a non-blocking stream stays idle for that stream (rule 7a), kept by the driver's stream
    id.  The stream is destroyed while a reader of the block still runs, and a new stream (often given the same
    handle) allocates the size and fills it with poison: it must get other memory, so the reader sees no poison.
    Planted (the idle blocks taken by size whatever the stream, ``PLANT_IDLE_ANY_STREAM=1``): the reader sees the
    fill's poison."""
    import os
    from cuda.bindings import driver as cu

    from gpu_helpers import POISON, read_after_delay
    from helpers import AnyStreamsIdleBlocks

    n = (16 << 20) // 4  # above the arena's largest block: the mempool's blocks in both modes
    idle = cuda.current_context().memory_manager.allocator.mempool_blocks.stream_idle
    if os.environ.get("PLANT_IDLE_ANY_STREAM") == "1":
        idle.lists = AnyStreamsIdleBlocks(idle.lists)
    hits = cuda.to_device(np.zeros(1, dtype=np.int64))
    same_handle = reused = 0
    try:
        for _ in range(6):
            first = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
            with numba_pool.using_stream(cuda.external_stream(int(first))):
                a = cuda.device_array(n, dtype=np.float32)
            fill_kernel[blocks(n), THREADS, cuda.external_stream(int(first))](a, np.float32(1.0))
            read_after_delay[32, THREADS, cuda.external_stream(int(first))](a, POISON, 200_000, hits)
            address = a.device_ctypes_pointer.value
            del a
            gc.collect()
            assert cu.cuStreamDestroy(first)[0] == cu.CUresult.CUDA_SUCCESS
            second = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
            same_handle += int(second) == int(first)
            with numba_pool.using_stream(cuda.external_stream(int(second))):
                c = cuda.device_array(n, dtype=np.float32)
            reused += c.device_ctypes_pointer.value == address
            fill_kernel[blocks(n), THREADS, cuda.external_stream(int(second))](c, POISON)
            cuda.synchronize()
            del c
            gc.collect()
            cu.cuStreamDestroy(second)
    finally:
        if type(idle.lists) is AnyStreamsIdleBlocks:
            idle.lists = dict(idle.lists)
    print(f"\nstream handles reused {same_handle} of 6 times, blocks {reused} of 6")
    assert int(hits.copy_to_host()[0]) == 0, f"reused {reused} of 6 times while the reader ran"


def test_a_streams_released_block_comes_back_to_it_without_the_pool():
    """Rule 7a on the GPU: a block released on a non-blocking stream waits in that stream's idle list (not in the
    pool) and is its next allocation of the size there; a kernel still reading it when it is handed out again sees
    no other owner's writes."""
    n = (16 << 20) // 4
    hits = cuda.to_device(np.zeros(1, dtype=np.int64))
    with non_blocking_stream() as stream, numba_pool.using_stream(stream):
        addresses = set()
        for i in range(8):
            a = cuda.device_array(n, dtype=np.float32)
            addresses.add(a.device_ctypes_pointer.value)
            fill_kernel[blocks(n), THREADS, stream](a, np.float32(i))
            count_not_equal_after_delay[16, THREADS, stream](a, np.float32(i), 20, hits)
            del a
            gc.collect()  # a Numba array may sit in a cycle: released now, before the next allocation
        stream.synchronize()
    idle = cuda.current_context().memory_manager.allocator.mempool_blocks.stream_idle
    assert len(addresses) == 1, addresses
    assert addresses.pop() in {int(block.ptr) for kept in idle.lists.values() for block in kept}
    assert int(hits.copy_to_host()[0]) == 0
