"""The EMM plugin on a real GPU: kernels, pool use, stream safety, errors, reset, threads.

Run in both modes: ``pytest -m gpu`` and ``NUMBA_POOL_ARENA=1 pytest -m gpu``.
"""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest

from helpers import CUDA_IMPORT, FRONTEND, GPU, cuda, run_json, run_python

pytestmark = pytest.mark.gpu

if GPU:
    from cuda.bindings import driver as cu

    import numba_pool
    from kernels import fill_kernel, increment_kernel, sqrt_kernel
    from numba_pool.cuda.mempool import pointer_mempool

    from gpu_helpers import THREADS, blocks, cross_stream_experiment, non_blocking_stream

ARENA = os.environ.get("NUMBA_POOL_ARENA", "0") == "1"
# Sizes the arena serves (when on) and sizes that go straight to the mempool.
CROSS_STREAM_SIZES = [64 << 10, 4 << 20]


def manager():
    return cuda.current_context().memory_manager


@pytest.fixture
def eager_fences():
    """Fence at every allocation that finds a released legacy-stream block (rule 4), in both
    modes: a freed block is then reusable as soon as the host sees its fence complete, the case
    where the stream rule matters most.  (By default fences come once per 32 releases.)"""
    fences = manager().allocator.mempool_blocks.fences
    blocks, fences.fence_blocks = fences.fence_blocks, 1
    arena = manager().allocator.arena
    if arena is None:
        yield
        fences.fence_blocks = blocks
        return
    limit, arena.quarantine_limit = arena.quarantine_limit, -1
    cache_limit, arena.quarantine.cache_limit = arena.quarantine.cache_limit, 0
    arena.flush_cache()
    try:
        yield
    finally:
        arena.quarantine_limit, arena.quarantine.cache_limit = limit, cache_limit
        fences.fence_blocks = blocks


def settle():
    """Drop garbage from earlier tests and let every stream-ordered free complete."""
    gc.collect()
    cuda.synchronize()


def test_numba_uses_numba_pool():
    assert type(manager()).__name__ == "NumbaPoolManager"
    assert manager().config.arena is ARENA


@pytest.mark.parametrize("module", ["increment", "sqrt", "fill"])
def test_kernel_scripts_run_under_the_plugin(module):
    proc = run_python(f"import sys; from kernels.{module} import main; sys.exit(main(['--n', '100000', '--iterations', '5']))",
                      env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout and "NumbaPoolManager" in proc.stdout


@pytest.mark.parametrize("n", [1, 255, 4097, 1 << 20])
def test_kernels_compute_right_values_in_pool_memory(n):
    rng = np.random.default_rng(n)
    host = rng.random(n, dtype=np.float32)
    d = cuda.to_device(host)
    increment_kernel[blocks(n), THREADS](d)
    np.testing.assert_array_equal(d.copy_to_host(), host + np.float32(1))
    s = cuda.device_array(n, dtype=np.float32)
    s.copy_to_device(np.full(n, np.nan, dtype=np.float32))  # poison: every element must be written
    sqrt_kernel[blocks(n), THREADS](s)
    np.testing.assert_allclose(s.copy_to_host(), np.sqrt(np.arange(n, dtype=np.float64)), rtol=1e-6)
    f = cuda.device_array(n, dtype=np.float64)
    fill_kernel[blocks(n), THREADS](f, 2.5)
    assert (f.copy_to_host() == 2.5).all()


def test_memory_comes_from_our_pool_and_stats_move():
    settle()
    before = numba_pool.stats()
    a = cuda.device_array(1 << 22, dtype=np.uint8)  # 4 MiB: served by the mempool in both modes
    assert pointer_mempool(a.device_ctypes_pointer.value) == int(manager().allocator.pool.handle)
    during = numba_pool.stats()
    assert during.total_allocations == before.total_allocations + 1
    assert during.bytes_in_use == before.bytes_in_use + (1 << 22)
    assert during.blocks_in_use == before.blocks_in_use + 1
    assert during.pool_used_bytes >= before.pool_used_bytes + (1 << 22)
    assert during.peak_bytes_in_use >= during.bytes_in_use
    del a
    settle()
    after = numba_pool.stats()
    assert after.bytes_in_use == before.bytes_in_use and after.total_frees == before.total_frees + 1


@pytest.mark.parametrize("nbytes", [256, 64 << 10, 4 << 20])
def test_freed_block_is_reused_without_growing_the_pool(nbytes):
    settle()
    a = cuda.device_array(nbytes, dtype=np.uint8)
    address = a.device_ctypes_pointer.value
    del a
    reserved = numba_pool.stats().pool_reserved_bytes
    addresses = set()
    for _ in range(300):  # past the arena's quarantine limit (256 blocks), so it fences and reuses
        b = cuda.device_array(nbytes, dtype=np.uint8)
        addresses.add(b.device_ctypes_pointer.value)
        del b
    # Rule 4: blocks come back once a fence (one per 32 releases) completes.  The arena hands
    # its own blocks out again; in mempool mode the driver's pool picks the address.
    assert len(addresses) <= 4 * 32, len(addresses)
    if manager().allocator.arena is not None and nbytes <= manager().config.arena_max_block:
        assert address in addresses
    # The pool grows by at most the blocks that wait for fences (32 a batch): no more than that.
    assert numba_pool.stats().pool_reserved_bytes <= reserved + 3 * 32 * max(nbytes, 2 << 20)


@pytest.mark.parametrize("nbytes", CROSS_STREAM_SIZES)
def test_cross_stream_reuse_on_numba_streams_is_safe(nbytes, eager_fences):
    """The reader on s1 never sees the fill on s2 of the block it was reading: the block, freed
    while the reader runs, is fenced by the next allocation but handed out only once the host
    has seen that fence complete (rule 4), so never to the fill that the same trial makes."""
    s1, s2 = cuda.stream(), cuda.stream()
    reused, corrupted = cross_stream_experiment(nbytes, s1, s2)
    print(f"\n{nbytes} bytes, Numba streams: reused {reused}/20, corrupted elements {corrupted}")
    assert corrupted == 0
    assert reused == 0


@pytest.mark.parametrize("nbytes", CROSS_STREAM_SIZES)
def test_check_detects_corruption_when_nothing_orders_the_reader(nbytes, eager_fences):
    """Control: a reader on a non-blocking stream that nobody waits for does see the fill of
    its reused block.  Proves the check above would catch a broken rule."""
    # A is allocated on s2 (using_stream) and read on s1 with nothing recorded (illegal, as
    # intended): its release frees it on s2 at once, and the fill on s2 reuses it.
    with non_blocking_stream() as s1, non_blocking_stream() as s2:
        reused, corrupted = cross_stream_experiment(nbytes, s1, s2, fill_in_scope=True, a_in_fill_scope=True)
    print(f"\n{nbytes} bytes, unordered control: reused {reused}/20, corrupted elements {corrupted}")
    assert reused > 0 and corrupted > 0


@pytest.mark.parametrize("nbytes", CROSS_STREAM_SIZES)
def test_record_stream_orders_reuse_after_the_reader(nbytes, eager_fences):
    with non_blocking_stream() as s1, non_blocking_stream() as s2:
        reused, corrupted = cross_stream_experiment(nbytes, s1, s2, fill_in_scope=True, record=True)
    print(f"\n{nbytes} bytes, record_stream: reused {reused}/20, corrupted elements {corrupted}")
    assert corrupted == 0


@pytest.mark.parametrize("nbytes", CROSS_STREAM_SIZES)
def test_using_stream_reuses_at_once_on_the_same_stream(nbytes, eager_fences):
    with non_blocking_stream() as s:
        reused, corrupted = cross_stream_experiment(nbytes, s, s, fill_in_scope=True, read_in_scope=True)
    print(f"\n{nbytes} bytes, one non-blocking stream: reused {reused}/20, corrupted elements {corrupted}")
    assert corrupted == 0 and reused >= 10


def test_using_stream_with_numba_and_non_blocking_streams():
    n = 10_000
    with non_blocking_stream() as nb:
        for stream in (cuda.stream(), nb, cuda.default_stream()):
            with numba_pool.using_stream(stream):
                a = cuda.device_array(n, dtype=np.float32)
            fill_kernel[blocks(n), THREADS, stream](a, np.float32(3))
            out = a.copy_to_host(stream=stream)
            stream.synchronize()
            assert (out == 3).all()
            del a


def test_record_stream_on_foreign_memory_does_nothing():
    # Issue 35, item 6: a program written for numba_pool runs unchanged where the memory is not
    # numba_pool's (a mapped array of Numba's own with NUMBA_POOL_HOST=0, the default).
    settle()
    a = cuda.device_array(16)
    view = a[4:]
    assert numba_pool.record_stream(view, cuda.stream()) is True  # a view inside our block
    assert numba_pool.record_stream(cuda.mapped_array(16), cuda.stream()) is False


def test_out_of_memory_names_the_numbers_and_the_pool_keeps_working():
    settle()
    before = numba_pool.stats()
    _, total = cuda.current_context().get_memory_info()
    huge = 4 * total
    with pytest.raises(FRONTEND.CudaAPIError) as err:
        cuda.device_array(huge, dtype=np.uint8)
    assert err.value.code == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    message = str(err.value)
    assert f"({huge} bytes)" in message and "reserves" in message and "free of" in message
    after = numba_pool.stats()
    assert after.oom_retries == before.oom_retries + 1 and after.oom_errors == before.oom_errors + 1
    a = cuda.to_device(np.arange(1000, dtype=np.float32))
    increment_kernel[blocks(1000), THREADS](a)
    assert (a.copy_to_host() == np.arange(1000) + 1).all()
    del a
    settle()
    assert numba_pool.stats().bytes_in_use == before.bytes_in_use


@pytest.mark.parametrize("arena, nbytes", [("0", 16 << 20), ("1", 64 << 10)])
def test_max_size_caps_the_pool_and_it_recovers(arena, nbytes):
    facts = run_json(f"""
import json, numpy as np
{CUDA_IMPORT}
from numba_pool.cuda.frontend import for_tools; CudaAPIError = for_tools().CudaAPIError
import numba_pool
numba_pool.install(max_size="64 MiB")
arrays, message = [], None
try:
    for _ in range(5000):
        arrays.append(cuda.device_array({nbytes}, dtype=np.uint8))
except CudaAPIError as e:
    message = str(e)
held = len(arrays) * {nbytes}
arrays.clear()
numba_pool.trim()
after = numba_pool.stats()
again = cuda.device_array(32 << 20, dtype=np.uint8)
print(json.dumps({{"held": held, "message": message, "used_after": after.pool_used_bytes,
                  "in_use_after": after.bytes_in_use, "again": again.size, "retries": after.oom_retries}}))
""", env={"NUMBA_POOL_ARENA": arena})
    assert 16 << 20 <= facts["held"] <= 64 << 20
    assert "capped at 64 MiB" in facts["message"] and facts["retries"] >= 1
    if arena == "1":
        assert "arena slabs" in facts["message"]
    assert facts["used_after"] == 0 and facts["in_use_after"] == 0 and facts["again"] == 32 << 20


def test_default_pool_and_initial_size_options():
    facts = run_json(f"""
import json, numpy as np
from cuda.bindings import driver as cu
{CUDA_IMPORT}
import numba_pool
from numba_pool.cuda.mempool import pointer_mempool
numba_pool.install(use_default_pool=True, initial_size="256 MiB")
a = cuda.device_array(1024, dtype=np.uint8)
err, default_pool = cu.cuDeviceGetDefaultMemPool(cu.CUdevice(0))
s = numba_pool.stats()
print(json.dumps({{"same": pointer_mempool(a.device_ctypes_pointer.value) == int(default_pool),
                  "reserved": s.pool_reserved_bytes}}))
""", env={"NUMBA_POOL_ARENA": "0"})
    assert facts["same"] and facts["reserved"] >= 256 << 20


def test_bad_environment_fails_at_first_context_with_the_variable_named():
    proc = run_python(CUDA_IMPORT + "; cuda.device_array(4)",
                      env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_POOL_MAX_SIZE": "huge"})
    assert proc.returncode != 0 and "NUMBA_POOL_MAX_SIZE='huge'" in proc.stderr


def test_reset_frees_everything_and_late_finalizers_stay_quiet():
    facts = run_json(f"""
import json, sys, gc, numpy as np
{CUDA_IMPORT}
import numba_pool
numba_pool.install()
problems = []
sys.unraisablehook = lambda u: problems.append(repr(u.exc_value))
mm = cuda.current_context().memory_manager
fresh = type(mm)(context=cuda.current_context())
fresh.reset()  # before initialize: nothing to do, no error
survivors = [cuda.device_array(1 << 20) for _ in range(3)]
mm.reset(); mm.reset()
after_reset = numba_pool.stats()
b = cuda.device_array(1 << 20)  # the pool comes back
del survivors; gc.collect()  # finalizers of arrays that outlived the reset
del b; gc.collect(); cuda.synchronize()
final = numba_pool.stats()
print(json.dumps({{"problems": problems, "in_use_after_reset": after_reset.bytes_in_use,
                  "used_after_reset": after_reset.pool_used_bytes, "final_in_use": final.bytes_in_use,
                  "final_used": final.pool_used_bytes, "final_released": final.pool_released_bytes}}))
""")
    assert facts["problems"] == []
    assert facts["in_use_after_reset"] == 0 and facts["used_after_reset"] == 0
    assert facts["final_in_use"] == 0 and facts["final_used"] == facts["final_released"]  # rule 4: b waits for its fence


@pytest.mark.parametrize("nbytes", [256, 4 << 20])
def test_free_releases_at_once_and_only_once(nbytes):
    # Numba's MemoryPointer.free(): our pointers release from __del__, and free() must too.
    settle()
    before = numba_pool.stats()
    a = cuda.device_array(nbytes, dtype=np.uint8)
    a.gpu_data.free()
    freed = numba_pool.stats()
    assert freed.total_frees == before.total_frees + 1 and freed.bytes_in_use == before.bytes_in_use
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        a.gpu_data.free()
    del a
    settle()
    after = numba_pool.stats()
    assert after.total_frees == freed.total_frees and after.blocks_in_use == before.blocks_in_use
    # Rule 4: the block waits for its fence, counted in pool_released_bytes until then.
    assert after.pool_used_bytes - after.pool_released_bytes == before.pool_used_bytes - before.pool_released_bytes


def test_arrays_alive_at_exit_end_quietly():
    # Arrays still referenced when the interpreter exits are collected during its teardown;
    # their release must neither run there nor print anything.
    proc = run_python(f"""
import numpy as np
{CUDA_IMPORT}
import numba_pool
numba_pool.install()
small = [cuda.device_array(64, dtype=np.float32) for _ in range(100)]
large = cuda.device_array(1 << 20, dtype=np.float32)
with numba_pool.using_stream(cuda.stream()):
    scoped = cuda.device_array(64, dtype=np.float32)
cuda.synchronize()
print("done")
""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "done"
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_initialize_is_idempotent():
    mm = manager()
    allocator = mm.allocator
    mm.initialize()
    mm.initialize()
    assert mm.allocator is allocator


def test_defer_cleanup_holds_frees_until_exit():
    settle()
    base = numba_pool.stats()
    base = base.pool_used_bytes - base.pool_released_bytes
    with cuda.defer_cleanup():
        a = cuda.device_array(8 << 20, dtype=np.uint8)
        del a
        cuda.synchronize()
        held = numba_pool.stats()
    cuda.synchronize()
    released = numba_pool.stats()
    assert held.pool_used_bytes - held.pool_released_bytes >= base + (8 << 20)
    assert released.pool_used_bytes - released.pool_released_bytes == base  # released at the exit: waits for its fence


def test_get_memory_info_counts_cached_pool_memory_as_free():
    settle()
    a = cuda.device_array(64 << 20, dtype=np.uint8)
    del a
    cuda.synchronize()
    free, total = cuda.current_context().get_memory_info()
    device_free, device_total = cu.cuMemGetInfo()[1:]
    assert total == device_total
    assert device_free + (64 << 20) <= free <= total


def test_ipc_of_memory_not_from_the_pool_names_the_address():
    a = cuda.device_array(16)
    stranger = FRONTEND.MemoryPointer(cuda.current_context(), a.gpu_data.device_pointer_value + (1 << 40), 16)
    with pytest.raises(ValueError, match=r"address 0x[0-9a-f]+ is not in a live allocation of numba_pool"):
        cuda.current_context().memory_manager.get_ipc_handle(stranger)


def test_trim_releases_cached_memory():
    settle()
    a = cuda.device_array(128 << 20, dtype=np.uint8)
    del a
    numba_pool.trim()
    s = numba_pool.stats()
    assert s.pool_reserved_bytes - s.pool_used_bytes < (128 << 20)


def test_reset_peak():
    settle()
    a = cuda.device_array(32 << 20, dtype=np.uint8)
    del a
    settle()
    numba_pool.reset_peak()
    s = numba_pool.stats()
    assert s.peak_bytes_in_use == s.bytes_in_use
    assert s.pool_used_high == s.pool_used_bytes


def test_threads_get_disjoint_memory():
    """8 host threads allocate, fill with their id, check and free, concurrently."""
    settle()
    before = numba_pool.stats()
    errors, barrier = [], threading.Barrier(8)
    live, live_lock = {}, threading.Lock()  # address -> (end, thread) of arrays alive now

    def claim(a, tid):
        start = a.device_ctypes_pointer.value
        end = start + a.nbytes
        with live_lock:
            for other, (other_end, owner) in live.items():
                if start < other_end and other < end:
                    errors.append(f"thread {tid} got [{start:#x}, {end:#x}) overlapping thread {owner}'s")
            live[start] = (end, tid)
        return start

    def unclaim(start):
        with live_lock:
            del live[start]

    def work(tid):
        try:
            stream = cuda.stream()
            barrier.wait()
            for round_ in range(40):
                n = 1000 + 37 * ((tid + round_) % 9)
                arrays = [cuda.device_array(n, dtype=np.int32) for _ in range(3)]
                claims = [claim(a, tid) for a in arrays]
                for a in arrays:
                    fill_kernel[blocks(n), THREADS, stream](a, tid)
                stream.synchronize()
                for a in arrays:
                    out = a.copy_to_host()
                    if not (out == tid).all():
                        errors.append(f"thread {tid} round {round_}: saw {set(np.unique(out)) - {tid}}")
                for start in claims:
                    unclaim(start)
                del arrays
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {tid}: {e!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    settle()
    after = numba_pool.stats()
    assert errors == []
    assert after.total_allocations - before.total_allocations == 8 * 40 * 3
    assert after.bytes_in_use == before.bytes_in_use and after.blocks_in_use == before.blocks_in_use


def test_a_typo_warning_at_numbas_first_allocation_points_at_the_users_line():
    """Numba makes the plugin when it creates the context, many frames below the user's first
    CUDA call: the typo warning points at that call, not at numba_pool or Numba."""
    code = f"""
import json, warnings
import numpy as np
{CUDA_IMPORT}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    d = cuda.to_device(np.ones(10))
print(json.dumps([(w.category.__name__, w.filename, w.lineno) for w in caught if "numba_pool" in str(w.message)]))
"""
    typo = "NUMBA_POOL_" + "AREN"  # in two parts: the repository's scan of used variables skips it
    out = run_json(code, {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", typo: "1"})
    assert out == [["ConfigWarning", "<string>", 7]], out
