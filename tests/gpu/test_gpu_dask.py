"""numba_pool on a dask-cuda cluster, one worker per GPU: Numba kernels in ``client.map`` are
served by numba_pool on every worker, device arrays and managed arrays, as its per-worker
statistics show.

Needs two GPUs or more and dask-cuda.  Run with ``pytest -s tests/gpu/test_gpu_dask.py`` to see
the statistics of each worker; ``NUMBA_POOL_ARENA=1`` runs it with the arena (the workers
inherit the environment).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import pytest

from helpers import GPU, cuda

pytestmark = pytest.mark.gpu

N_ELEMENTS = 1 << 16
TASKS_PER_WORKER = 8


def _gpu_count() -> int:
    if not GPU:
        return 0
    return len(cuda.gpus)  # creates no context


def allocate_and_checksum(seed: int) -> dict:
    """On a worker: to_device, device_array, a kernel, copy back; the checksum and which
    manager served the arrays.  Runs under the frontend under test: the workers inherit
    ``NUMBA_POOL_FRONTEND``."""
    from numba_pool.cuda.frontend import for_tools
    from kernels import fill_kernel

    cuda = for_tools().cuda

    n = N_ELEMENTS
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    y = cuda.device_array(n, dtype=np.float32)
    fill_kernel[(n + 255) // 256, 256](y, np.float32(seed))
    total = float(y.copy_to_host().sum()) + float(x.copy_to_host().sum())
    context = cuda.current_context()
    return {"checksum": total, "manager": type(context.memory_manager).__name__,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "pid": os.getpid()}


def allocate_managed(seed: int) -> dict:
    """On a worker: a managed array (``cuda.managed_array``) that a kernel fills and the host
    reads; whether numba_pool's managed cache served it, and the worker's manager's word on it
    (its managed cache, or why there is none: ``NUMBA_POOL_MANAGED`` off, or no concurrent
    managed access)."""
    from numba_pool.cuda import driver
    from numba_pool.cuda.frontend import for_tools
    from numba_pool.cuda.mempool import concurrent_managed_access
    from numba_pool.cuda.pointers import PooledManagedMemory
    from kernels import fill_kernel

    cuda = for_tools().cuda

    a = cuda.managed_array(N_ELEMENTS, dtype=np.float32)
    fill_kernel[(N_ELEMENTS + 255) // 256, 256](a, np.float32(seed))
    cuda.synchronize()
    context = cuda.current_context()
    mm = context.memory_manager
    return {"checksum": float(np.asarray(a).sum()), "ours": isinstance(a.gpu_data, PooledManagedMemory),
            "managed cache": mm.managed is not None, "why not": mm.managed_off_because,
            "concurrent access": concurrent_managed_access(driver.cu, context.device.id)}


def expected_checksum(seed: int) -> float:
    return float(seed) * N_ELEMENTS + float(np.arange(N_ELEMENTS, dtype=np.float32).sum())


@pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 GPUs or more")
def test_local_cuda_cluster_workers_allocate_through_numba_pool():
    dask_cuda = pytest.importorskip("dask_cuda")
    import cloudpickle
    from distributed import Client

    import numba_pool
    import numba_pool.integrations.dask as npd

    # The workers need not import this test module: send its functions by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with dask_cuda.LocalCUDACluster(threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == _gpu_count()
        responses = client.register_plugin(npd.NumbaPoolPlugin())  # options: the workers' NUMBA_POOL_*
        managed_on = numba_pool.config.load().managed  # the same environment's
        assert list(responses.values()) == [{"status": "OK"}] * len(workers), responses
        recording = npd.record_history(client)
        assert all(r["recording"] for r in recording.values()), recording
        futures = {address: client.map(allocate_and_checksum, range(TASKS_PER_WORKER), workers=[address],
                                       allow_other_workers=False, pure=False)
                   for address in workers}
        results = {address: client.gather(fs, errors="raise") for address, fs in futures.items()}
        managed = {address: client.submit(allocate_managed, 3, workers=[address], allow_other_workers=False,
                                          pure=False).result(timeout=120)
                   for address in workers}
        statistics = npd.stats(client)
        worker_snapshots = npd.snapshots(client)
        print("\nnumba_pool statistics per worker:")
        print(json.dumps(statistics, indent=1, sort_keys=True))

        gpus = set()
        for address in workers:
            for seed, result in enumerate(results[address]):
                assert result["manager"] == "NumbaPoolManager", result
                assert result["checksum"] == expected_checksum(seed)
            gpus.add(results[address][0]["visible"].split(",")[0])
            s = statistics[address]
            assert s["status"] == "ok" and s["manager"] == "NumbaPoolManager", s
            total = s.get("total_count", s.get("total_allocations"))
            assert total >= 2 * TASKS_PER_WORKER, s  # two arrays per task
            # The managed array: right either way; numba_pool's exactly where the manager has its
            # managed cache: NUMBA_POOL_MANAGED on (the default; the workers inherit this
            # environment) and a device with concurrent managed access.
            m = managed[address]
            assert m["checksum"] == 3.0 * N_ELEMENTS and m["ours"] == m["managed cache"], m
            assert m["managed cache"] == (managed_on and m["concurrent access"]), m
            assert s["managed_on"] == m["managed cache"], (s, m)
            if m["managed cache"]:  # its block, in use or cached: the managed cache's bytes
                assert s["managed_reserved_bytes"] >= 4 * N_ELEMENTS and s["managed_blocks"] >= 1, s
            else:
                print(f"{address}: managed arrays from Numba's own path: {m['why not']}")
        assert len(gpus) == len(workers)  # one GPU per worker
        for address in workers:  # each worker's snapshot: its own allocations, with their events
            snap = worker_snapshots[address]
            assert "error" not in snap, snap.get("error")
            traced = [e for trace in snap["device_traces"] for e in trace if e["action"] == "alloc"]
            assert len(traced) >= 2 * TASKS_PER_WORKER, (address, len(traced))
            print(f"{address}: snapshot with {len(snap['segments'])} segments, {len(traced)} allocations traced")

        # The same figures reach the scheduler through worker.metrics, with a heartbeat.
        deadline = time.monotonic() + 30
        while True:
            metrics = {a: w["metrics"].get("numba_pool", {}) for a, w in client.scheduler_info()["workers"].items()}
            if all(m.get("status") == "ok" for m in metrics.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for address, m in metrics.items():
            assert m.get("status") == "ok" and m.get("total_count", m.get("total_allocations", 0)) > 0, (address, m)
            assert m.get("managed_on") == managed[address]["managed cache"], (address, m)
