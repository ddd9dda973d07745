"""Kernels and experiments shared by the GPU tests, on the frontend under test.

Also imported by programs that tests run in a fresh interpreter (``sys.path`` has this folder,
not ``tests/``): hence ``cuda`` from :func:`numba_pool.cuda.frontend.for_tools` (which
``NUMBA_POOL_FRONTEND`` picks, as ``helpers.cuda``), not from ``helpers``.
"""

from __future__ import annotations

import contextlib
import gc

import numpy as np
from cuda.bindings import driver as cu

import numba_pool
from numba_pool.cuda.frontend import for_tools
from kernels import fill_kernel

cuda = for_tools().cuda

THREADS = 256
POISON = np.float32(-7.0)


def blocks(n: int) -> int:
    return (n + THREADS - 1) // THREADS


@cuda.jit
def read_after_delay(a, poison, delay_us, hits):
    """Sleep ``delay_us`` microseconds, then count the elements of ``a`` equal to ``poison``.

    A small grid with a grid-stride loop, so that SMs stay free for any kernel that the
    ordering under test fails to hold back: if it runs, this kernel sees its writes."""
    for _ in range(delay_us):
        cuda.nanosleep(1000)
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, a.size, stride):
        if a[i] == poison:
            cuda.atomic.add(hits, 0, 1)


@contextlib.contextmanager
def non_blocking_stream():
    """A ``CU_STREAM_NON_BLOCKING`` stream as the frontend's external stream: not ordered with the
    legacy default stream."""
    cuda.current_context()  # the raw call needs a current context (no earlier test may have made one)
    err, handle = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    assert not err, err
    try:
        yield cuda.external_stream(int(handle))
    finally:
        # Arrays recorded on it (record_stream) are released while it lives: their release records an event on it,
        # and a destroyed handle crashed the driver (an array a kernel launch kept alive till a later collect).
        gc.collect()
        cuda.synchronize()
        cu.cuStreamDestroy(handle)


def cross_stream_experiment(nbytes, reader_stream, fill_stream, *, fill_in_scope=False, record=False,
                            read_in_scope=False, a_in_fill_scope=False, trials=20, delay_us=3000):
    """The cross-stream check: a kernel on ``reader_stream`` reads array A while the host drops
    A and allocates the same size B for a fill on ``fill_stream``.

    :returns: (trials in which B reused A's address, elements the reader saw poisoned).
    """
    n = nbytes // 4
    hits = cuda.to_device(np.zeros(1, dtype=np.int64))
    reused = 0
    for _ in range(trials):
        scope = reader_stream if read_in_scope else fill_stream if a_in_fill_scope else None
        with numba_pool.using_stream(scope) if scope is not None else contextlib.nullcontext():
            a = cuda.device_array(n, dtype=np.float32)
        fill_kernel[blocks(n), THREADS](a, np.float32(1.0))
        cuda.synchronize()  # A is written before the reader starts, whatever its stream
        read_after_delay[32, THREADS, reader_stream](a, POISON, delay_us, hits)
        address = a.device_ctypes_pointer.value
        if record:
            numba_pool.record_stream(a, reader_stream)
        del a
        with numba_pool.using_stream(fill_stream) if fill_in_scope else contextlib.nullcontext():
            b = cuda.device_array(n, dtype=np.float32)
        fill_kernel[blocks(n), THREADS, fill_stream](b, POISON)
        reused += b.device_ctypes_pointer.value == address
        cuda.synchronize()
        del b
    return reused, int(hits.copy_to_host()[0])
