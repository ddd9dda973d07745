"""What the bench's end-to-end tests share: a worker's figures, made up, and the setting the
tables are headed with (numba-cuda's, whichever frontend the tests run under: RMM's rows are
numba-cuda's only; :data:`MLIR_SETTING` for Numba-CUDA-MLIR's)."""

from __future__ import annotations

from numba_pool_tools.bench import end_to_end, worker
from numba_pool_tools.bench.report import Setting

SETTING = Setting(device="GPU", date="today", core=0, frontend="numba-cuda")
MLIR_SETTING = Setting(device="GPU", date="today", core=0, frontend="mlir")


def result(seed_ms, *us):
    """A worker's figures: the benchmark loop (ms) and allocate+free at each size (µs)."""
    return {"seed_loop_ms": seed_ms, "alloc_free_us": {str(s): t for s, t in zip(worker.SIZES, us)}}


def clean_results():
    """Figures of default, numba_pool, the two floors and CuPy's plugin that pass every check."""
    return {end_to_end.DEFAULT.label: result(12.0, 25.0, 25.0, 85.0, 127.0),
            end_to_end.NUMBA_POOL.label: result(4.0, 10.0, 10.0, 10.0, 10.0),
            end_to_end.FLOOR.label: result(4.0, 9.75, 9.75, 9.75, 9.75),
            end_to_end.BARE_FLOOR.label: result(4.0, 8.25, 8.25, 8.25, 8.25),
            end_to_end.CUPY.label: result(4.0, 11.0, 11.0, 11.0, 11.0)}


def overlap_result(two, four, scoped=None, serial=(95.0, 190.0)):
    """An overlap worker's figures (ms): a batch on 2 and 4 streams, the same with using_stream
    (``scoped``: a pair, under numba_pool only), and the kernels alone."""
    from numba_pool_tools.bench import overlap

    batch = {overlap.figure(2): two, overlap.figure(4): four}
    if scoped is not None:
        batch.update({overlap.figure(2, True): scoped[0], overlap.figure(4, True): scoped[1]})
    return {"batch_ms": batch, "serial_ms": {overlap.figure(2): serial[0], overlap.figure(4): serial[1]},
            "using_stream": scoped is not None, "repeats": 5, "iterations": 40, "core": 0, "manager": "m"}


def clean_overlap_results():
    """Overlap figures of default and numba_pool in both modes that pass every check."""
    from numba_pool_tools.bench import end_to_end

    return {end_to_end.DEFAULT.label: overlap_result(48.9, 50.0),
            end_to_end.NUMBA_POOL.label: overlap_result(48.0, 49.0, scoped=(41.8, 43.0)),
            end_to_end.ARENA.label: overlap_result(49.5, 52.0, scoped=(42.0, 44.0))}
