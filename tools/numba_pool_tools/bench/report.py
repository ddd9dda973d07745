"""``numba-pool-tools bench``'s parts run from the parent and reported: each part's processes
started, its tables printed (``click.echo``; progress on standard error), the JSON report
filled, and the failed checks returned.

* :func:`allocator_part`: ``python -m numba_pool_tools.bench.allocator_cost`` once per run
  (:mod:`numba_pool_tools.bench.allocator_cost`), each run's table and the allocation history's
  (:mod:`numba_pool_tools.bench.history_cost`), then the runs' ratios side by side.
* :func:`end_to_end_part`: warm-up rounds, then runs of interleaved rounds of one worker per
  manager (:mod:`numba_pool_tools.bench.end_to_end`, through ``end_to_end.measure`` or
  ``end_to_end.measure_round``, called through the module so that a test can stand in for the
  workers), the ``cuda.device_array`` tables (:mod:`numba_pool_tools.bench.device_tables`) and the
  host tables, pinned and managed memory (:mod:`numba_pool_tools.bench.host_tables`), of each run,
  then the runs' ratios side by side.  Each kind of row can be left out (``host_rows``,
  ``managed_rows``, ``device_rows``: the command's ``--no-host-rows``, ``--no-managed-rows``,
  ``--no-device-rows``).
* :func:`graphs_part`: the CUDA-graph pipeline, a process per manager
  (:mod:`numba_pool_tools.bench.graph_tables`), a table per run.
* :func:`overlap_part`: streams that allocate and drop a temporary per kernel, rounds of one
  worker per manager in turns as end to end (:mod:`numba_pool_tools.bench.overlap_tables`), a table
  per run, then the runs' ratios side by side.

:func:`run` runs the parts a command asks for.  A failure the bench cannot go on from (a worker
or an allocator run that failed, not an anchor: those are noted and left out) raises
:class:`BenchError`; the command line shows it as one line.  This module never imports
:mod:`numba_pool_tools.cli`.
"""

from __future__ import annotations

import dataclasses
import time

import click

from . import (allocator_cost, checks, device_tables, end_to_end, graph_tables, history_cost, host_tables, host_worker,
               launch, overlap_tables, worker)
from . import anchors as anchor_module
from .core import FRONTEND, frontend_label
from .labels import DEFAULT, NUMBA_POOL
from .timing import CORE_VARIABLE

ALLOCATOR_MODULE = "numba_pool_tools.bench.allocator_cost"  # python -m ALLOCATOR_MODULE: one allocator run


class BenchError(RuntimeError):
    """The bench cannot go on: a worker or an allocator run failed, as its message says."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """Where and when the bench runs, as each table's heading says: the device's name, the date
    (ISO 8601), the CPU core every measuring process pins itself to, and the Numba CUDA frontend
    every process runs under (``numba-cuda`` or ``mlir``; this process's,
    :data:`numba_pool_tools.bench.core.FRONTEND`, which the processes it starts are given)."""

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
        rounds: int, runs: int, warm_up: int, turns: bool, host_rows: bool, managed_rows: bool = True,
        device_rows: bool = True) -> tuple[dict, list[checks.Flag]]:
    """Run ``part`` (``all``, ``allocator``, ``end-to-end``, ``graphs`` or ``overlap``) with the command's
    options and print its tables.  Returns the JSON report (the device, date and core, the frontend as the
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
                                 host_rows=host_rows, managed_rows=managed_rows, device_rows=device_rows, runs=runs,
                                 warm_up=warm_up, turns=turns)
    if part in ("all", "graphs"):
        flags += graphs_part(report, setting, runs=runs)
    if part in ("all", "overlap"):
        flags += overlap_part(report, setting, no_arena=no_arena, rounds=rounds, runs=runs, turns=turns)
    report["checks_failed"] = [str(f) for f in flags]
    return report, flags


def graphs_part(report: dict, setting: Setting, *, runs: int) -> list[checks.Flag]:
    """Run the CUDA-graph part ``runs`` times (:mod:`numba_pool_tools.bench.graph_tables`); print each
    run's table; fill ``report``; a replay whose result was wrong is a failed check.

    :raises BenchError: when a process failed."""
    flags = []
    report["graphs"] = []
    for run in range(runs):
        try:
            results = graph_tables.measure_run(setting.core, run, runs)
        except RuntimeError as err:
            raise BenchError(str(err)) from None
        click.echo(f"{setting.heading}; CUDA graphs, run {run + 1}/{runs} (CPU core {setting.core}): a temporary "
                   "allocated, filled, added and dropped per iteration, launched eagerly and replayed from one capture; "
                   f"{graph_tables.METHOD}")
        click.echo(graph_tables.render(results))
        for label, result in results.items():
            for row in result["sizes"]:
                if row.get("correct") is False:
                    flags.append(checks.Flag("graphs", str(row["bytes"]), label, "the replayed graph's result was wrong"))
        report["graphs"].append(results)
    echo_notes_and_flags([], flags)
    return flags


def overlap_part(report: dict, setting: Setting, *, no_arena: bool, rounds: int, runs: int,
                 turns: bool) -> list[checks.Flag]:
    """Run the overlap part (:mod:`numba_pool_tools.bench.overlap_tables`): ``runs`` runs of ``rounds``
    rounds of one worker per manager, taking turns (``turns``) as the end-to-end part's do; print
    each run's table and, for two runs or more, their ratios to default side by side; fill
    ``report`` (``overlap``, and ``overlap_runs`` for two runs or more); return the failed checks.

    :raises BenchError: when a worker failed or returned unreadable figures.
    """
    managers, notes = overlap_tables.managers(no_arena), []
    flags, results_of_runs = [], []
    for run in range(runs):
        of_run = f"run {run + 1}/{runs}, " if runs > 1 else ""
        per_round, _ = _rounds(managers, setting.core, notes, rounds, f"overlap, {of_run}", turns)
        try:
            results = overlap_tables.merge(per_round)
        except ValueError as err:
            raise BenchError(str(err)) from None
        run_flags = overlap_tables.check(results)
        click.echo(f"{setting.heading}; {of_run}{overlap_tables.heading(rounds, setting.core)}")
        click.echo(overlap_tables.render(results, run_flags))
        echo_notes_and_flags(notes if run == 0 else [], run_flags)
        flags += run_flags
        results_of_runs.append(results)
    report["overlap"] = results_of_runs[0]
    if runs > 1:
        ratios = [overlap_tables.keyed_ratios(results) for results in results_of_runs]
        agreement = checks.ratio_runs_flags(ratios)
        click.echo(f"stream overlap, x faster than default, run by run (agree within {checks.TOLERANCE:.0%}?):")
        click.echo(device_tables.render_ratio_runs(ratios, agreement))
        echo_notes_and_flags([], agreement)
        report["overlap_runs"] = results_of_runs
        flags += agreement
    return flags


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
        floor_flags, history_flags = checks.allocator_floor_flags(table), checks.history_flags(table)
        click.echo(f"{setting.heading}; allocator cost in one process, run "
                   f"{run + 1}/{runs} (CPU core {setting.core}): medians of {allocator_cost.REPEATS} repeats of "
                   f"{allocator_cost.PAIRS} pairs, allocators taking turns")
        click.echo(allocator_cost.render(table, floor_flags + agreement))
        if history_cost.present(table):
            click.echo(f"{setting.heading}; the allocation history's cost (numba_pool.record_history), run {run + 1}/"
                       f"{runs}, in the same turns: each path off (after switching the history on and off; added: "
                       f"vs the same path never switched on, checked within {checks.HISTORY_OFF_US:g} us) and "
                       f"recording (added: vs the path off, paired per repeat; at depth "
                       f"{checks.HISTORY_CHECKED_DEPTH}, checked at most {checks.HISTORY_MAX_ADDED_US:g} us)")
            click.echo(history_cost.render(table, floor_flags + agreement + history_flags))
        echo_notes_and_flags(outputs[run]["notes"] if run == 0 else [], floor_flags + history_flags)
        flags += floor_flags + history_flags
    if runs > 1:
        click.echo(f"ratios to the no-op floor's overhead, run by run (agree within {checks.TOLERANCE:.0%}?):")
        click.echo(allocator_cost.render_runs(tables, agreement))
        echo_notes_and_flags([], agreement)
    report.update({"allocator": tables[0], "allocator_notes": outputs[0]["notes"]})
    if runs > 1:
        report["allocator_runs"] = tables
    return flags + agreement


def _allocator_run(args: list[str], core: int, run: int, runs: int) -> dict:
    """One allocator run's JSON (:func:`numba_pool_tools.bench.allocator_cost.run`), in a fresh process
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
                    baseline: str | None, host_rows: bool = True, managed_rows: bool = True, device_rows: bool = True,
                    runs: int = 1, warm_up: int = 0, turns: bool = False) -> list[checks.Flag]:
    """Run the end-to-end part: ``warm_up`` untimed rounds, then ``runs`` runs of ``rounds``
    interleaved rounds, a process per manager and round; print each run's tables (with
    ``device_rows``, the ``cuda.device_array`` tables; with ``host_rows``, the pinned and
    batch-pipeline tables; with ``managed_rows``, the managed allocate+free and managed pipeline
    tables) and, for two runs or more, their ratios to default side by side; fill ``report``;
    return the failed checks.

    :raises BenchError: when a worker other than an anchor's failed, or when no kind of row is
        asked for.
    """
    if not (device_rows or host_rows or managed_rows):
        raise BenchError("--no-device-rows, --no-host-rows and --no-managed-rows together leave the end-to-end part "
                         "nothing to time")
    managers, notes, host_notes = end_to_end_managers(anchors, no_arena, baseline, host_rows, setting.frontend,
                                                      managed_rows=managed_rows, device_rows=device_rows)
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
        flags += device_array_tables(run_report, dated, per_round, seconds, managers, run_notes, rounds, device_rows)
        if host_rows or managed_rows:
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
                        frontend: str = FRONTEND.name, managed_rows: bool = True,
                        device_rows: bool = True) -> tuple[list, list[str], list[str]]:
    """The end-to-end workers (the anchors that are installed and built for ``frontend``, the
    baselines, host parts planned: pinned with ``host_rows``, managed with ``managed_rows``;
    without ``device_rows``, the workers that would time nothing else left out,
    :func:`numba_pool_tools.bench.host_tables.plan`), the notes on anchors left out, and the host
    tables' notes."""
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
    memories = (host_worker.PINNED_MEMORY,) * host_rows + (host_worker.MANAGED_MEMORY,) * managed_rows
    managers, host_notes = host_tables.plan(managers, memories, device=device_rows)
    return managers, notes, host_notes


def one_round(managers: list, core: int, notes: list[str], what: str, turns: bool = False,
              warm_up: bool = False) -> dict[str, tuple[dict, float]]:
    """Each manager's worker once (``warm_up``: one repeat of each figure): all at once in
    lock-step turns (``turns``, :func:`numba_pool_tools.bench.end_to_end.measure_round`), else one after
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
                        notes: list[str], rounds: int, device: bool = True) -> list[checks.Flag]:
    """Print the ``cuda.device_array`` tables of one run (without ``device``, none: the workers
    did not time them), then the run's notes; fill ``report``; return the failed checks."""
    slowest = max(((max(s), label) for label, s in seconds.items() if s), default=None)
    if slowest:
        click.echo(f"end to end: {sum(map(len, seconds.values()))} workers in {sum(map(sum, seconds.values())):.0f} s, "
                   f"the slowest {slowest[0]:.0f} s ({slowest[1]})", err=True)
    flags = _device_array_tables(report, setting, per_round, managers, rounds) if device else []
    if rounds < 2:
        notes.append("one round: the rounds' agreement is not checked (--rounds 5 or more)")
    echo_notes_and_flags(notes, flags)
    report.update({"end_to_end_notes": notes, "worker_seconds": seconds,
                   "worker_env": {m.label: m.env for m in managers}})
    return flags


def _device_array_tables(report: dict, setting: Setting, per_round: dict, managers: list,
                         rounds: int) -> list[checks.Flag]:
    """Print the ``cuda.device_array`` tables; put their figures in ``report``; return the failed checks."""
    results = {label: device_tables.median_over_rounds(r) for label, r in per_round.items()}
    for label, ratios in device_tables.ratios_to_default(results).items():
        results[label]["vs_default"] = ratios
    flags = checks.end_to_end_floor_flags(results) + checks.rounds_flags(per_round)
    variables = [v for v in (host_tables.HOST_VARIABLE, host_tables.MANAGED_VARIABLE)
                 if any(m.env.get(v) == "1" for m in managers)]
    host_variable = (f"; numba_pool rows with {' and '.join(f'{v}=1' for v in variables)}, which these figures do "
                     "not use") if variables else ""
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
    report["results"] = results
    return flags


def ratios_of(report: dict) -> dict[tuple[str, str, str], float]:
    """One run's ratios to default, ``{(table, figure, row): x faster}``, default's own left out."""
    ratios = {("end to end", figure, label): ratio
              for label, r in report.get("results", {}).items() if label != DEFAULT
              for figure, ratio in r.get("vs_default", {}).items()}
    ratios.update(host_tables.keyed_ratios({label: r.get("vs_default", {})
                                            for label, r in report.get("host_results", {}).items()
                                            if label != DEFAULT}))
    return ratios


def host_rows_tables(report: dict, setting: Setting, per_round: dict, managers: list, notes: list[str],
                     rounds: int) -> list[checks.Flag]:
    """Print the host tables, pinned and managed memory (:data:`numba_pool_tools.bench.host_tables.TABLES`,
    those with figures), from the workers' host figures; fill ``report``; return the failed
    checks: rounds that disagree, a row whose memory did not come from numba_pool's cache
    although asked, and the managed targets missed."""
    host_rounds, unread = host_tables.collect(per_round, {m.label for m in managers if host_tables.hosts(m)})
    notes = notes + unread
    results = {label: host_tables.median_over_rounds(r) for label, r in host_rounds.items()}
    for label, ratios in host_tables.ratios_to_default(results).items():
        results[label]["vs_default"] = ratios
    flags = host_tables.rounds_flags(results)
    for memory in host_worker.MEMORIES:
        variable = host_tables.VARIABLE_OF[memory.name]
        flags += host_tables.cache_flags(results, {m.label for m in managers if m.env.get(variable) == "1"}, memory)
    flags += host_tables.target_flags(results)
    for table in (t for name, t in host_tables.TABLES.items() if host_tables.present(name, results)):
        method = (f"(CPU core {setting.core}, collector off; numba_pool rows with "
                  f"{host_tables.VARIABLE_OF[table.memory.name]}=1): medians of {host_worker.REPEATS} repeats of "
                  f"{host_worker.MIN_COUNT} to {host_worker.MAX_COUNT} operations (about "
                  f"{host_worker.BUDGET_S * 1e3:.0f} ms a repeat), median over {rounds} rounds")
        targets = host_tables.targets_text(table.name)
        click.echo(f"{setting.heading}; {table.title} {method}: {table.what}; and how many times faster than default"
                   + (f"; {targets}" if targets else ""))
        click.echo(host_tables.render(table.name, results, flags))
    if not results:
        notes.append("no host rows: no worker returned host figures")
    echo_notes_and_flags(notes, flags)
    report.update({"host_results": results, "host_notes": notes})
    return flags
