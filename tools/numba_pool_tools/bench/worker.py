"""The end-to-end worker's ``cuda.device_array`` part, inside ``python -m numba_pool_tools.bench``
(:mod:`numba_pool_tools.bench.__main__`): check, then time, under whatever memory manager the
environment selected; the parent reads back one JSON line.

Measured, after checking the kernels' output:

* benchmark loop (``seed_loop_ms``): :data:`SEED_ITERATIONS` x (``cuda.device_array(2**20,
  float32)``, sqrt kernel, drop the array) on the default stream, bracketed by
  ``cuda.synchronize()``; milliseconds per 100 iterations.
* allocate + free (``alloc_free_us``): ``cuda.device_array`` of each of :data:`SIZES` (float32)
  and dropping it, in a loop ended by carrying out the frees Numba holds back and one
  ``cuda.synchronize()``; microseconds per pair.  A repeat of a size does :data:`MIN_PAIRS` to
  :data:`MAX_PAIRS` pairs, as many as take about :data:`PAIRS_BUDGET_S` (``pairs``, by size).
* ``driver_pair_us`` under numba_pool: what a ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync``
  pair costs from Python alone.

Each figure is the median of :data:`REPEATS` timed repeats after a warm-up, the sizes taking
turns inside each repeat, on one CPU core with the collector off
(:func:`numba_pool_tools.bench.timing.quiet_host`).  With host parts, the rows of
:mod:`numba_pool_tools.bench.host_worker` (pinned and managed memory) follow under ``"host"``; with
``--no-device``, they are all the worker times.  ``cuda`` is the bench's frontend's
(:data:`numba_pool_tools.bench.core.cuda`: the parent passes its ``NUMBA_POOL_FRONTEND``), named in the
result as ``frontend``.
"""

from __future__ import annotations

import functools
import os

from . import anchors, host_worker
from .core import FRONTEND, cuda, pool_handle
from .timing import (calibrated, median_time, median_times_taking_turns, pairs_body, pending_frees, quiet_host,
                     seed_kernels, worker_repeats)

SEED_ELEMENTS = 1 << 20
SEED_ITERATIONS = 100
SIZES = [256, 64 << 10, 4 << 20, 64 << 20]  # bytes
REPEATS = 15
PAIRS_BUDGET_S = 0.015  # seconds a repeat of a device_array size aims at
MIN_PAIRS, MAX_PAIRS = 100, 1000  # allocate+free pairs per repeat of a size
THREADS = 256  # per block, for the seed kernels


def run_worker(host_parts: tuple = (), device: bool = True) -> dict:
    """Check, then time, under whatever manager the environment selected. Returns medians:
    with ``device`` (the worker's default; ``--no-device`` leaves it out), ``seed_loop_ms`` and
    ``alloc_free_us`` keyed by the size in bytes as a string (JSON); with ``host_parts``
    (:data:`numba_pool_tools.bench.host_worker.PARTS`), their figures under ``"host"``; always
    ``frontend``.

    :raises SystemExit: when a kernel's output is wrong under this manager: refusing to time.
    """
    repeats = worker_repeats(REPEATS)  # a bad value ends the worker before it touches CUDA
    rmm_resource = os.environ.get(anchors.RMM_VARIABLE)
    if rmm_resource:
        anchors.prepare_rmm(rmm_resource)
    if device:
        check_kernels()
    if host_parts:
        host_worker.check(host_parts)
    result = {"frontend": FRONTEND.name}
    if device:
        seed_loop = seed_loop_body()
        with quiet_host() as core:
            result.update(_time_device_arrays(seed_loop, core, repeats))
    if host_parts:
        result["host"] = host_worker.measure(host_parts, repeats=worker_repeats(host_worker.REPEATS))
    return result


def check_kernels() -> None:
    """Check that the seed kernels compute the right thing in memory from this manager: the sqrt
    kernel on :data:`SEED_ELEMENTS`, the fill kernel at each of :data:`SIZES`.

    :raises SystemExit: naming the kernel (and size), when its output is wrong.
    """
    import numpy as np

    fill_kernel, sqrt_kernel = seed_kernels()
    expected = np.sqrt(np.arange(SEED_ELEMENTS, dtype=np.float64)).astype(np.float32)
    d = cuda.device_array(SEED_ELEMENTS, dtype=np.float32)
    sqrt_kernel[_blocks(SEED_ELEMENTS), THREADS](d)
    if not np.allclose(d.copy_to_host(), expected, rtol=1e-6):
        raise SystemExit("bench: sqrt kernel output is wrong: refusing to time")
    del d
    for nbytes in SIZES:
        n = nbytes // 4
        a = cuda.device_array(n, dtype=np.float32)
        fill_kernel[_blocks(n), THREADS](a, np.float32(nbytes))
        if not (a.copy_to_host() == np.float32(nbytes)).all():
            raise SystemExit(f"bench: fill kernel output is wrong at {nbytes} bytes: refusing to time")
        del a


def _blocks(n: int) -> int:
    """Blocks of :data:`THREADS` that cover ``n`` elements."""
    return (n + THREADS - 1) // THREADS


def seed_loop_body():
    """The benchmark loop: :data:`SEED_ITERATIONS` x (``cuda.device_array`` of
    :data:`SEED_ELEMENTS` float32, the sqrt kernel on it, drop it), between two synchronizes."""
    import numpy as np

    _, sqrt_kernel = seed_kernels()
    blocks = _blocks(SEED_ELEMENTS)

    def seed_loop():
        cuda.synchronize()
        for _ in range(SEED_ITERATIONS):
            arr = cuda.device_array(SEED_ELEMENTS, dtype=np.float32)
            sqrt_kernel[blocks, THREADS](arr)
            del arr
        cuda.synchronize()

    return seed_loop


def _time_device_arrays(seed_loop, core: int, repeats: int) -> dict:
    """The worker's figures of the benchmark loop and of each size's allocate+free pairs, with
    the manager's module and, under numba_pool, ``driver_pair_us``."""
    seed_loop()  # warm-up
    result = {"seed_loop_ms": median_time(seed_loop, repeats) * 1e3, "core": core, "frontend": FRONTEND.name}
    counts, pairs = {}, {}
    for nbytes in SIZES:
        make = functools.partial(device_array_pairs, nbytes // 4)
        counts[str(nbytes)], pairs[str(nbytes)] = calibrated(make, PAIRS_BUDGET_S, MIN_PAIRS, MAX_PAIRS)
    medians = median_times_taking_turns(pairs, repeats)
    result["alloc_free_us"] = {key: t / counts[key] * 1e6 for key, t in medians.items()}
    result["pairs"] = counts
    manager = cuda.current_context().memory_manager
    result["manager"] = type(manager).__module__
    handle = pool_handle(manager)
    if handle is not None:
        result["driver_pair_us"] = _driver_pair_us(handle, repeats)
    return result


def device_array_pairs(n: int, count: int):
    """A body that allocates and drops a float32 device array of ``n`` elements ``count``
    times, then carries out the frees Numba holds back (:func:`pending_frees`) and
    synchronizes: each repeat pays for its own frees, not for up to ten of the size before."""
    import numpy as np

    flush_pending = pending_frees()

    def flush():
        flush_pending()
        cuda.synchronize()

    return pairs_body(cuda.device_array, n, np.float32, count, flush)


def _driver_pair_us(pool, repeats: int) -> float:
    """What a ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync`` pair of 256 B costs from Python
    alone (legacy default stream), in µs: the part of numba_pool's cost no Python code can remove."""
    from cuda.bindings import driver as cu

    stream = cu.CUstream(cu.CU_STREAM_LEGACY)
    alloc, free = cu.cuMemAllocFromPoolAsync, cu.cuMemFreeAsync

    def pairs():
        for _ in range(MAX_PAIRS):
            free(alloc(256, pool, stream)[1], stream)
        cu.cuCtxSynchronize()

    pairs()
    return median_time(pairs, repeats) / MAX_PAIRS * 1e6
