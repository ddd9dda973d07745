"""The overlap part's worker (``numba-pool-tools bench --part overlap``): whether a program's streams
still run at once when each of them allocates and drops a temporary per kernel, under the memory
manager its environment selects.  ``python -m numba_pool_tools.bench.overlap`` checks, times, and
prints one JSON line; the parent is :mod:`numba_pool_tools.bench.overlap_tables`.

Measured (issue 33's pipeline), for :data:`STREAMS` ``cuda.stream()``\\s:

* a **batch** (``batch_ms``, ``'2 streams'``): :data:`ITERATIONS` x, for each stream ``s`` in
  turn, ``cuda.device_array`` of :data:`TEMPORARY` bytes with ``stream=s``, the :func:`spin`
  kernel (one block, about 1 ms) on ``s`` writing it, the array dropped; all issued from this
  one thread, then the frees Numba holds back carried out and ``cuda.synchronize()``.
  Under numba_pool, the same again with each allocation inside ``numba_pool.using_stream(s)``
  (``'2 streams, using_stream'``).
* the **kernels alone** (``serial_ms``): as many launches of :func:`spin`, back to back on one
  stream, on one array allocated beforehand: the time the batch takes if its streams do not
  overlap at all.

Milliseconds; each figure the median of :data:`REPEATS` timed repeats after one untimed run of
every figure, the figures taking turns inside each repeat, on one CPU core with the collector
off (:func:`numba_pool_tools.bench.timing.quiet_host`), handing the turn on after each timed repeat
(:mod:`numba_pool_tools.bench.turns`).  Before timing, the kernel's output is checked.

The kernel waits with ``cuda.nanosleep`` in a loop (neither frontend has ``clock64``): about
1 ms per launch on an H100 (the serial figure says how long it really took).
"""

from __future__ import annotations

import contextlib

import numpy as np

from .core import FRONTEND, cuda, using_stream
from .timing import (cached_jit, median_times_taking_turns, pending_frees, quiet_host, serve, serves_numba_pool,
                     worker_repeats)

STREAMS = (2, 4)  # cuda.stream()s per batch: a figure each
ITERATIONS = 40  # temporaries and kernels per stream and batch
TEMPORARY = 1 << 20  # bytes of each temporary (float32)
SLEEPS = 1000  # cuda.nanosleep(1000) per launch of the kernel: about 1 ms
REPEATS = 5
THREADS = 256  # the kernel's one block
VALUE = np.float32(3.0)  # what the kernel writes
BATCH = "batch_ms"
SERIAL = "serial_ms"
SCOPED = ", using_stream"


def figure(streams: int, scoped: bool = False) -> str:
    """A figure's name, its key in the worker's JSON: ``'2 streams'``, ``'4 streams, using_stream'``."""
    return f"{streams} streams" + (SCOPED if scoped else "")


@cached_jit
def spin(a, sleeps, value):
    """Wait ``sleeps`` x 1 µs (``cuda.nanosleep``), then write ``value`` to every element of
    ``a`` (a grid-stride loop: one block is enough)."""
    for _ in range(sleeps):
        cuda.nanosleep(1000)
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, a.size, stride):
        a[i] = value


def _no_scope(stream):
    return contextlib.nullcontext()


def pipeline(streams: list, scoped: bool, flush):
    """A body: one batch on ``streams`` (each allocation inside ``using_stream`` of its stream
    where ``scoped``), ended by ``flush()``."""
    n, device_array, float32 = TEMPORARY // 4, cuda.device_array, np.float32
    scope = using_stream if scoped else _no_scope

    def batch():
        for _ in range(ITERATIONS):
            for stream in streams:
                with scope(stream):
                    temporary = device_array(n, dtype=float32, stream=stream)
                spin[1, THREADS, stream](temporary, SLEEPS, VALUE)
                del temporary
        flush()

    return batch


def serial(stream, launches: int, flush):
    """A body: ``launches`` launches of the kernel back to back on ``stream``, on one array
    allocated now, ended by ``flush()``."""
    array = cuda.device_array(TEMPORARY // 4, dtype=np.float32)

    def kernels_alone():
        for _ in range(launches):
            spin[1, THREADS, stream](array, SLEEPS, VALUE)
        flush()

    return kernels_alone


def check_kernel() -> None:
    """Check that the kernel writes a temporary allocated on a stream.

    :raises SystemExit: when it does not: refusing to time.
    """
    stream = cuda.stream()
    temporary = cuda.device_array(TEMPORARY // 4, dtype=np.float32, stream=stream)
    spin[1, THREADS, stream](temporary, 1, VALUE)
    written = temporary.copy_to_host(stream=stream)
    stream.synchronize()
    if not (written == VALUE).all():
        raise SystemExit("bench: the overlap kernel's output is wrong: refusing to time")


def run_worker() -> dict:
    """Check, then time, under the manager the environment selects: ``batch_ms`` and
    ``serial_ms`` (``{figure: ms}``), ``using_stream`` (whether the scoped figures were timed:
    under numba_pool only), ``repeats``, ``iterations``, ``core``, ``manager`` and ``frontend``."""
    repeats = worker_repeats(REPEATS)  # a bad value ends the worker before it touches CUDA
    check_kernel()
    scoped = serves_numba_pool()
    streams = [cuda.stream() for _ in range(max(STREAMS))]
    flush_pending = pending_frees()

    def flush():
        flush_pending()
        cuda.synchronize()

    bodies = {(BATCH, figure(n)): pipeline(streams[:n], False, flush) for n in STREAMS}
    if scoped:
        bodies.update({(BATCH, figure(n, True)): pipeline(streams[:n], True, flush) for n in STREAMS})
    bodies.update({(SERIAL, figure(n)): serial(streams[0], n * ITERATIONS, flush) for n in STREAMS})
    with quiet_host() as core:
        for body in bodies.values():  # the warm-up: kernels loaded, pools grown
            body()
        medians = median_times_taking_turns(bodies, repeats)
    result = {"frontend": FRONTEND.name, "core": core, "repeats": repeats, "iterations": ITERATIONS,
              "using_stream": scoped, "manager": type(cuda.current_context().memory_manager).__module__,
              BATCH: {}, SERIAL: {}}
    for (field, name), seconds in medians.items():
        result[field][name] = seconds * 1e3
    return result


if __name__ == "__main__":
    serve(run_worker)
