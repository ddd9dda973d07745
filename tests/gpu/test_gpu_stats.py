"""Statistics on a real GPU: ``memory_summary()`` after some allocations (the test prints it: run
with ``-s`` to see it), ``used_bytes``/``reserved_bytes``, and scoped statistics
(``numba_pool.statistics()``) over Numba's own allocation calls, nested and in threads.

Run in both modes: ``pytest -m gpu -s tests/gpu/test_gpu_stats.py`` and with ``NUMBA_POOL_ARENA=1``.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from helpers import CUDA_IMPORT, GPU, cuda, run_json

pytestmark = pytest.mark.gpu

if GPU:
    import numba_pool
    from kernels import fill_kernel

    from gpu_helpers import THREADS, blocks

SUMMARY_SCRIPT = """
import json
import numpy as np
""" + CUDA_IMPORT + """
import numba_pool
from kernels import fill_kernel

small = [cuda.device_array(16 << 10, dtype=np.uint8) for _ in range(8)]   # 16 KiB each: the arena's when it is on
large = [cuda.device_array(8 << 20, dtype=np.uint8) for _ in range(2)]    # 8 MiB each: the mempool's
host = np.arange(1 << 18, dtype=np.float32)
d = cuda.to_device(host)                                                 # 1 MiB
fill_kernel[(1 << 18) // 256, 256](d, 2.5)
assert (d.copy_to_host() == 2.5).all()
del small[::2], large[0]                                                 # free 4 small and 1 large
cuda.synchronize()
print(numba_pool.memory_summary())
s = numba_pool.stats()
print(json.dumps({"stats": s.to_dict(), "used": numba_pool.used_bytes(), "reserved": numba_pool.reserved_bytes(),
                  "manager": type(cuda.current_context().memory_manager).__name__}))
"""


def test_memory_summary_after_some_allocations():
    facts = run_json(SUMMARY_SCRIPT, env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    assert facts["manager"] == "NumbaPoolManager"
    s = facts["stats"]
    live = 4 * (16 << 10) + (8 << 20) + (1 << 20)
    assert (s["current_bytes"], s["current_count"]) == (live, 6)
    assert (s["peak_bytes"], s["peak_count"]) == (8 * (16 << 10) + 2 * (8 << 20) + (1 << 20), 11)
    assert (s["total_count"], s["total_frees"]) == (11, 5)
    assert facts["used"] == live and facts["reserved"] == s["pool_reserved_bytes"] >= live
    assert s["pool_used_bytes"] >= (8 << 20) + (1 << 20)


def test_memory_summary_table_matches_stats(capsys):
    keep = [cuda.device_array(1 << 20, dtype=np.uint8), cuda.device_array(3000, dtype=np.uint8)]
    summary = numba_pool.memory_summary()
    s = numba_pool.stats()
    with capsys.disabled():
        print("\n" + summary)
    lines = summary.splitlines()
    assert lines[0].startswith("numba_pool memory summary: device 0, arena ")
    arena = s.arena_on
    assert ("arena on" in lines[0]) is arena and ("| arena slabs" in summary) is arena
    allocations = next(line for line in lines if line.startswith("| allocations "))
    assert [c.strip() for c in allocations.strip("|").split("|")][1:] == [
        str(s.blocks_in_use), str(s.peak_blocks_in_use), str(s.total_allocations)]
    assert f"({s.pool_reserved_bytes} bytes)" in summary and f"({s.bytes_in_use} bytes)" in summary
    del keep


def test_used_and_reserved_bytes_follow_allocations():
    gc.collect()
    cuda.synchronize()
    used = numba_pool.used_bytes()
    a = cuda.device_array(4 << 20, dtype=np.uint8)
    assert numba_pool.used_bytes() == used + (4 << 20)
    assert numba_pool.reserved_bytes() >= numba_pool.stats().pool_used_bytes >= 4 << 20
    del a
    assert numba_pool.used_bytes() == used


def test_scoped_statistics_count_numbas_allocations():
    mm = cuda.current_context().memory_manager
    before = cuda.device_array(1000, dtype=np.uint8)
    n = 100_000
    with numba_pool.statistics() as outer:
        assert mm.memalloc == mm.path.allocate and mm.path.layers[0] == "counting"
        a = cuda.device_array(n, dtype=np.float32)               # 400000 bytes
        fill_kernel[blocks(n), THREADS](a, np.float32(1.5))  # float32, as every GPU test passes it
        with numba_pool.statistics() as inner:
            b = cuda.to_device(np.ones(n, dtype=np.float64))    # 800000 bytes
            c = cuda.device_array_like(b)                        # 800000 bytes
            del before                                           # allocated outside: not counted
        del b
        gc.collect()  # the frees above happen by reference counting; this makes sure of it
        np.testing.assert_array_equal(a.copy_to_host(), np.full(n, 1.5, dtype=np.float32))
        figures = outer.to_dict()
    assert mm.memalloc == mm.allocator.source.allocate  # the block source itself again
    assert inner.to_dict() == {"current_bytes": 1_600_000, "current_count": 2, "peak_bytes": 1_600_000,
                               "peak_count": 2, "total_bytes": 1_600_000, "total_count": 2, "total_frees": 0}
    assert figures == {"current_bytes": 1_200_000, "current_count": 2, "peak_bytes": 2_000_000,
                       "peak_count": 3, "total_bytes": 2_000_000, "total_count": 3, "total_frees": 1}
    del a, c
    assert outer.current_bytes == 1_200_000  # frozen at exit


def test_scoped_statistics_are_per_thread_on_the_gpu():
    results, errors = {}, []
    start = threading.Barrier(3)

    def work(k):
        try:
            size = (k + 1) << 16
            if k == 2:  # no scope
                start.wait()
                arrays = [cuda.device_array(size + 1, dtype=np.uint8) for _ in range(20)]
                assert len(arrays) == 20  # all alive at once, then dropped
                return
            with numba_pool.statistics() as s:
                start.wait()
                for _ in range(20):
                    x = cuda.device_array(size, dtype=np.uint8)
                    del x
            results[k] = s.to_dict()
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in range(2):
        size = (k + 1) << 16
        assert results[k] == {"current_bytes": 0, "current_count": 0, "peak_bytes": size, "peak_count": 1,
                              "total_bytes": 20 * size, "total_count": 20, "total_frees": 20}


def test_profile_names_this_file():
    with numba_pool.statistics(profile=True) as s:
        a = cuda.device_array(1 << 16, dtype=np.uint8)
        b = cuda.device_array(1 << 10, dtype=np.uint8)
    report = s.report()
    print("\n" + report)
    assert "test_gpu_stats.py" in report.splitlines()[2] and f"({1 << 16} bytes)" in report.splitlines()[2]
    assert sum(count for count, _ in s.sites.values()) == 2
    del a, b
