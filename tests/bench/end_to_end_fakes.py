"""What the bench's end-to-end tests share: a worker's figures, made up, and the setting the
tables are headed with (numba-cuda's, whichever frontend the tests run under: RMM's rows are
numba-cuda's only; :data:`MLIR_SETTING` for Numba-CUDA-MLIR's)."""

from __future__ import annotations

from numba_pool.bench import end_to_end, worker
from numba_pool.bench.report import Setting

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
