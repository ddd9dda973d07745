"""The host rows of ``numba-pool-tools bench --part end-to-end``, pinned and managed memory, measured
inside the per-manager worker (``python -m numba_pool_tools.bench --host PARTS [--no-device]``,
:func:`numba_pool_tools.bench.worker.run_worker`).

Two kinds of memory (:class:`Memory`), each with two parts, allocate+free pairs and a pipeline,
each part checked before it is timed (wrong data: the worker exits, refusing to time):

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
* ``managed``: ``cuda.managed_array(n, dtype=np.uint8)``, then dropping it, at 4 KiB, 1 MiB and
  64 MiB: **microseconds per allocate+free pair** (``managed_array_us``).
* ``managed-pipeline``: one **batch** per iteration, at batch sizes of 4 KiB, 1 MiB and 64 MiB
  (float32): a managed array allocated, filled on the host (``a[:] = source``), the increment
  kernel of :mod:`numba_pool_tools.bench.kernels` on it (legacy default stream), ``cuda.synchronize()``, its
  sum read on the host, the array dropped (:func:`make_managed_batch`).  **Milliseconds per
  batch** (``managed_pipeline_ms``).  Both managed parts are checked first: one managed batch at
  each size, every element against ``source + 1`` and the host's sum against NumPy's; and the
  device must have :func:`room_needed` bytes free (never more managed memory live than the card
  has free: the worker refuses in one line).

Method: a figure at a size is a *cell*.  Each cell's count of operations per repeat is chosen
from the time of a few after a warm-up so that a repeat takes about :data:`BUDGET_S` seconds,
between :data:`MIN_COUNT` and :data:`MAX_COUNT` (:func:`numba_pool_tools.bench.timing.calibrated`): Numba's
own manager pays about 1.3 ms per pinned pair at 4 KiB and 46 ms at 64 MiB, about 25 µs per
managed pair at any size, numba_pool's caches microseconds.
Then :data:`REPEATS` repeats, the cells of a part taking turns inside each repeat, on one CPU
core with the collector off (:func:`numba_pool_tools.bench.timing.quiet_host`); each part is a phase of
the lock-step turns (:data:`PHASES`).  Each repeat of a cell ends by carrying out the frees Numba
holds back (its manager's pending deallocations: Numba's own frees ``cuMemFree`` and
``cuMemFreeHost`` ten at a time), so that a repeat pays for its own frees and no other's.  A
figure is the median repeat divided by the count.

Expected time for the default manager, from the driver's figures: about 10 s on top of the
``cuda.device_array`` part for the pinned parts, that is 9 repeats of 2 x 30 ms + 3 x 46 ms for
each kind of pinned memory and of about 30 + 30 + 3 x 130 ms of batches, plus the calibrations
(measured on an H100: about 6 s); the managed parts about 3 s more (9 repeats of 3 x 30 ms of
pairs and of 30 + 30 + 3 x ~50 ms of batches, estimated, not yet measured).  A cell's repeats
cost at most ``MIN_COUNT`` operations or about ``BUDGET_S``, whichever is longer, so an
operation twice as slow as expected only lengthens the 64 MiB cells.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from typing import NamedTuple

import numpy as np

from .core import SIMULATOR, cuda, device_memory_info, has_cache
from .labels import size_label
from .timing import (calibrated, cached_jit, example_kernel, median_times_taking_turns, pairs_body, pending_frees,
                     quiet_host, seed_kernels)
from .turns import worker_turn

PINNED_PARTS = ("pinned", "pipeline")
MANAGED_PARTS = ("managed", "managed-pipeline")
PARTS = PINNED_PARTS + MANAGED_PARTS
PHASES = {part: phase for phase, part in enumerate(PARTS, start=1)}  # in lock-step turns (0: cuda.device_array)
SIZES = [4 << 10, 1 << 20, 64 << 20]  # bytes: pinned and managed arrays, and pipeline batches
SMALL_TEMPORARY = 4 << 10  # bytes: the pipeline's small device temporary
REPEATS = 9
BUDGET_S = 0.03  # seconds a repeat of a cell aims at
MIN_COUNT = 3  # operations per repeat, at least (64 MiB under Numba's own manager: ~46 ms each)
MAX_COUNT = 1000  # operations per repeat, at most
THREADS = 256
PINNED = "pinned_array_us"
MAPPED = "mapped_array_us"
PIPELINE = "pipeline_ms"
MANAGED = "managed_array_us"
MANAGED_PIPELINE = "managed_pipeline_ms"
FIELDS = (PINNED, MAPPED, PIPELINE, MANAGED, MANAGED_PIPELINE)
UNITS = {PINNED: 1e6, MAPPED: 1e6, PIPELINE: 1e3, MANAGED: 1e6, MANAGED_PIPELINE: 1e3}  # seconds -> the field's unit
#: Managed arrays of one size live at once at most, under any manager: the one in use, up to ten
#: frees Numba's own manager holds back (``CUDA_DEALLOCS_COUNT``), one more the flush is late for.
MANAGED_LIVE_AT_MOST = 12


@dataclasses.dataclass(frozen=True)
class Memory:
    """A kind of memory the host rows time, and how a worker says where it came from."""

    name: str  # as the tables say it: "pinned", "managed"
    parts: tuple[str, ...]  # its worker parts: allocate+free pairs, then a pipeline
    fields: tuple[str, ...]  # the fields of those parts in the worker's result
    cache_key: str  # the result's key: whether numba_pool's cache served it in every part
    source_key: str  # the result's key: where it came from, in words (:func:`memory_source`)
    cache: str  # the numba_pool manager's attribute holding its cache (and the cache's name)
    method: str  # the EMM method Numba calls for it
    driver_call: str  # what Numba's own ``method`` calls for each array


PINNED_MEMORY = Memory("pinned", PINNED_PARTS, (PINNED, MAPPED, PIPELINE), "host_cache", "pinned_from", "host",
                       "memhostalloc", "cuMemHostAlloc")
MANAGED_MEMORY = Memory("managed", MANAGED_PARTS, (MANAGED, MANAGED_PIPELINE), "managed_cache", "managed_from",
                        "managed", "memallocmanaged", "cuMemAllocManaged")
MEMORIES = (PINNED_MEMORY, MANAGED_MEMORY)


class Arguments(NamedTuple):
    """A worker's command line: the host parts to check and time, and whether to time the
    ``cuda.device_array`` part too."""

    parts: tuple[str, ...]
    device: bool


def parse_arguments(argv: list[str]) -> Arguments:
    """A worker's command line: ``--host PARTS`` (comma-separated, any of :data:`PARTS`, kept
    in that order; none without it) and ``--no-device`` (no ``cuda.device_array`` part).

    :raises SystemExit: (status 2, one line) for an unknown part, naming it.
    """
    parser = argparse.ArgumentParser(prog="python -m numba_pool_tools.bench")
    parser.add_argument("--host", default="", metavar="PARTS",
                        help=f"comma-separated host parts to check and time: {', '.join(PARTS)}")
    parser.add_argument("--no-device", action="store_true", help="do not time the cuda.device_array part")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.host.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"--host: unknown part {unknown[0]!r} (known: {', '.join(PARTS)})")
    return Arguments(tuple(p for p in PARTS if p in parts), not args.no_device)


def parse_parts(argv: list[str]) -> tuple[str, ...]:
    """The host parts of a worker's command line (:func:`parse_arguments`)."""
    return parse_arguments(argv).parts


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


def make_managed_batch():
    """``batch(source)``: one managed batch of the float32 NumPy array ``source``: a managed array
    of its size allocated, filled on the host, the increment kernel on it (legacy default
    stream), ``cuda.synchronize()``, and its sum read on the host.  Returns ``(array, sum)``; the
    caller drops the array."""
    managed_array, synchronize, float32, as_host = cuda.managed_array, cuda.synchronize, np.float32, np.asarray
    increment = example_kernel("increment_kernel")

    def batch(source):
        n = len(source)
        a = managed_array(n, dtype=float32)
        a[:] = source  # the host writes it at once
        increment[(n + THREADS - 1) // THREADS, THREADS](a)
        synchronize()
        return a, as_host(a).sum()  # the host reads it back

    return batch


def _batches(batch, args: tuple, count: int, flush):
    """A body: ``count`` x ``batch(*args)``, each output dropped at once, then ``flush()``."""

    def body():
        for _ in range(count):
            batch(*args)
        flush()

    return body


# -- checks, then timing --------------------------------------------------------------------

def check(parts: tuple, sizes: list[int] = SIZES) -> None:
    """Check each part's data at every size (bytes) under the current manager; for the managed
    parts, that the device has room for them first (:func:`check_room`).

    :raises SystemExit: naming the part and size, when the data is wrong: refusing to time.
    """
    if "pinned" in parts:
        for nbytes in sizes:
            _check_host_arrays(nbytes)
    if "pipeline" in parts:
        _check_pipeline(sizes)
    if set(MANAGED_PARTS) & set(parts):
        check_room(sizes, free_device_memory())
        _check_managed(sizes)


def room_needed(sizes: list[int]) -> int:
    """Bytes of device memory the managed parts may hold live at once: :data:`MANAGED_LIVE_AT_MOST`
    arrays of the largest of ``sizes`` (bytes)."""
    return MANAGED_LIVE_AT_MOST * max(sizes)


def check_room(sizes: list[int], free: int | None) -> None:
    """Refuse to time the managed parts where the device has less than :func:`room_needed`
    bytes ``free`` (``None``: not known, under the CUDA simulator).

    :raises SystemExit: one line naming both figures (bytes and MiB).
    """
    needed = room_needed(sizes)
    if free is not None and free < needed:
        raise SystemExit(f"bench: the managed rows need {needed} bytes ({needed >> 20} MiB: {MANAGED_LIVE_AT_MOST} "
                         f"arrays of {size_label(max(sizes))}) free on the device, it has {free} bytes "
                         f"({free >> 20} MiB): refusing to time (--no-managed-rows leaves them out)")


def free_device_memory() -> int | None:
    """The device's free memory in bytes (``cuMemGetInfo`` in the current context); ``None``
    under the CUDA simulator."""
    if SIMULATOR:
        return None
    cuda.current_context()  # the context Numba made current
    return int(device_memory_info()[0])


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


def _check_managed(sizes: list[int]) -> None:
    batch = make_managed_batch()
    for nbytes in sizes:
        source = source_for(nbytes // 4)
        array, total = batch(source)
        expected = source + np.float32(1)
        exact = float(expected.sum(dtype=np.float64))  # whole numbers: exact
        if not (np.array_equal(np.asarray(array), expected) and math.isclose(total, exact, rel_tol=1e-4)):
            raise SystemExit(f"bench: a managed array's data is wrong after the host's writes, the increment kernel "
                             f"and the host's read at {size_label(nbytes)}: refusing to time")
        del array


def measure(parts: tuple, sizes: list[int] = SIZES, repeats: int = REPEATS, budget_s: float = BUDGET_S) -> dict:
    """Time ``parts`` (after :func:`check`) on one CPU core with the collector off, each part a
    phase of the lock-step turns (:data:`PHASES`).  Returns ``{field: {size: median per
    operation}}`` for the fields of the parts (µs per pair, ms per batch; sizes in bytes),
    ``counts`` (``{field: {size: operations per repeat}}``), ``repeats``, and for each kind of
    memory (:data:`MEMORIES`) whether numba_pool's cache served it (``host_cache``,
    ``managed_cache``) and where it came from in words (``pinned_from``, ``managed_from``,
    :func:`memory_source`)."""
    flush = pending_frees()
    result: dict = {"repeats": repeats, "counts": {}}
    turn = worker_turn()  # lock-step turns: each part is a phase (numba_pool_tools.bench.turns)
    with quiet_host():
        for part in (p for p in PARTS if p in parts):  # the phases in order
            turn.enter_phase(PHASES[part])
            time_cells(result, CELLS[part](sizes, flush), repeats, budget_s)
    manager = getattr(cuda.current_context(), "memory_manager", None)
    for memory in MEMORIES:
        result[memory.cache_key] = has_cache(manager, memory.cache)
        result[memory.source_key] = memory_source(manager, memory)
    return result


def memory_source(manager, memory: Memory) -> str:
    """Where ``manager``'s ``memory`` (pinned or managed) comes from, in words: numba_pool's cache
    of it; a driver call per array (Numba's own ``memhostalloc`` or ``memallocmanaged``, which
    numba_pool's calls with its cache off, under either frontend); or the class whose method
    overrides Numba's."""
    if manager is None:
        return "no memory manager (the CUDA simulator)"
    if has_cache(manager, memory.cache):
        return f"numba_pool {memory.cache} cache"
    owner = next((c for c in type(manager).__mro__ if memory.method in vars(c)), type(manager))
    if owner.__module__.split(".")[0] in ("numba", "numba_cuda", "numba_cuda_mlir", "numba_pool"):
        return f"{memory.driver_call} per array"
    return f"{owner.__module__}.{owner.__qualname__}.{memory.method}"


def _pair_cells(allocators: tuple, sizes: list[int], flush) -> dict:
    """Cells of allocate+free pairs: ``allocators`` is ``((field, allocate), ...)``, each
    ``allocate(n, dtype=np.uint8)`` of every size (bytes)."""
    return {(field, nbytes): functools.partial(pairs_body, allocate, nbytes, np.uint8, flush=flush)
            for field, allocate in allocators for nbytes in sizes}


def _pinned_cells(sizes: list[int], flush) -> dict:
    return _pair_cells(((PINNED, cuda.pinned_array), (MAPPED, cuda.mapped_array)), sizes, flush)


def _managed_cells(sizes: list[int], flush) -> dict:
    return _pair_cells(((MANAGED, cuda.managed_array),), sizes, flush)


def _pipeline_cells(sizes: list[int], flush) -> dict:
    batch, stream = make_batch(), cuda.stream()
    return {(PIPELINE, nbytes): functools.partial(_batches, batch, (nbytes // 4, stream, source_for(nbytes // 4)),
                                                  flush=flush)
            for nbytes in sizes}


def _managed_pipeline_cells(sizes: list[int], flush) -> dict:
    batch = make_managed_batch()
    return {(MANAGED_PIPELINE, nbytes): functools.partial(_batches, batch, (source_for(nbytes // 4),), flush=flush)
            for nbytes in sizes}


#: Each part's cells, ``{(field, size): make}`` from ``(sizes, flush)``.
CELLS = {"pinned": _pinned_cells, "pipeline": _pipeline_cells, "managed": _managed_cells,
         "managed-pipeline": _managed_pipeline_cells}


def time_cells(result: dict, cells: dict, repeats: int, budget_s: float) -> None:
    """Calibrate every cell ``{(field, size): make}``, time them taking turns, and store the
    median per operation (the field's unit: µs per pair, ms per batch) and the count in
    ``result``."""
    counts, bodies = {}, {}
    for key, make in cells.items():
        counts[key], bodies[key] = calibrated(make, budget_s, MIN_COUNT, MAX_COUNT)
    for (field, nbytes), seconds in median_times_taking_turns(bodies, repeats).items():
        count = counts[(field, nbytes)]
        result.setdefault(field, {})[str(nbytes)] = seconds / count * UNITS[field]
        result["counts"].setdefault(field, {})[str(nbytes)] = count
