"""The host rows of ``numba-pool bench --part end-to-end``, measured inside the per-manager
worker (``python -m numba_pool.bench --host pinned,pipeline``,
:func:`numba_pool.bench.worker.run_worker`).

Two parts, each checked before it is timed (wrong data: the worker exits, refusing to time):

* ``pinned``: ``cuda.pinned_array(n, dtype=np.uint8)``, then dropping it, and the same for
  ``cuda.mapped_array``, at 4 KiB, 1 MiB and 64 MiB: **microseconds per allocate+free pair**
  (``pinned_array_us``, ``mapped_array_us``).  Checked first: a pinned array's data goes to the
  device and back on a stream, and a kernel's writes to a mapped array reach the host.
* ``pipeline``: one **batch** of a staging pipeline, at batch sizes of 4 KiB, 1 MiB and 64 MiB
  (float32): a pinned staging buffer filled on the host, ``cuda.to_device(staging, stream=s)``
  on a non-default stream, device temporaries of the batch size, half of it and 4 KiB, two
  kernels on ``s``, ``copy_to_host`` into a pinned buffer on ``s``, ``s.synchronize()``; every
  buffer is dropped at the end of the batch.  **Milliseconds per batch** (``pipeline_ms``).
  Checked first: each batch size's output against NumPy (:func:`expected_batch`).

Method: a figure at a size is a *cell*.  Each cell's count of operations per repeat is chosen
from the time of a few after a warm-up so that a repeat takes about :data:`BUDGET_S` seconds,
between :data:`MIN_COUNT` and :data:`MAX_COUNT` (:func:`numba_pool.bench.timing.calibrated`): Numba's
own manager pays about 1.3 ms per pinned pair at 4 KiB and 46 ms at 64 MiB, numba_pool's host
cache microseconds.
Then :data:`REPEATS` repeats, the cells of a part taking turns inside each repeat, on one CPU
core with the collector off (:func:`numba_pool.bench.timing.quiet_host`).  Each repeat of a cell ends by
carrying out the frees Numba holds back (its manager's pending deallocations: Numba's own frees
``cuMemFree`` and ``cuMemFreeHost`` ten at a time), so that a repeat pays for its own frees and
no other's.  A figure is the median repeat divided by the count.

Expected time for the default manager, from the driver's figures: about 10 s on top of the
``cuda.device_array`` part, that is 9 repeats of 2 x 30 ms + 3 x 46 ms for each kind of pinned
memory and of about 30 + 30 + 3 x 130 ms of batches, plus the calibrations (measured on an H100:
about 6 s).  A cell's repeats cost at most ``MIN_COUNT`` operations or about ``BUDGET_S``,
whichever is longer, so an operation twice as slow as expected only lengthens the 64 MiB cells.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

from .core import cuda, has_host_cache
from .labels import size_label
from .timing import (cached_jit, calibrated, median_times_taking_turns, pairs_body, pending_frees, quiet_host,
                     seed_kernels)
from .turns import worker_turn

PARTS = ("pinned", "pipeline")
PINNED_PHASE, PIPELINE_PHASE = 1, 2  # their phases in lock-step turns (0: cuda.device_array)
SIZES = [4 << 10, 1 << 20, 64 << 20]  # bytes: pinned arrays, and pipeline batches
SMALL_TEMPORARY = 4 << 10  # bytes: the pipeline's small device temporary
REPEATS = 9
BUDGET_S = 0.03  # seconds a repeat of a cell aims at
MIN_COUNT = 3  # operations per repeat, at least (64 MiB under Numba's own manager: ~46 ms each)
MAX_COUNT = 1000  # operations per repeat, at most
THREADS = 256
PINNED = "pinned_array_us"
MAPPED = "mapped_array_us"
PIPELINE = "pipeline_ms"
FIELDS = (PINNED, MAPPED, PIPELINE)
UNITS = {PINNED: 1e6, MAPPED: 1e6, PIPELINE: 1e3}  # seconds -> the field's unit


def parse_parts(argv: list[str]) -> tuple[str, ...]:
    """The host parts a worker's command line asks for: ``--host pinned,pipeline`` (either or
    both, in that order); none without ``--host``.

    :raises SystemExit: (status 2, one line) for an unknown part, naming it.
    """
    parser = argparse.ArgumentParser(prog="python -m numba_pool.bench")
    parser.add_argument("--host", default="", metavar="PARTS",
                        help=f"comma-separated host parts to check and time: {', '.join(PARTS)}")
    parts = [p.strip() for p in parser.parse_args(argv).host.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--host: unknown part {unknown[0]!r} (known: {', '.join(PARTS)})")
    return tuple(p for p in PARTS if p in parts)


# -- what is timed ----------------------------------------------------------------------------

@cached_jit
def expand(x, full, half, small):
    """The pipeline's first kernel: ``full = 2 x``, ``half[j] = x[2 j] + x[2 j + 1]``,
    ``small[k] = k mod 7``."""
    i = cuda.grid(1)
    if i < x.size:
        full[i] = x[i] * 2.0
    if i < half.size:
        half[i] = x[2 * i] + x[2 * i + 1]
    if i < small.size:
        small[i] = i % 7


@cached_jit
def combine(full, half, small):
    """The pipeline's second kernel: ``full[i] += half[i // 2] + small[i mod small.size]``."""
    i = cuda.grid(1)
    if i < full.size:
        full[i] = full[i] + half[i // 2] + small[i % small.size]


def make_batch():
    """``batch(n, stream, source)``: one batch of ``n`` float32 elements (``n`` even) from the
    NumPy array ``source``; returns the pinned output, every other buffer already dropped."""
    pinned_array, device_array, to_device, float32 = cuda.pinned_array, cuda.device_array, cuda.to_device, np.float32
    small_n = SMALL_TEMPORARY // 4

    def batch(n, stream, source):
        staging = pinned_array(n, dtype=float32)
        staging[:] = source  # filled on the host
        x = to_device(staging, stream=stream)
        full = device_array(n, dtype=float32, stream=stream)
        half = device_array(n // 2, dtype=float32, stream=stream)
        small = device_array(small_n, dtype=float32, stream=stream)
        blocks = (max(n, small_n) + THREADS - 1) // THREADS
        expand[blocks, THREADS, stream](x, full, half, small)
        combine[blocks, THREADS, stream](full, half, small)
        out = pinned_array(n, dtype=float32)
        full.copy_to_host(out, stream=stream)
        stream.synchronize()
        return out

    return batch


def source_for(n: int):
    """A batch's input: ``n`` float32 whole numbers below 1000 (every sum in a batch is exact)."""
    return (np.arange(n) % 1000).astype(np.float32)


def expected_batch(source):
    """What a batch of ``source`` (even length) computes, in NumPy:
    ``2 x[i] + x[2 (i // 2)] + x[2 (i // 2) + 1] + (i mod 1024) mod 7``."""
    x = source.astype(np.float64)
    i = np.arange(len(x))
    pairs = x[0::2] + x[1::2]
    return (2 * x + pairs[i // 2] + (i % (SMALL_TEMPORARY // 4)) % 7).astype(np.float32)


def _batches(batch, stream, source, count: int, flush):
    """A body: ``count`` batches of ``source``, each output dropped at once, then ``flush()``."""
    n = len(source)

    def body():
        for _ in range(count):
            batch(n, stream, source)
        flush()

    return body


# -- checks, then timing --------------------------------------------------------------------

def check(parts: tuple, sizes: list[int] = SIZES) -> None:
    """Check each part's data at every size under the current manager.

    :raises SystemExit: naming the part and size, when the data is wrong: refusing to time.
    """
    if "pinned" in parts:
        for nbytes in sizes:
            _check_host_arrays(nbytes)
    if "pipeline" in parts:
        _check_pipeline(sizes)


def _check_host_arrays(nbytes: int) -> None:
    fill_kernel, _ = seed_kernels()
    n = nbytes // 4
    pattern = (np.arange(n) % 251).astype(np.float32)
    stream = cuda.stream()
    staged, back = cuda.pinned_array(n, dtype=np.float32), cuda.pinned_array(n, dtype=np.float32)
    staged[:] = pattern
    cuda.to_device(staged, stream=stream).copy_to_host(back, stream=stream)
    stream.synchronize()
    if not np.array_equal(back, pattern):
        raise SystemExit(f"bench: pinned_array data is wrong after to_device and copy_to_host at "
                         f"{size_label(nbytes)}: refusing to time")
    mapped = cuda.mapped_array(n, dtype=np.float32)
    fill_kernel[(n + THREADS - 1) // THREADS, THREADS](mapped, np.float32(nbytes))
    cuda.synchronize()
    if not (np.asarray(mapped) == np.float32(nbytes)).all():
        raise SystemExit(f"bench: a kernel's writes to a mapped_array did not reach the host at "
                         f"{size_label(nbytes)}: refusing to time")


def _check_pipeline(sizes: list[int]) -> None:
    batch, stream = make_batch(), cuda.stream()
    for nbytes in sizes:
        source = source_for(nbytes // 4)
        if not np.array_equal(batch(len(source), stream, source), expected_batch(source)):
            raise SystemExit(f"bench: the batch pipeline's output is wrong at {size_label(nbytes)}: refusing to time")


def measure(parts: tuple, sizes: list[int] = SIZES, repeats: int = REPEATS, budget_s: float = BUDGET_S) -> dict:
    """Time ``parts`` (after :func:`check`) on one CPU core with the collector off.  Returns
    ``{field: {size: median per operation}}`` for the fields of the parts (µs per pair, ms per
    batch), ``counts`` (``{field: {size: operations per repeat}}``), ``repeats``,
    ``host_cache`` (whether pinned memory came from numba_pool's host cache) and
    ``pinned_from`` (:func:`pinned_source`)."""
    flush = pending_frees()
    result: dict = {"repeats": repeats, "counts": {}}
    turn = worker_turn()  # lock-step turns: each part is a phase (numba_pool.bench.turns)
    with quiet_host():
        if "pinned" in parts:
            turn.enter_phase(PINNED_PHASE)
            time_cells(result, _pinned_cells(sizes, flush), repeats, budget_s)
        if "pipeline" in parts:
            turn.enter_phase(PIPELINE_PHASE)
            time_cells(result, _pipeline_cells(sizes, flush), repeats, budget_s)
    manager = getattr(cuda.current_context(), "memory_manager", None)
    result["host_cache"] = has_host_cache(manager)
    result["pinned_from"] = pinned_source(manager)
    return result


def pinned_source(manager) -> str:
    """Where ``manager``'s pinned memory comes from, in words: numba_pool's host cache; a
    ``cuMemHostAlloc`` per array (Numba's own ``memhostalloc``, which numba_pool's calls with
    its cache off, under either frontend); or the class whose ``memhostalloc`` overrides Numba's."""
    if manager is None:
        return "no memory manager (the CUDA simulator)"
    if has_host_cache(manager):
        return "numba_pool host cache"
    owner = next((c for c in type(manager).__mro__ if "memhostalloc" in vars(c)), type(manager))
    if owner.__module__.split(".")[0] in ("numba", "numba_cuda", "numba_cuda_mlir", "numba_pool"):
        return "cuMemHostAlloc per array"
    return f"{owner.__module__}.{owner.__qualname__}.memhostalloc"


def _pinned_cells(sizes: list[int], flush) -> dict:
    return {(field, nbytes): functools.partial(pairs_body, allocate, nbytes, np.uint8, flush=flush)
            for field, allocate in ((PINNED, cuda.pinned_array), (MAPPED, cuda.mapped_array)) for nbytes in sizes}


def _pipeline_cells(sizes: list[int], flush) -> dict:
    batch, stream = make_batch(), cuda.stream()
    return {(PIPELINE, nbytes): functools.partial(_batches, batch, stream, source_for(nbytes // 4), flush=flush)
            for nbytes in sizes}


def time_cells(result: dict, cells: dict, repeats: int, budget_s: float) -> None:
    """Calibrate every cell ``{(field, size): make}``, time them taking turns, and store the
    median per operation (the field's unit) and the count in ``result``."""
    counts, bodies = {}, {}
    for key, make in cells.items():
        counts[key], bodies[key] = calibrated(make, budget_s, MIN_COUNT, MAX_COUNT)
    for (field, nbytes), seconds in median_times_taking_turns(bodies, repeats).items():
        count = counts[(field, nbytes)]
        result.setdefault(field, {})[str(nbytes)] = seconds / count * UNITS[field]
        result["counts"].setdefault(field, {})[str(nbytes)] = count
