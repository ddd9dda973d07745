"""How a bench process times, shared by the end-to-end worker (:mod:`numba_pool_tools.bench.worker`,
:mod:`numba_pool_tools.bench.host_worker`) and the allocator part (:mod:`numba_pool_tools.bench.allocator_cost`):
the CPU core it pins itself to with the collector off (:func:`quiet_host`), timed blocks that pass
the turn between workers (:func:`elapsed`, lock-step turns of :mod:`numba_pool_tools.bench.turns`),
operations per repeat from a time budget (:func:`calibrated`), the repeats per figure, the frees
Numba holds back, and the seed kernels compiled once through Numba's on-disk cache, all with the
``cuda`` of the bench's frontend (:mod:`numba_pool_tools.bench.core`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import statistics
import time

from .core import cuda, using_stream
from .turns import worker_turn

CORE_VARIABLE = "NUMBA_POOL_BENCH_CORE"  # the CPU core every worker pins itself to
REPEATS_VARIABLE = "NUMBA_POOL_BENCH_REPEATS"  # timed repeats per figure, when not the default


def chosen_core(requested: int | None, allowed: set[int]) -> int:
    """The CPU core to pin the workers to: ``requested``, else the lowest of ``allowed``.

    :raises ValueError: when ``requested`` is not in ``allowed``, naming both.
    """
    if requested is None:
        return min(allowed)
    if requested not in allowed:
        raise ValueError(f"--core {requested}: not a CPU core this process may run on "
                         f"(allowed: {', '.join(map(str, sorted(allowed)))})")
    return requested


def worker_core(environ=os.environ) -> int:
    """The CPU core a worker times on: :data:`CORE_VARIABLE`, else the lowest it may use."""
    value = environ.get(CORE_VARIABLE, "").strip()
    return chosen_core(int(value) if value else None, os.sched_getaffinity(0))


@contextlib.contextmanager
def quiet_host(environ=os.environ):
    """Inside: this process on one CPU core (:func:`worker_core`) and the collector off after a
    full collection.  Yields the core; restores both after."""
    before = os.sched_getaffinity(0)
    core = worker_core(environ)
    os.sched_setaffinity(0, {core})
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield core
    finally:
        if was_enabled:
            gc.enable()
        os.sched_setaffinity(0, before)


def serve(work) -> None:
    """A worker process's life in lock-step turns (:mod:`numba_pool_tools.bench.turns`; alone without
    them): say it started and wait for its turn, pinned to :func:`worker_core`; print the JSON
    line of ``work()``; leave the turns, also when ``work`` fails."""
    turn = worker_turn()
    turn.begin(worker_core())
    try:
        print(json.dumps(work()), flush=True)
    finally:
        turn.end()


def worker_repeats(default: int, environ=os.environ) -> int:
    """Timed repeats per figure in a worker: :data:`REPEATS_VARIABLE` if set, else ``default``.

    :raises SystemExit: (one line) when the variable is not a positive integer, naming it and its value.
    """
    value = environ.get(REPEATS_VARIABLE, "").strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise SystemExit(f"bench: {REPEATS_VARIABLE}={value!r}: expected a positive number of repeats")
    return int(value)


# -- timed blocks -----------------------------------------------------------------------------

def elapsed(body) -> float:
    """Seconds ``body()`` took; then, in lock-step turns (:mod:`numba_pool_tools.bench.turns`), the
    turn goes to the next worker, outside the timed region."""
    t0 = time.perf_counter()
    body()
    seconds = time.perf_counter() - t0
    worker_turn().pass_turn()
    return seconds


def median_time(body, repeats: int) -> float:
    """The median of ``repeats`` timed calls of ``body`` (:func:`elapsed`), in seconds."""
    return statistics.median(elapsed(body) for _ in range(repeats))


def median_times_taking_turns(bodies: dict, repeats: int) -> dict:
    """The median time of each body (seconds), the bodies taking turns inside each repeat."""
    times: dict = {key: [] for key in bodies}
    for _ in range(repeats):
        for key, body in bodies.items():
            times[key].append(elapsed(body))
    return {key: statistics.median(samples) for key, samples in times.items()}


def count_for(seconds_per_op: float, budget_s: float, low: int, high: int) -> int:
    """Operations per repeat so that a repeat takes about ``budget_s`` seconds at
    ``seconds_per_op`` each, within ``[low, high]``."""
    if seconds_per_op <= 0:
        return high
    return max(low, min(high, math.ceil(budget_s / seconds_per_op)))


def calibrated(make, budget_s: float, low: int, high: int) -> tuple[int, object]:
    """``(count, body)``: ``make(count)`` is a body doing ``count`` operations.  Runs
    ``make(low)`` twice, a warm-up (caches fill, kernels compile, the pool reserves) then timed,
    and returns the count :func:`count_for` picks with the body that does it."""
    probe = make(low)
    probe()
    count = count_for(elapsed(probe) / low, budget_s, low, high)
    return count, make(count)


# -- what the timed bodies share --------------------------------------------------------------

def pending_frees():
    """A function that carries out the frees the current context's manager holds back (Numba's
    pending deallocations, ``cuMemFree`` and ``cuMemFreeHost`` ten at a time under its own
    manager); a no-op for a manager without them (and under the simulator)."""
    manager = getattr(cuda.current_context(), "memory_manager", None)
    pending = getattr(manager, "deallocations", None)
    return pending.clear if pending is not None else (lambda: None)


def pairs_body(allocate, n: int, dtype, count: int, flush):
    """A body: ``count`` x (``allocate(n, dtype=dtype)``, drop it), then ``flush()``."""

    def body():
        for _ in range(count):
            a = allocate(n, dtype=dtype)
            del a
        flush()

    return body


def serves_numba_pool() -> bool:
    """Whether the current context's memory manager is numba_pool's (under another manager, and
    under the simulator, there is no allocation stream to choose)."""
    return type(getattr(cuda.current_context(), "memory_manager", None)).__name__ == "NumbaPoolManager"


def stream_scope(stream):
    """``numba_pool.using_stream(stream)`` under numba_pool's manager (:func:`serves_numba_pool`);
    a scope that does nothing under another manager."""
    return using_stream(stream) if serves_numba_pool() else contextlib.nullcontext()


def cached_jit(func):
    """``cuda.jit(cache=True)(func)``: compiled once into Numba's on-disk cache, then loaded.  A
    round's eight workers each compiled the bench's kernels again, about 2 s of every worker's
    turn on an H100 host (2026-11-22); the machine code is the same.  Falls back to ``cuda.jit``
    where Numba finds no writable cache folder (it raises ``RuntimeError``).  ``cuda`` is the
    bench's frontend's (:data:`numba_pool_tools.bench.core.cuda`)."""
    try:
        return cuda.jit(cache=True)(func)
    except RuntimeError:
        return cuda.jit(func)


@functools.cache
def example_kernel(name: str):
    """The kernel ``name`` of :mod:`numba_pool_tools.bench.kernels` (``"fill_kernel"``,
    ``"increment_kernel"``, ``"sqrt_kernel"``) compiled by the bench's frontend through
    :func:`cached_jit`, once per process."""
    from . import kernels

    return cached_jit(getattr(kernels, name))


def seed_kernels() -> tuple:
    """``(fill_kernel, sqrt_kernel)`` of :mod:`numba_pool_tools.bench.kernels` (:func:`example_kernel`)."""
    return example_kernel("fill_kernel"), example_kernel("sqrt_kernel")
