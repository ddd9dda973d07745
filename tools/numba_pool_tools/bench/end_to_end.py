"""``numba-pool-tools bench``'s end-to-end part, the parent's side: the memory managers measured, and
their workers run, one process per manager and round.

Numba binds the memory manager when it creates a context, so every manager runs in a fresh
subprocess (``python -m numba_pool_tools.bench``, :mod:`numba_pool_tools.bench.worker`) that prints one JSON
line of medians.  The parent renders the tables (:mod:`numba_pool_tools.bench.device_tables`): medians,
ratios to Numba's default manager and overhead above the no-op floor
(:mod:`numba_pool_tools.bench.noop`).

A repeat of a ``cuda.device_array`` size does :data:`~numba_pool_tools.bench.worker.MIN_PAIRS` to
:data:`~numba_pool_tools.bench.worker.MAX_PAIRS` pairs, as many as take about
:data:`~numba_pool_tools.bench.worker.PAIRS_BUDGET_S` (:func:`numba_pool_tools.bench.timing.calibrated`): a
pool's pair costs ~13 µs, so 1000, Numba's own ~200 µs at 64 MiB, so 100.  1000 pairs of every
size cost default's worker about 5 s a round, and two runs of five rounds no longer fitted in
one 10-minute call (docs/perf-notes.md).

Each figure is the median of :data:`~numba_pool_tools.bench.worker.REPEATS` timed repeats after a
warm-up, within one process (:data:`~numba_pool_tools.bench.timing.REPEATS_VARIABLE` sets another
count: the parent's warm-up rounds ask for 1, :data:`WARM_UP`).  The sizes take turns inside
each repeat (256 B, 64 KiB, 4 MiB, 64 MiB, 256 B, ...), and the managers run in interleaved
rounds (default, numba_pool, ..., default, ...; at least :data:`ROUNDS` by default); the table
shows the median over rounds.  Both so that a slow spell of the machine hits every cell alike:
timed one size after the other, the first size measured read up to 0.6 µs slower on the floor.
Every worker runs on one CPU core, the same for every manager
(:data:`~numba_pool_tools.bench.timing.CORE_VARIABLE`, else the lowest the parent may use), with the
collector off while it times (:func:`numba_pool_tools.bench.timing.quiet_host`): two processes of the
same code read up to 2 µs apart otherwise.  Per manager and figure, rounds whose largest over
smallest exceeds 1.10 are flagged (:mod:`numba_pool_tools.bench.checks`), as are rows below a floor.

With ``--host pinned,pipeline,managed,managed-pipeline`` (or some of them; the parent chooses
per manager, :func:`numba_pool_tools.bench.host_tables.plan`), the worker also checks and times the
host rows of :mod:`numba_pool_tools.bench.host_worker` (``cuda.pinned_array`` and ``mapped_array``
allocate+free, a batch pipeline; ``cuda.managed_array`` allocate+free, a managed pipeline),
returned under ``"host"``; with ``--no-device`` it times those alone, without the
``cuda.device_array`` rows.

Two floors: ``no-op floor`` (:class:`numba_pool_tools.bench.noop.NoopManager`, a finalizer that does
nothing, which Numba wraps in ``weakref.finalize`` as for RMM's and CuPy's plugins) and
``Numba alone`` (:class:`numba_pool_tools.bench.noop.BareNoopManager`, no finalizer: the least any
plugin can cost).  numba_pool releases its memory without ``weakref.finalize``
(:mod:`numba_pool.cuda.pointers`), so it can run below the first floor, never below the second.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import labels, launch, turns
from .anchors import RMM_VARIABLE
from .timing import CORE_VARIABLE, REPEATS_VARIABLE

ROUNDS = 5
WORKER = launch.WORKER_PACKAGE  # python -m WORKER: the worker (numba_pool_tools/bench/__main__.py)
MANAGER_VARIABLE = "NUMBA_CUDA_MEMORY_MANAGER"  # the module Numba takes its memory manager from


@dataclass(frozen=True)
class Manager:
    """A memory manager to benchmark: a label and the environment that selects it, and the
    worker module its process runs (``python -m numba_pool_tools.bench``; the overlap part's is
    :mod:`numba_pool_tools.bench.overlap`)."""

    label: str
    env: dict
    cwd: str | None = None  # a folder holding another numba_pool to import (a baseline)
    args: tuple = ()  # the worker's arguments: ("--host", "pinned,pipeline", "--no-device") ...
    module: str = WORKER  # python -m module: the worker


DEFAULT = Manager(labels.DEFAULT, {MANAGER_VARIABLE: "default"})
NUMBA_POOL = Manager(labels.NUMBA_POOL, {MANAGER_VARIABLE: "numba_pool", "NUMBA_POOL_ARENA": "0"})
ARENA = Manager(labels.ARENA, {MANAGER_VARIABLE: "numba_pool", "NUMBA_POOL_ARENA": "1"})
FLOOR = Manager(labels.NOOP_FLOOR, {MANAGER_VARIABLE: "numba_pool_tools.bench.noop", "NUMBA_POOL_NOOP_FINALIZER": "1"})
BARE_FLOOR = Manager(labels.REFERENCE, {MANAGER_VARIABLE: "numba_pool_tools.bench.noop", "NUMBA_POOL_NOOP_FINALIZER": "0"})
RMM = Manager(labels.RMM_POOL, {MANAGER_VARIABLE: "rmm.allocators.numba", RMM_VARIABLE: "pool"})
RMM_ASYNC = Manager(labels.RMM_ASYNC, {MANAGER_VARIABLE: "rmm.allocators.numba", RMM_VARIABLE: "cuda_async"})
CUPY = Manager(labels.CUPY, {MANAGER_VARIABLE: "numba_pool_tools.bench.anchors"})
MANAGERS = [DEFAULT, NUMBA_POOL, ARENA, FLOOR, BARE_FLOOR]
ANCHORS = [RMM, RMM_ASYNC, CUPY]  # rows when installed (numba_pool_tools.bench.anchors)


def baselines(folder: str) -> list[Manager]:
    """The numba_pool and arena rows again, importing the numba_pool installed in ``folder``
    (another version, to compare before and after a change in one run), with the worker of
    :func:`numba_pool_tools.bench.launch.worker_package`: the folder's own where it has one."""
    module = launch.worker_package(folder)
    return [Manager(m.label + labels.BASELINE_SUFFIX, m.env, folder, module=module) for m in (NUMBA_POOL, ARENA)]


WARM_UP = {REPEATS_VARIABLE: "1"}  # a warm-up round's workers: every figure once, untimed by the parent


def measure(manager: Manager, core: int | None = None, warm_up: bool = False) -> dict:
    """Run the worker for ``manager`` in a fresh Python process, pinned to ``core`` if given
    (``warm_up``: one repeat of each figure, :data:`WARM_UP`), under this process's frontend
    (:func:`numba_pool_tools.bench.launch.command`).

    :raises RuntimeError: when the worker fails, with its standard error, or ran under another
        frontend.
    """
    try:
        return launch.same_frontend(launch.run_module(manager.module, list(manager.args),
                                                      _worker_env(manager, core, warm_up), manager.cwd))
    except RuntimeError as err:
        raise RuntimeError(f"benchmark of {manager.label} failed: {err}") from None


def measure_round(managers: list[Manager], core: int,
                  warm_up: bool = False) -> dict[str, tuple[dict | RuntimeError, float]]:
    """Every manager's worker of one round at once, in lock-step turns on CPU core ``core``
    (:mod:`numba_pool_tools.bench.turns`; ``warm_up``: one repeat of each figure): ``{label: (result
    or the RuntimeError of a failed worker, seconds it held the turn)}``."""
    commands = {m.label: launch.command(m.module, list(m.args), _worker_env(m, core, warm_up), m.cwd)
                for m in managers}
    measured = {}
    for label, outcome in turns.run_in_turns(commands, core).items():
        try:
            result = launch.same_frontend(launch.last_json(outcome.status, outcome.stdout, outcome.stderr))
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
