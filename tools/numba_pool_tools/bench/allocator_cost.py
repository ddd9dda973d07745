"""Allocator cost in one process: ``memalloc`` + release, managers taking turns in short blocks.

``numba-pool-tools bench`` times ``cuda.device_array`` per manager in separate processes, and two
processes of the same program differ by up to ±4 µs on a lent GPU host (placement, caches),
more than the differences between allocators.  Here every allocator runs in one process, on
the context Numba made, called directly as Numba calls it (``memalloc(size)``, then the
pointer is dropped): numba_pool in mempool and arena mode, the two floors of
:mod:`numba_pool_tools.bench.noop`, optionally another installed numba_pool (a baseline, imported under
another name), and the anchors of :mod:`numba_pool_tools.bench.anchors` (RMM's plugin on its pool and on
``cuda_async``, a plugin on CuPy's pool) where installed.  Numba's own ``DeviceNDArray`` cost is
not part of these figures.

Method: for each size, :data:`REPEATS` repeats; in each, every allocator runs one block of
:data:`PAIRS` pairs, in an order rotated from repeat to repeat (A B C, B C A, ...), with the
collector off, the process on one CPU core and the context synchronized (untimed) after each
block.  A slow spell of the host then hits neighbouring blocks of different allocators alike.
Differences are taken *within* a repeat (paired), and reported as their median with a 95 %
distribution-free confidence interval (order statistics of the binomial, as for a sign test).

The host's speed changes between runs (``Numba alone`` read 1.04 µs, then 0.53 µs, per pair on one
H100 in one session) and the µs with it; what holds is the ratio of an allocator's overhead to
the no-op floor's, both above ``Numba alone``: per repeat ``(t_x - t_alone) / (t_floor - t_alone)``,
reported as the median with its 95 % interval by the same method (:func:`paired_ratios`).  The
tables are checked (:mod:`numba_pool_tools.bench.checks`): a row below a floor is flagged, and so are
ratios of runs (``numba-pool-tools bench --repeat-run N``) more than 10 % apart.

The allocation history's rows (:mod:`numba_pool_tools.bench.history_cost`) take their turns in the same
repeats: numba_pool's paths after :func:`numba_pool.record_history` was switched on and off (the
``numba_pool`` rows themselves) beside paths it never touched, and the same paths recording,
without stacks and with Python stacks at several depths; the history's own table shows them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from functools import partial
from typing import Callable

from . import checks, history_cost
from .core import FRONTEND, cuda
from .labels import (ARENA, BASELINE_SUFFIX, NEVER_RECORDED_SUFFIX, NOOP_FLOOR, NUMBA_POOL, PLAIN_SUFFIX, REFERENCE,
                     is_history_row, size_label)
from .timing import quiet_host

SIZES = [256, 64 << 10, 4 << 20]
REPEATS = 201
PAIRS = 200
FLOOR = NOOP_FLOOR


@dataclass(frozen=True)
class Difference:
    """A paired difference in µs per allocate+free pair: the median and its 95 % interval."""

    median: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.median:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def median_interval(samples: list[float], z: float = 1.96) -> Difference:
    """The median of ``samples`` with a distribution-free confidence interval: the order
    statistics ``k`` and ``n - k + 1`` where ``k = floor((n - z sqrt(n)) / 2)`` (the normal
    approximation of the binomial; Conover, *Practical Nonparametric Statistics*, 3.2).

    :raises ValueError: for fewer than 6 samples, too few for a 95 % interval.
    """
    n = len(samples)
    if n < 6:
        raise ValueError(f"a 95% interval of a median needs at least 6 samples, got {n}")
    ordered = sorted(samples)
    k = max(1, math.floor((n - z * math.sqrt(n)) / 2))
    return Difference(statistics.median(ordered), ordered[k - 1], ordered[n - k])


def paired_differences(times: dict[str, list[float]], against: str) -> dict[str, Difference]:
    """Each allocator's per-repeat time minus ``against``'s in the same repeat (µs)."""
    reference = times[against]
    return {label: median_interval([t - r for t, r in zip(samples, reference)])
            for label, samples in times.items() if label != against}


def paired_ratios(times: dict[str, list[float]], reference: str = REFERENCE,
                  floor: str = FLOOR) -> dict[str, Difference]:
    """Each allocator's overhead above ``reference`` over ``floor``'s, per repeat:
    ``(t_x - t_ref) / (t_floor - t_ref)`` (no unit), as a median with its 95 % interval.  Repeats
    where the floor's overhead is exactly zero are left out.  Neither the reference nor the floor
    get a ratio (0 and 1 by definition)."""
    ref, flo = times[reference], times[floor]
    ratios = {}
    for label, samples in times.items():
        if label in (reference, floor):
            continue
        ratios[label] = median_interval([(t - r) / (f - r) for t, r, f in zip(samples, ref, flo) if f != r])
    return ratios


def import_baseline(folder: str):
    """The ``numba_pool`` package installed in ``folder``, imported as ``numba_pool_baseline``
    (its imports inside the package are relative, so it does not mix with ours)."""
    init = Path(folder) / "numba_pool" / "__init__.py"
    if not init.is_file():
        raise FileNotFoundError(f"--baseline {folder}: no numba_pool/__init__.py in it")
    spec = importlib.util.spec_from_file_location("numba_pool_baseline", init,
                                                  submodule_search_locations=[str(init.parent)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["numba_pool_baseline"] = package
    spec.loader.exec_module(package)
    return package


def pool_manager(package, context, arena: bool, **options):
    """A numba_pool manager of ``package`` (ours, or a baseline's) on ``context``, its own
    private pool, initialized with the defaults, ``arena`` and ``options``
    (``package.config.load``).  A package with ``plugin/manager.py`` takes the configuration as
    the manager's argument; one from before it, as a process-wide setting (``_set_config``)."""
    config = importlib.import_module(f"{package.__name__}.config").load(environ={}, arena=arena, **options)
    module = manager_module(package)
    if _has_plugin_manager(package):
        manager = module.NumbaPoolManager(context=context, config=config)
    else:
        module._set_config(config)
        manager = module.NumbaPoolManager(context=context)
    manager.initialize()
    return manager


def manager_module(package):
    """The module of ``package`` (a numba_pool) that defines ``NumbaPoolManager``:
    ``plugin.manager`` where the package has one, else ``manager`` (a numba_pool from before)."""
    suffix = "plugin.manager" if _has_plugin_manager(package) else "manager"
    return importlib.import_module(f"{package.__name__}.{suffix}")


def _has_plugin_manager(package) -> bool:
    return (Path(package.__file__).parent / "plugin" / "manager.py").is_file()


def measured_packages(baseline: str | None = None) -> list[tuple]:
    """``(package, label suffix)`` of each numba_pool measured: ours (``""``), then the
    ``baseline``'s where given (:data:`BASELINE_SUFFIX`, :func:`import_baseline`)."""
    import numba_pool

    return [(numba_pool, "")] + ([(import_baseline(baseline), BASELINE_SUFFIX)] if baseline else [])


def allocators(context, baseline: str | None = None, plain: bool = False,
               history: bool = False) -> tuple[dict[str, Callable[[int], object]], dict[str, object]]:
    """The ``memalloc`` of each allocator measured, by label, and the numba_pool managers behind
    them (``{label: manager}``); ``plain`` adds numba_pool on a pool that is neither exportable
    nor reachable from peers.  With ``history``, numba_pool's own managers are taken after the
    history was switched on and off (:func:`numba_pool_tools.bench.history_cost.switch_on_and_off`),
    and two more, made after it, are the paths it never touched (:data:`NEVER_RECORDED_SUFFIX`).

    :raises numba_pool_tools.bench.history_cost.HistoryBenchError: when switching the history left a
        path changed.
    """
    import numba_pool
    from .noop import BareNoopManager, NoopManager

    managers = {}
    for package, suffix in measured_packages(baseline):
        for arena, label in ((False, NUMBA_POOL), (True, ARENA)):
            managers[label + suffix] = pool_manager(package, context, arena)
            if plain and not suffix:
                managers[label + PLAIN_SUFFIX] = pool_manager(package, context, arena, ipc=False, peer_access="none")
    if history:
        history_cost.switch_on_and_off({label: m for label, m in managers.items() if not label.endswith(BASELINE_SUFFIX)})
        for arena, label in ((False, NUMBA_POOL), (True, ARENA)):
            managers[label + NEVER_RECORDED_SUFFIX] = pool_manager(numba_pool, context, arena)
    chosen = {label: manager.memalloc for label, manager in managers.items()}
    for cls, label in ((NoopManager, NOOP_FLOOR), (BareNoopManager, REFERENCE)):
        floor = cls(context=context)
        floor.initialize()
        chosen[label] = floor.memalloc
    return chosen, managers


def _block(memalloc: Callable[[int], object], size: int, pairs: int) -> float:
    clock = time.perf_counter
    t0 = clock()
    for _ in range(pairs):
        pointer = memalloc(size)
        del pointer
    return (clock() - t0) / pairs * 1e6


def time_in_turns(memallocs: dict, size: int, repeats: int = REPEATS, pairs: int = PAIRS,
                  synchronize: Callable[[], None] = lambda: None,
                  prepare: dict[str, Callable[[], None]] | None = None,
                  blocks: dict[str, Callable] | None = None) -> dict[str, list[float]]:
    """µs per allocate+free pair of ``size`` bytes, per allocator and repeat, the allocators
    taking turns in rotated order; one untimed warm-up block each first.  ``prepare[label]``,
    where given, is called untimed before each block of ``label`` (RMM's current resource);
    ``blocks[label]``, where given, times ``label``'s blocks in place of the plain block, with
    the same arguments (the history's rows: the block called at a stack depth)."""
    labels = list(memallocs)
    before = prepare or {}
    timed = {label: (blocks or {}).get(label, _block) for label in labels}
    times: dict[str, list[float]] = {label: [] for label in labels}
    for label in labels:
        before.get(label, _nothing)()
        timed[label](memallocs[label], size, pairs)
    synchronize()
    for repeat in range(repeats):
        shift = repeat % len(labels)
        for label in labels[shift:] + labels[:shift]:
            before.get(label, _nothing)()
            times[label].append(timed[label](memallocs[label], size, pairs))
            synchronize()
    return times


def _nothing() -> None:
    pass


def run(baseline: str | None = None, sizes=SIZES, repeats: int = REPEATS, plain: bool = False,
        anchors: bool = False, history: bool = True) -> dict:
    """Measure in this process (it creates the CUDA context of the bench's frontend,
    :data:`numba_pool_tools.bench.core.FRONTEND`), on one CPU core with the collector off
    (:func:`numba_pool_tools.bench.timing.quiet_host`).  Returns ``{"sizes": {size: {label: row}},
    "notes": [...], "core": n, "frontend": name}``: per size, each allocator's median µs per
    pair, its paired difference (µs) from :data:`REFERENCE` and from :data:`FLOOR`, its ratio to
    the floor's overhead (:func:`paired_ratios`), and its paired difference from its counterpart
    without the baseline or plain-pool suffix where there is one; with ``history``, the
    allocation history's rows too (:mod:`numba_pool_tools.bench.history_cost`, :func:`rows_of`).
    ``notes``: anchors left out, recorded depths other than wanted, one line each."""
    context = cuda.current_context()
    memallocs, managers = allocators(context, baseline, plain, history)
    prepare, notes = {}, []
    if anchors:
        from . import anchors as anchor_module

        extra, prepare, notes = anchor_module.in_process(context)
        memallocs.update(extra)
    recorded = history_cost.recorded(managers) if history else []
    memallocs.update({row.label: row.memalloc for row in recorded})
    results = {}
    with quiet_host() as core:
        blocks = history_cost.ready(recorded, _block, sizes[0], PAIRS, cuda.synchronize)
        for size in sizes:
            times = time_in_turns(memallocs, size, repeats, synchronize=cuda.synchronize, prepare=prepare, blocks=blocks)
            results[str(size)] = rows_of(times, history_cost.about(recorded))
    return {"sizes": results, "notes": notes + history_cost.notes(recorded), "core": core, "frontend": FRONTEND.name}


#: The managed table's row for Numba's own manager (``cuMemAllocManaged`` per array).
NUMBA_MANAGED = "Numba's manager"


def managed_allocators(context, baseline: str | None = None) -> dict[str, Callable[[int], object]]:
    """``memallocmanaged`` by label: numba_pool's managed cache in mempool and arena mode (a
    manager each, the default configuration, ``NUMBA_POOL_MANAGED`` on), the ``baseline``'s
    likewise, and the context's own manager (Numba's, when the process names no plugin)."""
    managers = {label + suffix: pool_manager(package, context, arena)
                for package, suffix in measured_packages(baseline) for arena, label in ((False, NUMBA_POOL), (True, ARENA))}
    managers[NUMBA_MANAGED] = context.memory_manager
    # Numba's own takes attach_global as a positional argument, without a default.
    return {label: partial(manager.memallocmanaged, attach_global=True) for label, manager in managers.items()}


def run_managed(baseline: str | None = None, size: int = 4 << 10, repeats: int = REPEATS) -> dict[str, dict]:
    """Managed memory's allocate+free pairs (``memallocmanaged(size)``, ``size`` bytes, then the
    pointer dropped) timed in this process as :func:`run` times device memory: the allocators
    of :func:`managed_allocators` taking turns, on one core with the collector off.  Returns
    ``{label: {"median_us", "vs_baseline", "vs_numba"}}`` (paired differences in µs with their
    95 % intervals; None where there is no counterpart)."""
    context = cuda.current_context()
    memallocs = managed_allocators(context, baseline)
    with quiet_host():
        times = time_in_turns(memallocs, size, repeats, synchronize=cuda.synchronize)
    versus_numba = paired_differences(times, NUMBA_MANAGED)
    return {label: {"median_us": statistics.median(samples), "vs_baseline": _versus(times, label, BASELINE_SUFFIX),
                    "vs_numba": _as_dict(versus_numba.get(label))}
            for label, samples in times.items()}


def render_managed(rows: dict[str, dict], size: int = 4 << 10) -> str:
    """:func:`run_managed`'s table: µs per pair and the paired differences, with their intervals."""
    from tabulate import tabulate

    def cell(d: dict | None) -> str:
        return "" if d is None else str(Difference(d["median"], d["low"], d["high"]))

    table = [[size_label(size), label, f"{r['median_us']:.2f}", cell(r["vs_numba"]), cell(r["vs_baseline"])]
             for label, r in rows.items()]
    return tabulate(table, headers=["size", "managed allocator", "us per pair", f"vs {NUMBA_MANAGED}, us [95% CI]",
                                    "vs baseline, us [95% CI]"], tablefmt="github", disable_numparse=True)


def rows_of(times: dict[str, list[float]], history: dict[str, dict] | None = None) -> dict[str, dict]:
    """One size's table rows from its times (µs per pair, per allocator and repeat): per
    allocator, the median and its paired differences and ratio (:func:`run`).  ``history``
    (``{label: {"of", "stacks", "depth", "frames"}}``, :func:`numba_pool_tools.bench.history_cost.about`)
    names the recorded rows: each gets ``history``, that with ``added``, its paired difference
    from the path it records (``of``); a path with a counterpart the history never touched gets
    ``vs_never_recorded``."""
    above, over_floor, ratios = paired_differences(times, REFERENCE), paired_differences(times, FLOOR), paired_ratios(times)
    rows = {label: {"median_us": statistics.median(samples),
                    "above_reference": _as_dict(above.get(label)),
                    "above_floor": _as_dict(over_floor.get(label)),
                    "ratio_to_floor": _as_dict(ratios.get(label)),
                    "vs_baseline": _versus(times, label, BASELINE_SUFFIX),
                    "vs_plain": _versus(times, label, PLAIN_SUFFIX),
                    "vs_never_recorded": _versus(times, label, NEVER_RECORDED_SUFFIX),
                    "history": None}
            for label, samples in times.items()}
    for label, recorded in (history or {}).items():
        if label in rows:
            of = recorded["of"]
            added = (paired_differences({label: times[label], of: times[of]}, of)[label] if of in times else None)
            rows[label]["history"] = {**recorded, "added": _as_dict(added)}
    return rows


def _versus(times: dict[str, list[float]], label: str, suffix: str) -> dict | None:
    counterpart = label + suffix
    if counterpart not in times:
        return None
    return _as_dict(paired_differences({label: times[label], counterpart: times[counterpart]}, counterpart)[label])


def _as_dict(difference: Difference | None) -> dict | None:
    return None if difference is None else {"median": difference.median, "low": difference.low, "high": difference.high}


def render(results: dict, flags: list = ()) -> str:
    """The table: per size and allocator, the median µs per pair, the paired difference from
    Numba alone, the ratio of its overhead to the no-op floor's, and the paired difference from
    the baseline where there is one, each with its 95 % interval.  A row that a check flagged
    (:mod:`numba_pool_tools.bench.checks`) has ``!`` after its allocator.  The allocation history's
    rows are left to their own table (:func:`numba_pool_tools.bench.history_cost.render`)."""
    from tabulate import tabulate

    def cell(d: dict | None) -> str:
        return "" if d is None else str(Difference(d["median"], d["low"], d["high"]))

    def ratio(d: dict | None) -> str:
        return "" if d is None else f"{d['median']:.2f} [{d['low']:.2f}, {d['high']:.2f}]"

    marked = checks.flagged(list(flags), "allocator") | checks.flagged(list(flags), "allocator runs")
    rows = []
    for size, per_label in results.items():
        for label, r in per_label.items():
            if is_history_row(label):
                continue  # the history's own table (numba_pool_tools.bench.history_cost.render)
            shown = label + " !" if (size, label) in marked else label
            rows.append([size_label(int(size)), shown, f"{r['median_us']:.2f}", cell(r["above_reference"]),
                         ratio(r.get("ratio_to_floor")), cell(r.get("vs_baseline")), cell(r.get("vs_plain"))])
    headers = ["size", "allocator", "us per pair", f"vs {REFERENCE}, us [95% CI]",
               f"overhead / {FLOOR}'s [95% CI]", "vs baseline, us [95% CI]", "vs plain pool, us [95% CI]"]
    used = [i for i in range(len(headers)) if i < 4 or any(row[i] for row in rows)]
    return tabulate([[row[i] for i in used] for row in rows], headers=[headers[i] for i in used],
                    tablefmt="github", disable_numparse=True)


def render_runs(runs: list[dict], flags: list = ()) -> str:
    """The runs side by side: per size and allocator, each run's median ratio to the no-op
    floor's overhead and their largest over smallest (``!`` where a check flagged the row)."""
    from tabulate import tabulate

    marked = checks.flagged(list(flags), "allocator runs")
    rows = []
    for size, per_label in runs[0].items():
        for label in per_label:
            ratios = [run.get(size, {}).get(label, {}).get("ratio_to_floor") for run in runs]
            if any(r is None for r in ratios):
                continue
            medians = [r["median"] for r in ratios]
            spread = f"{max(medians) / min(medians):.3f}" if min(medians) > 0 else "-"
            rows.append([size_label(int(size)), label + (" !" if (size, label) in marked else "")]
                        + [f"{m:.2f}" for m in medians] + [spread])
    headers = ["size", "allocator"] + [f"run {i + 1}" for i in range(len(runs))] + ["max/min"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    folders = [a for a in args if a not in ("--plain", "--anchors", "--no-history", "--managed")]
    if "--managed" in args:  # the managed table, printed (no JSON)
        print(render_managed(run_managed(folders[0] if folders else None)))
        sys.exit(0)
    print(json.dumps(run(folders[0] if folders else None, plain="--plain" in args, anchors="--anchors" in args,
                         history="--no-history" not in args)))
