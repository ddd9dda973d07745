"""``numba-pool bench``'s two parts run from the parent and reported: each part's processes
started, its tables printed (``click.echo``; progress on standard error), the JSON report
filled, and the failed checks returned.

* :func:`allocator_part`: ``python -m numba_pool.bench.allocator_cost`` once per run
  (:mod:`numba_pool.bench.allocator_cost`), each run's table, then the runs' ratios side by side.
* :func:`end_to_end_part`: warm-up rounds, then runs of interleaved rounds of one worker per
  manager (:mod:`numba_pool.bench.end_to_end`, through ``end_to_end.measure`` or
  ``end_to_end.measure_round``, called through the module so that a test can stand in for the
  workers), the ``cuda.device_array`` tables (:mod:`numba_pool.bench.device_tables`) and the
  host tables (:mod:`numba_pool.bench.host_tables`) of each run, then the runs' ratios side by
  side.

:func:`run` runs the parts a command asks for.  A failure the bench cannot go on from (a worker
or an allocator run that failed, not an anchor: those are noted and left out) raises
:class:`BenchError`; the command line shows it as one line.  This module never imports
:mod:`numba_pool.cli`.
"""

from __future__ import annotations

import dataclasses
import time

import click

from . import allocator_cost, checks, device_tables, end_to_end, host_tables, host_worker, launch, worker
from . import anchors as anchor_module
from .core import FRONTEND, frontend_label
from .labels import DEFAULT, NUMBA_POOL
from .timing import CORE_VARIABLE

ALLOCATOR_MODULE = "numba_pool.bench.allocator_cost"  # python -m ALLOCATOR_MODULE: one allocator run


class BenchError(RuntimeError):
    """The bench cannot go on: a worker or an allocator run failed, as its message says."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """Where and when the bench runs, as each table's heading says: the device's name, the date
    (ISO 8601), the CPU core every measuring process pins itself to, and the Numba CUDA frontend
    every process runs under (``numba-cuda`` or ``mlir``; this process's,
    :data:`numba_pool.bench.core.FRONTEND`, which the processes it starts are given)."""

    device: str
    date: str
    core: int
    frontend: str = FRONTEND.name

    @property
    def heading(self) -> str:
        """The start of each table's heading: ``device: ...; frontend: Numba-CUDA-MLIR 0.6.0;
        date: ...``."""
        return f"device: {self.device}; frontend: {frontend_label(self.frontend)}; date: {self.date}"


def run(setting: Setting, *, part: str, baseline: str | None, anchors: bool, plain_pool: bool, no_arena: bool,
        rounds: int, runs: int, warm_up: int, turns: bool, host_rows: bool) -> tuple[dict, list[checks.Flag]]:
    """Run ``part`` (``all``, ``allocator`` or ``end-to-end``) with the command's options and
    print its tables.  Returns the JSON report (the device, date and core, the frontend as the
    tables name it, ``frontend``, and by name, ``frontend_name``; each part's figures and notes,
    the failed checks as text) and the failed checks.

    :raises BenchError: when a worker or an allocator run failed.
    """
    report = {"device": setting.device, "date": setting.date, "core": setting.core,
              "frontend": frontend_label(setting.frontend), "frontend_name": setting.frontend}
    flags = []
    if part in ("all", "allocator"):
        flags += allocator_part(report, setting, baseline=baseline, plain_pool=plain_pool, anchors=anchors, runs=runs)
    if part in ("all", "end-to-end"):
        flags += end_to_end_part(report, setting, anchors=anchors, no_arena=no_arena, rounds=rounds, baseline=baseline,
                                 host_rows=host_rows, runs=runs, warm_up=warm_up, turns=turns)
    report["checks_failed"] = [str(f) for f in flags]
    return report, flags


def echo_notes_and_flags(notes: list[str], flags: list) -> None:
    """Print each note once, in order, then each failed check."""
    for note in dict.fromkeys(notes):
        click.echo(f"note: {note}")
    for flag in flags:
        click.echo(str(flag))


# -- the allocator part -----------------------------------------------------------------------

def allocator_part(report: dict, setting: Setting, *, baseline: str | None, plain_pool: bool, anchors: bool,
                   runs: int) -> list[checks.Flag]:
    """Run the allocator part ``runs`` times, each in a fresh process; print each run's table,
    then the runs' ratios side by side; fill ``report``; return the failed checks.

    :raises BenchError: when a run failed, with its exit status and standard error.
    """
    args = ([baseline] if baseline else []) + (["--plain"] if plain_pool else []) + (["--anchors"] if anchors else [])
    outputs = [_allocator_run(args, setting.core, run, runs) for run in range(runs)]
    tables = [o["sizes"] for o in outputs]
    agreement = checks.runs_flags(tables)
    flags = []
    for run, table in enumerate(tables):
        floor_flags = checks.allocator_floor_flags(table)
        click.echo(f"{setting.heading}; allocator cost in one process, run "
                   f"{run + 1}/{runs} (CPU core {setting.core}): medians of {allocator_cost.REPEATS} repeats of "
                   f"{allocator_cost.PAIRS} pairs, allocators taking turns")
        click.echo(allocator_cost.render(table, floor_flags + agreement))
        echo_notes_and_flags(outputs[run]["notes"] if run == 0 else [], floor_flags)
        flags += floor_flags
    if runs > 1:
        click.echo(f"ratios to the no-op floor's overhead, run by run (agree within {checks.TOLERANCE:.0%}?):")
        click.echo(allocator_cost.render_runs(tables, agreement))
        echo_notes_and_flags([], agreement)
    report.update({"allocator": tables[0], "allocator_notes": outputs[0]["notes"]})
    if runs > 1:
        report["allocator_runs"] = tables
    return flags + agreement


def _allocator_run(args: list[str], core: int, run: int, runs: int) -> dict:
    """One allocator run's JSON (:func:`numba_pool.bench.allocator_cost.run`), in a fresh process
    pinned to ``core``, under this process's frontend.

    :raises BenchError: when it failed, or ran under another frontend.
    """
    click.echo(f"measuring the allocators in one process (run {run + 1}/{runs}) ...", err=True)
    try:
        return launch.same_frontend(launch.run_module(ALLOCATOR_MODULE, args, {CORE_VARIABLE: str(core)}))
    except RuntimeError as err:
        raise BenchError(str(err)) from None


# -- the end-to-end part ----------------------------------------------------------------------

def end_to_end_part(report: dict, setting: Setting, *, anchors: bool, no_arena: bool, rounds: int,
                    baseline: str | None, host_rows: bool = True, runs: int = 1, warm_up: int = 0,
                    turns: bool = False) -> list[checks.Flag]:
    """Run the end-to-end part: ``warm_up`` untimed rounds, then ``runs`` runs of ``rounds``
    interleaved rounds, a process per manager and round; print each run's tables (with
    ``host_rows``, the pinned and batch-pipeline tables too) and, for two runs or more, their
    ratios to default side by side; fill ``report``; return the failed checks.

    :raises BenchError: when a worker other than an anchor's failed.
    """
    managers, notes, host_notes = end_to_end_managers(anchors, no_arena, baseline, host_rows, setting.frontend)
    for round_ in range(warm_up):
        one_round(managers, setting.core, notes, f"warm-up round {round_ + 1}/{warm_up} (not timed)", turns,
                  warm_up=True)
    flags, reports = [], []
    for run in range(runs):
        of_run = f"run {run + 1}/{runs}, " if runs > 1 else ""
        per_round, seconds = _rounds(managers, setting.core, notes, rounds, of_run, turns)
        run_report = report if runs == 1 else {}
        run_notes = list(notes)  # this run's: the warm-up's and earlier runs' notes plus its own
        dated = dataclasses.replace(setting, date=f"{setting.date}; {of_run.rstrip(', ')}") if runs > 1 else setting
        flags += device_array_tables(run_report, dated, per_round, seconds, managers, run_notes, rounds)
        if host_rows:
            flags += host_rows_tables(run_report, setting, per_round, managers, host_notes, rounds)
        reports.append(run_report)
    if runs > 1:
        flags += _compare_runs(report, reports)
    return flags


def _rounds(managers: list, core: int, notes: list[str], rounds: int, of_run: str,
            turns: bool) -> tuple[dict[str, list[dict]], dict[str, list[float]]]:
    """``rounds`` rounds of every manager's worker: ``{label: [result per round]}`` and
    ``{label: [seconds per round]}``, without an anchor that failed in a later round."""
    per_round = {m.label: [] for m in managers}
    seconds = {m.label: [] for m in managers}
    for round_ in range(rounds):
        for label, (result, took) in one_round(managers, core, notes, f"{of_run}round {round_ + 1}/{rounds}",
                                               turns).items():
            per_round[label].append(result)
            seconds[label].append(took)
    for label in set(per_round) - {m.label for m in managers}:  # an anchor that failed in a later round
        del per_round[label], seconds[label]
    return per_round, seconds


def _compare_runs(report: dict, reports: list[dict]) -> list[checks.Flag]:
    """Print the runs' ratios to default side by side; keep the runs' reports in ``report``
    (the first run's at its top level); return the checks that the runs disagree."""
    ratios = [ratios_of(r) for r in reports]
    agreement = checks.ratio_runs_flags(ratios)
    click.echo(f"x faster than default, run by run (each the median over rounds of the rounds' ratios; agree "
               f"within {checks.TOLERANCE:.0%}?):")
    click.echo(device_tables.render_ratio_runs(ratios, agreement))
    echo_notes_and_flags([], agreement)
    report.update(reports[0])
    report["end_to_end_runs"] = reports
    return agreement


def end_to_end_managers(anchors: bool, no_arena: bool, baseline: str | None, host_rows: bool,
                        frontend: str = FRONTEND.name) -> tuple[list, list[str], list[str]]:
    """The end-to-end workers (the anchors that are installed and built for ``frontend``, the
    baselines, host parts planned), the notes on anchors left out, and the host tables' notes."""
    managers = [m for m in end_to_end.MANAGERS if not (no_arena and m is end_to_end.ARENA)]
    notes = []
    for anchor in end_to_end.ANCHORS if anchors else []:
        if not anchor_module.supported(anchor.label, frontend):
            notes.append(anchor_module.unsupported_note(anchor.label, frontend))
        elif anchor_module.installed(anchor.label):
            managers.append(anchor)
        else:
            notes.append(anchor_module.missing_note(anchor.label))
    if baseline:
        managers += end_to_end.baselines(baseline)
    host_notes = []
    if host_rows:
        managers, host_notes = host_tables.plan(managers)
    return managers, notes, host_notes


def one_round(managers: list, core: int, notes: list[str], what: str, turns: bool = False,
              warm_up: bool = False) -> dict[str, tuple[dict, float]]:
    """Each manager's worker once (``warm_up``: one repeat of each figure): all at once in
    lock-step turns (``turns``, :func:`numba_pool.bench.end_to_end.measure_round`), else one after
    the other.  Returns ``{label: (result, seconds)}`` (seconds: holding the turn, or the worker's
    whole run).  An anchor whose worker fails is noted and leaves ``managers``.

    :raises BenchError: when another manager's worker failed.
    """
    outcomes = _measure_all(managers, core, what, turns, warm_up)
    anchor_labels = {a.label for a in end_to_end.ANCHORS}
    measured = {}
    for manager in list(managers):
        result, seconds = outcomes[manager.label]
        if isinstance(result, RuntimeError):
            if manager.label not in anchor_labels:
                raise BenchError(str(result)) from None
            notes.append(anchor_module.failed_note(manager.label, result))  # optional: note it, go on
            managers.remove(manager)
            continue
        measured[manager.label] = (result, round(seconds, 1))
    return measured


def _measure_all(managers: list, core: int, what: str, turns: bool,
                 warm_up: bool) -> dict[str, tuple[dict | RuntimeError, float]]:
    """Every manager's worker once, in turns or one after the other: ``{label: (result or the
    RuntimeError of a failed worker, seconds)}``."""
    if turns:
        click.echo(f"{what}: measuring {len(managers)} managers, taking turns ...", err=True)
        return end_to_end.measure_round(managers, core, warm_up)
    outcomes = {}
    for manager in managers:
        click.echo(f"{what}: measuring {manager.label} ...", err=True)
        start = time.perf_counter()
        try:
            result = end_to_end.measure(manager, core, warm_up)
        except RuntimeError as err:
            result = err
        outcomes[manager.label] = (result, time.perf_counter() - start)
    return outcomes


def device_array_tables(report: dict, setting: Setting, per_round: dict, seconds: dict, managers: list,
                        notes: list[str], rounds: int) -> list[checks.Flag]:
    """Print the ``cuda.device_array`` tables of one run; fill ``report``; return the failed checks."""
    slowest = max(((max(s), label) for label, s in seconds.items() if s), default=None)
    if slowest:
        click.echo(f"end to end: {sum(map(len, seconds.values()))} workers in {sum(map(sum, seconds.values())):.0f} s, "
                   f"the slowest {slowest[0]:.0f} s ({slowest[1]})", err=True)
    results = {label: device_tables.median_over_rounds(r) for label, r in per_round.items()}
    for label, ratios in device_tables.ratios_to_default(results).items():
        results[label]["vs_default"] = ratios
    flags = checks.end_to_end_floor_flags(results) + checks.rounds_flags(per_round)
    host_rows = any(m.args for m in managers)
    host_variable = "; numba_pool rows with NUMBA_POOL_HOST=1, which these figures do not use" if host_rows else ""
    click.echo(f"{setting.heading}; cuda.device_array end to end (CPU core "
               f"{setting.core}, collector off{host_variable}): medians of {worker.REPEATS} repeats of "
               f"{worker.MIN_PAIRS} to {worker.MAX_PAIRS} pairs (about {worker.PAIRS_BUDGET_S * 1e3:.0f} ms a "
               f"repeat), median over {rounds} rounds")
    click.echo(device_tables.render(results, flags))
    if DEFAULT in results:
        click.echo(device_tables.render_ratios(results, flags))
    pair = results.get(NUMBA_POOL, {}).get("driver_pair_us")
    if pair is not None:
        click.echo(f"a cuMemAllocFromPoolAsync + cuMemFreeAsync pair alone, from Python: {pair:.2f} us")
    if rounds < 2:
        notes.append("one round: the rounds' agreement is not checked (--rounds 5 or more)")
    echo_notes_and_flags(notes, flags)
    report.update({"results": results, "end_to_end_notes": notes, "worker_seconds": seconds,
                   "worker_env": {m.label: m.env for m in managers}})
    return flags


def ratios_of(report: dict) -> dict[tuple[str, str, str], float]:
    """One run's ratios to default, ``{(table, figure, row): x faster}``, default's own left out."""
    ratios = {("end to end", figure, label): ratio
              for label, r in report.get("results", {}).items() if label != DEFAULT
              for figure, ratio in r.get("vs_default", {}).items()}
    for label, r in report.get("host_results", {}).items():
        if label == DEFAULT:
            continue
        for field, sizes in r.get("vs_default", {}).items():
            ratios.update({(host_tables.TABLE_OF[field], host_tables.figure_name(field, size), label): v
                           for size, v in sizes.items()})
    return ratios


def host_rows_tables(report: dict, setting: Setting, per_round: dict, managers: list, notes: list[str],
                     rounds: int) -> list[checks.Flag]:
    """Print the pinned and batch-pipeline tables from the workers' host figures
    (:mod:`numba_pool.bench.host_tables`); fill ``report``; return the failed checks."""
    host_rounds, unread = host_tables.collect(per_round, {m.label for m in managers if m.args})
    notes = notes + unread
    results = {label: host_tables.median_over_rounds(r) for label, r in host_rounds.items()}
    for label, ratios in host_tables.ratios_to_default(results).items():
        results[label]["vs_default"] = ratios
    expected = {m.label for m in managers if m.env.get(host_tables.HOST_VARIABLE) == "1"}
    flags = host_tables.rounds_flags(results) + host_tables.host_cache_flags(results, expected)
    heading = f"{setting.heading};"
    method = (f"(CPU core {setting.core}, collector off; numba_pool rows with NUMBA_POOL_HOST=1): medians of "
              f"{host_worker.REPEATS} repeats of {host_worker.MIN_COUNT} to {host_worker.MAX_COUNT} operations (about "
              f"{host_worker.BUDGET_S * 1e3:.0f} ms a repeat), median over {rounds} rounds")
    if any(host_worker.PINNED in r for r in results.values()):
        click.echo(f"{heading} pinned host memory end to end {method}: us per allocate+free pair of "
                   "cuda.pinned_array / cuda.mapped_array (uint8), and how many times faster than default")
        click.echo(host_tables.render_host(results, flags))
    if any(host_worker.PIPELINE in r for r in results.values()):
        click.echo(f"{heading} batch pipeline end to end {method}: ms per batch of a pinned staging buffer filled "
                   "on the host, to_device on a stream, device temporaries of the batch size, half of it and 4 KiB, "
                   "two kernels, copy_to_host into a pinned buffer, stream synchronize; every buffer allocated and "
                   "dropped per batch; and how many times faster than default")
        click.echo(host_tables.render_pipeline(results, flags))
    if not results:
        notes.append("no host rows: no worker returned host figures")
    echo_notes_and_flags(notes, flags)
    report.update({"host_results": results, "host_notes": notes})
    return flags
