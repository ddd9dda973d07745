"""The CUDA-graph part of ``numba-pool-tools bench`` (``--part graphs``): a pipeline with a temporary
(allocate it, fill it, add it to an input into an output, drop it) per iteration, launched
eagerly and captured once into a CUDA graph then replayed, under Numba's default manager and
numba_pool in both modes; µs per iteration.

Each manager runs in a process of its own (Numba binds the manager when it makes the context):
``python -m numba_pool_tools.bench.graphs`` under ``NUMBA_CUDA_MEMORY_MANAGER`` and
``NUMBA_POOL_ARENA``, which prints one JSON line.  Per size, :data:`REPEATS` timed blocks of
:data:`ITERATIONS` iterations after one untimed block; the median block, divided by the
iterations; ``cuCtxSynchronize`` ends each block (its cost is spread over the block).  Under the
default manager the capture fails (``cuMemAlloc`` is not allowed in a capture): the row says
with which error.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np

from .core import FRONTEND, cuda
from .timing import example_kernel, stream_scope

SIZES = [4 << 10, 1 << 20]
ITERATIONS = 1000
REPEATS = 7
THREADS = 256


def _add_kernel():
    @cuda.jit
    def add(x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + y[i]

    return add


def _timed(fn) -> float:
    """µs per iteration: the median of :data:`REPEATS` blocks after one untimed block."""
    fn()
    cuda.synchronize()
    blocks = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        cuda.synchronize()
        blocks.append(time.perf_counter() - start)
    return statistics.median(blocks) / ITERATIONS * 1e6


def measure(nbytes: int) -> dict:
    """This process's figures for a temporary of ``nbytes``: ``eager_us``, and ``captured_us``
    or ``capture_error``."""
    from cuda.bindings import driver as cu

    fill, add = example_kernel("fill_kernel"), _add_kernel()
    n = nbytes // 4
    grid = (n + THREADS - 1) // THREADS
    stream = cuda.stream()
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    out = cuda.device_array(n, np.float32)

    def step():
        with stream_scope(stream):
            tmp = cuda.device_array(n, np.float32, stream=stream)
            fill[grid, THREADS, stream](tmp, np.float32(2))
            add[grid, THREADS, stream](x, tmp, out)
            del tmp

    def eager():
        for _ in range(ITERATIONS):
            step()

    result = {"bytes": nbytes, "eager_us": _timed(eager)}
    cu.cuStreamBeginCapture(stream.handle, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    try:
        step()
        error = None
    except Exception as err:  # noqa: BLE001 - the default manager's cuMemAlloc in a capture
        error = f"{type(err).__name__}: {str(err)[:120]}"
    err, graph = cu.cuStreamEndCapture(stream.handle)
    if error is None and err != cu.CUresult.CUDA_SUCCESS:
        error = f"cuStreamEndCapture: {err.name}"
    if error is not None:
        result["capture_error"] = error
        return result
    err, executable = cu.cuGraphInstantiate(graph, 0)

    def replay():
        for _ in range(ITERATIONS):
            cu.cuGraphLaunch(executable, stream.handle)

    result["captured_us"] = _timed(replay)
    expected = np.arange(n, dtype=np.float32) + 2
    result["correct"] = bool((out.copy_to_host() == expected).all())
    cu.cuGraphExecDestroy(executable)
    cu.cuGraphDestroy(graph)
    return result


def run_worker() -> dict:
    """Every size, in this process, under the manager and mode the environment selects."""
    return {"frontend": FRONTEND.name, "sizes": [measure(size) for size in SIZES]}


if __name__ == "__main__":
    print(json.dumps(run_worker()), flush=True)
