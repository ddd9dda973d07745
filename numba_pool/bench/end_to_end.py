"""``numba-pool bench``: the benchmark loop of CUDA's memory-pool tutorials, per memory manager,
each in its own process.

Numba binds the memory manager when it creates a context, so every manager runs in a fresh
subprocess (``python -m numba_pool.bench MANAGER``) that prints one JSON line of medians.  The
parent renders the table: medians, ratios to Numba's default manager and overhead above the
no-op floor (:mod:`numba_pool.noop`).

Measured, after checking the kernel's output:

* benchmark loop (``seed_loop_ms`` in the JSON): 100 x (``cuda.device_array(2**20, float32)``, sqrt kernel, drop the array) on the
  default stream, bracketed by ``cuda.synchronize()``; milliseconds per 100 iterations.
* allocate + free: ``cuda.device_array`` of 256 B, 64 KiB, 4 MiB and 64 MiB (float32) and
  dropping it, in a loop ended by one ``cuda.synchronize()``; microseconds per pair.  A repeat
  of a size does :data:`MIN_PAIRS` to :data:`MAX_PAIRS` pairs, as many as take about
  :data:`PAIRS_BUDGET_S` (:func:`calibrated`): a pool's pair costs ~13 µs, so 1000, Numba's own
  ~200 µs at 64 MiB, so 100.  1000 pairs of every size cost default's worker about 5 s a round,
  and two runs of five rounds no longer fitted in one 10-minute call (docs/perf-notes.md).

Each figure is the median of :data:`REPEATS` timed repeats after a warm-up, within one process
(:data:`REPEATS_VARIABLE` sets another count: the parent's warm-up rounds ask for 1).  The sizes
take turns inside each repeat (256 B, 64 KiB, 4 MiB, 64 MiB, 256 B, ...), and the managers run in
interleaved rounds (default, numba_pool, ..., default, ...; at least :data:`ROUNDS` by default);
the table shows the median over rounds.  Both so that a slow spell of
the machine hits every cell alike: timed one size after the other, the first size measured read
up to 0.6 µs slower on the floor.  Every worker runs on one CPU core, the same for every manager
(:data:`CORE_VARIABLE`, else the lowest the parent may use), with the collector off while it
times (:func:`quiet_host`): two processes of the same code read up to 2 µs apart otherwise.
Per manager and figure, rounds whose largest over smallest exceeds 1.10 are flagged
(:mod:`numba_pool.bench_checks`), as are rows below a floor.

With ``--host pinned,pipeline`` (or one of the two; the parent chooses per manager,
:func:`numba_pool.bench_host_tables.plan`), the worker also checks and times the host rows of
:mod:`numba_pool.bench_host` (``cuda.pinned_array`` and ``mapped_array`` allocate+free, a batch
pipeline), returned under ``"host"``.

Two floors: ``no-op floor`` (:class:`numba_pool.noop.NoopManager`, a finalizer that does
nothing, which Numba wraps in ``weakref.finalize`` as for RMM's and CuPy's plugins) and
``Numba alone`` (:class:`numba_pool.noop.BareNoopManager`, no finalizer: the least any plugin
can cost).  numba_pool releases its memory without ``weakref.finalize``
(:mod:`numba_pool.pointer`), so it can run below the first floor, never below the second.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from . import checks
from .turns import TURNS_VARIABLE, pinned_thread, run_in_turns, worker_turn

SEED_ELEMENTS = 1 << 20
SEED_ITERATIONS = 100
SIZES = [256, 64 << 10, 4 << 20, 64 << 20]
REPEATS = 15
PAIRS_BUDGET_S = 0.015  # seconds a repeat of a device_array size aims at
MIN_PAIRS, MAX_PAIRS = 100, 1000  # allocate+free pairs per repeat of a size
ROUNDS = 5
CORE_VARIABLE = "NUMBA_POOL_BENCH_CORE"  # the CPU core every worker pins itself to
REPEATS_VARIABLE = "NUMBA_POOL_BENCH_REPEATS"  # timed repeats per figure, when not the default
#: The folder holding the numba_pool we are (numba_pool/bench/ is two levels below it).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Manager:
    """A memory manager to benchmark: a label and the environment that selects it."""

    label: str
    env: dict
    cwd: str | None = None  # a folder holding another numba_pool to import (a baseline)
    args: tuple = ()  # the worker's arguments: ("--host", "pinned,pipeline") for the host rows


DEFAULT = Manager(checks.DEFAULT, {"NUMBA_CUDA_MEMORY_MANAGER": "default"})
NUMBA_POOL = Manager("numba_pool", {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_POOL_ARENA": "0"})
ARENA = Manager("numba_pool arena", {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_POOL_ARENA": "1"})
FLOOR = Manager(checks.NOOP_FLOOR, {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool.bench.noop", "NUMBA_POOL_NOOP_FINALIZER": "1"})
BARE_FLOOR = Manager(checks.REFERENCE, {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool.bench.noop", "NUMBA_POOL_NOOP_FINALIZER": "0"})
RMM = Manager(checks.RMM_POOL, {"NUMBA_CUDA_MEMORY_MANAGER": "rmm.allocators.numba", "NUMBA_POOL_BENCH_RMM": "pool"})
RMM_ASYNC = Manager(checks.RMM_ASYNC, {"NUMBA_CUDA_MEMORY_MANAGER": "rmm.allocators.numba",
                                       "NUMBA_POOL_BENCH_RMM": "cuda_async"})
CUPY = Manager(checks.CUPY, {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool.bench.anchors"})
MANAGERS = [DEFAULT, NUMBA_POOL, ARENA, FLOOR, BARE_FLOOR]
ANCHORS = [RMM, RMM_ASYNC, CUPY]  # rows when installed (numba_pool.bench.anchors)


def baselines(folder: str) -> list[Manager]:
    """The numba_pool and arena rows again, importing the numba_pool installed in ``folder``
    (another version, to compare before and after a change in one run)."""
    return [Manager(f"{m.label} (baseline)", m.env, folder) for m in (NUMBA_POOL, ARENA)]


def size_label(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


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


# -- the worker: runs inside the subprocess ---------------------------------------------------

def _elapsed(body) -> float:
    """Seconds ``body()`` took; then, in lock-step turns (:mod:`numba_pool.bench_turns`), the
    turn goes to the next worker, outside the timed region."""
    t0 = time.perf_counter()
    body()
    seconds = time.perf_counter() - t0
    worker_turn().pass_turn()
    return seconds


def _median_time(body, repeats: int) -> float:
    return statistics.median(_elapsed(body) for _ in range(repeats))


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
    count = count_for(_elapsed(probe) / low, budget_s, low, high)
    return count, make(count)


def cached_jit(func):
    """``cuda.jit(cache=True)(func)``: compiled once into Numba's on-disk cache, then loaded.  A
    round's eight workers each compiled the bench's kernels again, about 2 s of every worker's
    turn on an H100 host (2026-11-22); the machine code is the same.  Falls back to ``cuda.jit``
    where Numba finds no writable cache folder (it raises ``RuntimeError``)."""
    from numba import cuda

    try:
        return cuda.jit(cache=True)(func)
    except RuntimeError:
        return cuda.jit(func)


@functools.cache
def seed_kernels() -> tuple:
    """``(fill_kernel, sqrt_kernel)`` of :mod:`numba_pool.kernels`, through :func:`cached_jit`."""
    from numba_pool.kernels import fill_kernel, sqrt_kernel

    return cached_jit(fill_kernel.py_func), cached_jit(sqrt_kernel.py_func)


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


def _median_times_taking_turns(bodies: dict, repeats: int) -> dict:
    """The median time of each body, the bodies taking turns inside each repeat."""
    times: dict = {key: [] for key in bodies}
    for _ in range(repeats):
        for key, body in bodies.items():
            times[key].append(_elapsed(body))
    return {key: statistics.median(samples) for key, samples in times.items()}


def run_worker(host_parts: tuple = ()) -> dict:
    """Check, then time, under whatever manager the environment selected. Returns medians:
    ``seed_loop_ms`` and ``alloc_free_us`` keyed by the size in bytes as a string (JSON); with
    ``host_parts`` (:data:`numba_pool.bench_host.PARTS`), their figures under ``"host"``."""
    repeats = worker_repeats(REPEATS)  # a bad value ends the worker before it touches CUDA
    import numpy as np
    from numba import cuda

    if os.environ.get("NUMBA_POOL_BENCH_RMM"):
        from .anchors import prepare_rmm

        prepare_rmm(os.environ["NUMBA_POOL_BENCH_RMM"])
    fill_kernel, sqrt_kernel = seed_kernels()

    threads = 256
    blocks = (SEED_ELEMENTS + threads - 1) // threads
    expected = np.sqrt(np.arange(SEED_ELEMENTS, dtype=np.float64)).astype(np.float32)

    # Check: the kernel computes the right thing in memory from this manager.
    d = cuda.device_array(SEED_ELEMENTS, dtype=np.float32)
    sqrt_kernel[blocks, threads](d)
    if not np.allclose(d.copy_to_host(), expected, rtol=1e-6):
        raise SystemExit("bench: sqrt kernel output is wrong: refusing to time")
    del d
    for nbytes in SIZES:
        n = nbytes // 4
        a = cuda.device_array(n, dtype=np.float32)
        fill_kernel[(n + threads - 1) // threads, threads](a, np.float32(nbytes))
        if not (a.copy_to_host() == np.float32(nbytes)).all():
            raise SystemExit(f"bench: fill kernel output is wrong at {nbytes} bytes: refusing to time")
        del a
    if host_parts:
        from . import host_worker

        host_worker.check(host_parts)

    def seed_loop():
        cuda.synchronize()
        for _ in range(SEED_ITERATIONS):
            arr = cuda.device_array(SEED_ELEMENTS, dtype=np.float32)
            sqrt_kernel[blocks, threads](arr)
            del arr
        cuda.synchronize()

    with quiet_host() as core:
        seed_loop()  # warm-up
        result = {"seed_loop_ms": _median_time(seed_loop, repeats) * 1e3, "core": core}

        counts, pairs = {}, {}
        for nbytes in SIZES:
            make = functools.partial(_allocate_and_free, nbytes // 4)
            counts[str(nbytes)], pairs[str(nbytes)] = calibrated(make, PAIRS_BUDGET_S, MIN_PAIRS, MAX_PAIRS)
        medians = _median_times_taking_turns(pairs, repeats)
        result["alloc_free_us"] = {key: t / counts[key] * 1e6 for key, t in medians.items()}
        result["pairs"] = counts
        manager = cuda.current_context().memory_manager
        result["manager"] = type(manager).__module__
        if getattr(getattr(manager, "_pool", None), "handle", None) is not None:
            result["driver_pair_us"] = _driver_pair_us(manager._pool.handle, repeats)
    if host_parts:
        result["host"] = host_worker.measure(host_parts, repeats=worker_repeats(host_worker.REPEATS))
    return result


def _allocate_and_free(n: int, count: int):
    """A body that allocates and drops a float32 device array of ``n`` elements ``count``
    times, then carries out the frees Numba holds back (:func:`pending_frees`) and
    synchronizes: each repeat pays for its own frees, not for up to ten of the size before."""
    import numpy as np
    from numba import cuda

    flush_pending = pending_frees()

    def flush():
        flush_pending()
        cuda.synchronize()

    return pairs_body(cuda.device_array, n, np.float32, count, flush)


def pending_frees():
    """A function that carries out the frees the current context's manager holds back (Numba's
    pending deallocations, ``cuMemFree`` and ``cuMemFreeHost`` ten at a time under its own
    manager); a no-op for a manager without them (and under the simulator)."""
    from numba import cuda

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


def _driver_pair_us(pool, repeats: int) -> float:
    """What a ``cuMemAllocFromPoolAsync`` + ``cuMemFreeAsync`` pair of 256 B costs from Python
    alone (legacy default stream): the part of numba_pool's cost no Python code can remove."""
    from cuda.bindings import driver as cu

    stream = cu.CUstream(cu.CU_STREAM_LEGACY)
    alloc, free = cu.cuMemAllocFromPoolAsync, cu.cuMemFreeAsync

    def pairs():
        for _ in range(MAX_PAIRS):
            free(alloc(256, pool, stream)[1], stream)
        cu.cuCtxSynchronize()

    pairs()
    return _median_time(pairs, repeats) / MAX_PAIRS * 1e6


# -- the parent -------------------------------------------------------------------------------

WARM_UP = {REPEATS_VARIABLE: "1"}  # a warm-up round's workers: every figure once, untimed by the parent


def measure(manager: Manager, core: int | None = None, warm_up: bool = False) -> dict:
    """Run the worker for ``manager`` in a fresh Python process, pinned to ``core`` if given
    (``warm_up``: one repeat of each figure, :data:`WARM_UP`).

    :raises RuntimeError: when the worker fails, with its standard error.
    """
    try:
        return run_module("numba_pool.bench", list(manager.args), _worker_env(manager, core, warm_up), manager.cwd)
    except RuntimeError as err:
        raise RuntimeError(f"benchmark of {manager.label} failed: {err}") from None


def measure_round(managers: list[Manager], core: int,
                  warm_up: bool = False) -> dict[str, tuple[dict | RuntimeError, float]]:
    """Every manager's worker of one round at once, in lock-step turns on CPU core ``core``
    (:mod:`numba_pool.bench_turns`; ``warm_up``: one repeat of each figure): ``{label: (result
    or the RuntimeError of a failed worker, seconds it held the turn)}``."""
    commands = {m.label: _command("numba_pool.bench", list(m.args), _worker_env(m, core, warm_up), m.cwd)
                for m in managers}
    measured = {}
    for label, outcome in run_in_turns(commands, core).items():
        try:
            result = _last_json(outcome.status, outcome.stdout, outcome.stderr)
            if not outcome.took_turns:
                raise RuntimeError("it took no turns (a numba_pool from before lock-step turns, as a --baseline "
                                   "may be): its figures were timed while the others started; use --no-turns")
            measured[label] = (result, outcome.busy_s)
        except RuntimeError as error:
            measured[label] = (RuntimeError(f"benchmark of {label} failed: {error}"), outcome.busy_s)
    return measured


def _worker_env(manager: Manager, core: int | None, warm_up: bool) -> dict:
    """The variables a worker for ``manager`` gets on top of this process's: the manager's,
    :data:`WARM_UP` in a warm-up round, and :data:`CORE_VARIABLE` where a core is given."""
    env = {**manager.env, **(WARM_UP if warm_up else {})}
    return env if core is None else {**env, CORE_VARIABLE: str(core)}


def run_module(module: str, args: list[str], env: dict | None = None, cwd: str | None = None) -> dict:
    """Run ``python -m module args`` in a fresh process and parse the JSON line it prints last.

    :raises RuntimeError: when it fails, with its exit status and standard error.
    """
    argv, env, cwd = _command(module, args, env or {}, cwd)
    core = env.get(CORE_VARIABLE, "").strip()
    # Pinned from its first instruction, not only once it times: the memory it allocates while
    # it imports and creates its context is then placed for the core it is timed on.
    with pinned_thread(int(core) if core else None):
        proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    return _last_json(proc.returncode, proc.stdout, proc.stderr)


def _command(module: str, args: list[str], env: dict, cwd: str | None) -> tuple[list[str], dict, str]:
    inherited = {k: v for k, v in os.environ.items() if k != REPEATS_VARIABLE}  # only warm-up rounds set it
    env = {**inherited, **env, "PYTHONUNBUFFERED": "1"}
    env.pop(TURNS_VARIABLE, None)  # only run_in_turns gives a worker its pipes
    # Start in the folder holding the numba_pool we are, so that the worker imports the same
    # one and not a source checkout in the current directory (which lacks numba_pool.kernels).
    here = cwd or PACKAGE_PARENT
    return [sys.executable, "-m", module, *args], env, here


def _last_json(status: int, stdout: str, stderr: str) -> dict:
    lines = stdout.strip().splitlines()
    if status != 0 or not lines:
        raise RuntimeError(f"exit {status}:\n{stderr.strip()[-3000:]}")
    return json.loads(lines[-1])


def median_over_rounds(rounds: list[dict]) -> dict:
    """Combine one manager's results from several rounds: the median of each figure, and each
    round's figures (``rounds_seed_loop_ms``, ``rounds_alloc_free_us``) for the checks."""
    merged = {"seed_loop_ms": statistics.median(r["seed_loop_ms"] for r in rounds),
              "alloc_free_us": {k: statistics.median(r["alloc_free_us"][k] for r in rounds)
                                for k in rounds[0]["alloc_free_us"]},
              "manager": rounds[0]["manager"], "rounds": len(rounds),
              "rounds_seed_loop_ms": [r["seed_loop_ms"] for r in rounds],
              "rounds_alloc_free_us": {k: [r["alloc_free_us"][k] for r in rounds] for k in rounds[0]["alloc_free_us"]}}
    pairs = [r["driver_pair_us"] for r in rounds if "driver_pair_us" in r]
    if pairs:
        merged["driver_pair_us"] = statistics.median(pairs)
    if "core" in rounds[0]:
        merged["core"] = rounds[0]["core"]
    if all("pairs" in r for r in rounds):
        merged["rounds_pairs"] = [r["pairs"] for r in rounds]  # pairs per repeat, by size
    return merged


def ratios_to_default(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per manager, how many times faster than default (:func:`ratio_to_default`): ``seed loop``
    and each allocate+free size (bytes, as a string); empty without a default row."""
    default = results.get(DEFAULT.label)
    if default is None:
        return {}
    return {label: {checks.SEED_LOOP: ratio_to_default(default, r, "seed_loop_ms"),
                    **{k: ratio_to_default(default, r, "alloc_free_us", k) for k in r["alloc_free_us"]}}
            for label, r in results.items()}


def ratio_to_default(default: dict, row: dict, field: str, key: str | None = None) -> float:
    """How many times faster ``row`` is than ``default`` at ``field`` (``field[key]`` with a
    ``key``): :func:`paired_ratio` of their ``rounds_<field>`` where both kept their rounds,
    else the ratio of their figures (medians)."""
    def at(figures: dict, name: str):
        value = figures.get(name)
        return value if key is None or value is None else value.get(key)

    default_rounds, row_rounds = at(default, f"rounds_{field}"), at(row, f"rounds_{field}")
    if default_rounds is not None and row_rounds is not None:
        return paired_ratio(default_rounds, row_rounds)
    return at(default, field) / at(row, field)


def paired_ratio(default_rounds: list[float], row_rounds: list[float]) -> float:
    """Default's time over a row's, round by round, and the median of those ratios: the two
    workers of a round ran minutes apart at most, so a slow spell of the machine that lasts
    longer cancels in their ratio, where a ratio of the medians over rounds keeps it.  Lists of
    different lengths cannot be paired (a round missing from one of them would shift every
    later pair): then the ratio of their medians."""
    if len(default_rounds) != len(row_rounds):
        return statistics.median(default_rounds) / statistics.median(row_rounds)
    return statistics.median(d / r for d, r in zip(default_rounds, row_rounds))


def _mark(cell: str, figure: str, label: str, marked: set) -> str:
    return cell + " !" if (figure, label) in marked else cell


def render_ratios(results: dict[str, dict], flags: list = ()) -> str:
    """Per manager, how many times faster than default (default's time / the manager's), for the
    seed loop and each allocate+free size; a cell whose figure a check flagged ends in ``!``."""
    from tabulate import tabulate

    marked = checks.flagged(list(flags), "end to end")
    ratios = ratios_to_default(results)
    figures = [checks.SEED_LOOP] + [str(s) for s in SIZES]
    rows = [[label] + [_mark(f"{r[f]:.2f}", f, label, marked) for f in figures] for label, r in ratios.items()]
    headers = ["manager (x faster than default)", f"benchmark loop ({SEED_ITERATIONS} it.)"]
    headers += [f"{size_label(s)} alloc+free" for s in SIZES]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def render_ratio_runs(runs: list[dict[tuple[str, str, str], float]], flags: list = ()) -> str:
    """The end-to-end ratios to default of several runs side by side, ``{(table, figure, row):
    x faster}`` each: a line per table, figure and row, a column per run, and the runs' largest
    over smallest; a line that a check flagged ends in ``!``."""
    from tabulate import tabulate

    marked = {(f.table.removesuffix(" runs"), f.figure, f.label) for f in flags}
    rows = []
    for key in runs[0]:
        values = [run.get(key) for run in runs]
        if any(v is None for v in values):
            continue
        table, figure, label = key
        spread = f"{max(values) / min(values):.3f}" + (" !" if key in marked else "")
        rows.append([table, checks.figure_label(figure), label, *(f"{v:.3g}" for v in values), spread])
    headers = ["table", "figure", "manager", *(f"run {n + 1}" for n in range(len(runs))), "max/min"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def render(results: dict[str, dict], flags: list = ()) -> str:
    """The bench table: one row per manager, medians with the ratio to default, and each
    allocate+free time's difference (µs) from the no-op floor and from Numba alone; a cell
    that a check flagged (:mod:`numba_pool.bench_checks`) ends in ``!``."""
    from tabulate import tabulate

    marked = checks.flagged(list(flags), "end to end")
    ratios = ratios_to_default(results)
    present = [f.label for f in (FLOOR, BARE_FLOOR) if f.label in results]
    floors = [results[label] for label in present]
    vs = f" ({', '.join(present)})" if present else ""
    headers = ["manager", f"benchmark loop ({SEED_ITERATIONS} it.) ms", "x faster than default"]
    headers += [f"{size_label(s)} alloc+free us{vs}" for s in SIZES]
    rows = []
    for label, r in results.items():
        row = [label, _mark(f"{r['seed_loop_ms']:.3f}", checks.SEED_LOOP, label, marked)]
        row.append(f"{ratios[label][checks.SEED_LOOP]:.2f}" if ratios else "-")
        for s in SIZES:
            us = r["alloc_free_us"][str(s)]
            cell = f"{us:.2f}"
            if floors:
                cell += " (" + ", ".join(f"{us - f['alloc_free_us'][str(s)]:+.2f}" for f in floors) + ")"
            row.append(_mark(cell, str(s), label, marked))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)

