"""The ``numba-pool`` command line (also ``python -m numba_pool``).

Exit status 2, with one line on standard error and no traceback, for bad configuration, bad
options, bad input files, and machines without a CUDA GPU.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

import click

from .. import config as _config


class Failure(click.ClickException):
    """A user-facing error: printed as ``Error: ...``, exit status 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).splitlines()))  # one line, whatever the cause said


class _OneLineErrors(click.Group):
    """Usage errors (a bad option value, a missing file, an unknown command) as one line,
    ``Error: ...``, without Click's usage lines: the culprit is in the line."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as err:
            err.ctx = None  # UsageError.show prints the usage and a hint only with a context
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as err:  # from the subcommand's arguments
            err.ctx = None
            raise


def _load_config() -> _config.PoolConfig:
    try:
        return _config.load()
    except _config.ConfigError as err:
        raise Failure(str(err)) from None


def _require_gpu() -> None:
    from numba import cuda

    from .. import _simulator

    if _simulator.enabled():  # where cuda.is_available() is True
        raise Failure(_simulator.NO_GPU)
    if not cuda.is_available():
        raise Failure("no CUDA GPU is available here (numba.cuda.is_available() is False): "
                      "numba-pool needs one for this command")


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="numba-pool")
def main() -> None:
    """numba-pool: Numba's CUDA allocations served by a stream-ordered memory pool."""


@main.command()
def info() -> None:
    """Device, driver, versions, the configuration in effect and the pool's attributes.

    Without a GPU: the versions and the configuration, then one error line, exit status 2.
    """
    config = _load_config()
    import humanfriendly
    import numba
    import numba_cuda
    from cuda import bindings
    from numba import cuda
    from tabulate import tabulate

    import numba_pool

    rows = [("python", sys.version.split()[0]), ("numba", numba.__version__), ("numba-cuda", numba_cuda.__version__),
            ("cuda-bindings", bindings.__version__), ("numba-pool", numba_pool.__version__)]
    rows += [(f"config: {k}", v) for k, v in config.describe().items()]
    if numba_pool._simulator.enabled() or not cuda.is_available():
        click.echo(tabulate(rows, tablefmt="plain"))
        _require_gpu()
    numba_pool.install()
    context = cuda.current_context()
    device = context.device
    driver_version = _driver_version()
    usage = context.memory_manager._pool.usage()
    rows = [
        ("device", f"{device.id}: {device.name.decode() if isinstance(device.name, bytes) else device.name}"),
        ("compute capability", ".".join(map(str, device.compute_capability))),
        ("driver (CUDA version)", f"{driver_version // 1000}.{driver_version % 1000 // 10}"),
    ] + rows
    fmt = lambda n: f"{humanfriendly.format_size(n, binary=True)} ({n} bytes)"  # noqa: E731
    rows += [("pool reserved", fmt(usage.reserved)), ("pool reserved high", fmt(usage.reserved_high)),
             ("pool used", fmt(usage.used)), ("pool used high", fmt(usage.used_high))]
    click.echo(tabulate(rows, tablefmt="plain"))


def _driver_version() -> int:
    """The CUDA version the driver supports, e.g. 13000 for 13.0 (``cuDriverGetVersion``)."""
    from cuda.bindings import driver

    err, version = driver.cuDriverGetVersion()
    if err:
        raise Failure(f"cuDriverGetVersion failed with {err.name}")
    return version


@main.command()
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True),
              help="Also write the raw medians, the notes and the failed checks to this JSON file.")
@click.option("--anchors/--no-anchors", default=True, show_default=True,
              help="Rows for the anchors where installed: RMM's plugin on its pool and on cuda_async, "
                   "a plugin on CuPy's pool (numba_pool.bench.anchors); one note per anchor left out.")
@click.option("--with-rmm", is_flag=True, hidden=True, help="Kept for old scripts: the anchors are rows by default.")
@click.option("--no-arena", is_flag=True, help="Leave out the arena row.")
@click.option("--rounds", type=click.IntRange(1, 20), default=5, show_default=True,
              help="End to end: interleaved rounds of all managers; the table shows medians over rounds, "
                   "and flags figures whose rounds disagree by more than 10 %.")
@click.option("--repeat-run", type=click.IntRange(1, 10), default=1, show_default=True,
              help="Run each part this many times (allocator: the in-process measurement, each in a fresh "
                   "process; end to end: all its rounds); shows each run's tables, then their ratios side by side, "
                   "and flags ratios that disagree between runs by more than 10 %.")
@click.option("--turns/--no-turns", default=True, show_default=True,
              help="End to end: the workers of a round run at once on one CPU core, taking turns timed block by "
                   "timed block (a slow spell of the host hits every manager alike); --no-turns runs them one "
                   "after the other.")
@click.option("--warm-up-rounds", type=click.IntRange(0, 5), default=1, show_default=True,
              help="End to end: untimed rounds of all managers, each figure once, before the first run (a "
                   "machine just started timed its first rounds up to 1.6x slower).")
@click.option("--core", type=click.IntRange(0), default=None, metavar="N",
              help="The CPU core every measuring process pins itself to (default: the lowest this process may use).")
@click.option("--baseline", type=click.Path(exists=True, file_okay=False),
              help="A folder holding another installed numba_pool: add its rows, to compare versions in one run.")
@click.option("--part", type=click.Choice(["all", "allocator", "end-to-end"]), default="all", show_default=True,
              help="allocator: memalloc+release timed in one process, managers taking turns; "
                   "end-to-end: cuda.device_array per manager, each in its own process.")
@click.option("--plain-pool", is_flag=True,
              help="Allocator part: add numba_pool on a pool neither exportable (IPC) nor reachable from peers, "
                   "to show what those cost.")
@click.option("--host-rows/--no-host-rows", default=True, show_default=True,
              help="End to end: also time cuda.pinned_array and mapped_array allocate+free (4 KiB, 1 MiB, 64 MiB) "
                   "and a batch pipeline (pinned staging, to_device on a stream, device temporaries, two kernels, "
                   "copy_to_host into pinned memory) in default's and numba_pool's workers, the pipeline in the "
                   "anchors' too; numba_pool's workers then run with NUMBA_POOL_HOST=1.")
def bench(json_path: str | None, anchors: bool, with_rmm: bool, no_arena: bool, rounds: int, repeat_run: int,
          warm_up_rounds: int, turns: bool, core: int | None, baseline: str | None, part: str, plain_pool: bool,
          host_rows: bool) -> None:
    """Allocation speed: Numba's default manager vs numba_pool vs the no-op floors and the anchors.

    Every table is checked (numba_pool.bench.checks): a row below a floor, or rounds or runs more
    than 10 % apart, is marked '!' and named under the table; exit status 1 if any check failed.
    """
    _load_config()
    _require_gpu()
    from numba import cuda

    from ..bench import checks
    from ..bench import end_to_end as b

    anchors = anchors or with_rmm
    try:
        core = b.chosen_core(core, os.sched_getaffinity(0))
    except ValueError as err:
        raise Failure(str(err)) from None
    name = cuda.get_current_device().name
    name = name.decode() if isinstance(name, bytes) else name
    today = datetime.date.today().isoformat()
    report = {"device": name, "date": today, "core": core}
    baseline = os.path.abspath(baseline) if baseline else None  # the workers start elsewhere
    flags = []
    if part in ("all", "allocator"):
        flags += _bench_allocator(report, baseline, plain_pool, anchors, repeat_run, core, name, today)
    if part in ("all", "end-to-end"):
        flags += _bench_end_to_end(report, anchors, no_arena, rounds, baseline, core, name, today, host_rows,
                                   repeat_run, warm_up_rounds, turns)
    report["checks_failed"] = [str(f) for f in flags]
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    click.echo(checks.summary(flags))
    if flags:
        raise SystemExit(1)


def _echo_notes_and_flags(notes: list[str], flags: list) -> None:
    for note in dict.fromkeys(notes):  # once each, in order
        click.echo(f"note: {note}")
    for flag in flags:
        click.echo(str(flag))


def _bench_allocator(report: dict, baseline: str | None, plain_pool: bool, anchors: bool, runs: int, core: int,
                     name: str, today: str) -> list:
    """Run the allocator part ``runs`` times, each in a fresh process; print each run's table,
    then the runs' ratios side by side; fill ``report``; return the failed checks."""
    from ..bench import allocator_cost as a
    from ..bench import checks
    from ..bench import end_to_end as b

    args = ([baseline] if baseline else []) + (["--plain"] if plain_pool else []) + (["--anchors"] if anchors else [])
    outputs = []
    for run in range(runs):
        click.echo(f"measuring the allocators in one process (run {run + 1}/{runs}) ...", err=True)
        try:
            outputs.append(b.run_module("numba_pool.bench.allocator_cost", args, {b.CORE_VARIABLE: str(core)}))
        except RuntimeError as err:
            raise Failure(str(err)) from None
    tables = [o["sizes"] for o in outputs]
    agreement = checks.runs_flags(tables)
    flags = []
    for run, table in enumerate(tables):
        floor_flags = checks.allocator_floor_flags(table)
        click.echo(f"device: {name}; date: {today}; allocator cost in one process, run {run + 1}/{runs} "
                   f"(CPU core {core}): medians of {a.REPEATS} repeats of {a.PAIRS} pairs, allocators taking turns")
        click.echo(a.render(table, floor_flags + agreement))
        _echo_notes_and_flags(outputs[run]["notes"] if run == 0 else [], floor_flags)
        flags += floor_flags
    if runs > 1:
        click.echo(f"ratios to the no-op floor's overhead, run by run (agree within {checks.TOLERANCE:.0%}?):")
        click.echo(a.render_runs(tables, agreement))
        _echo_notes_and_flags([], agreement)
    report.update({"allocator": tables[0], "allocator_notes": outputs[0]["notes"]})
    if runs > 1:
        report["allocator_runs"] = tables
    return flags + agreement


def _bench_end_to_end(report: dict, anchors: bool, no_arena: bool, rounds: int, baseline: str | None, core: int,
                      name: str, today: str, host_rows: bool = True, runs: int = 1, warm_up: int = 0,
                      turns: bool = False) -> list:
    """Run the end-to-end part: ``warm_up`` untimed rounds, then ``runs`` runs of ``rounds``
    interleaved rounds, a process per manager and round; print each run's tables (with
    ``host_rows``, the pinned and batch-pipeline tables too) and, for two runs or more, their
    ratios to default side by side; fill ``report``; return the failed checks."""
    from ..bench import checks
    from ..bench import end_to_end as b

    managers, notes, host_notes = _end_to_end_managers(anchors, no_arena, baseline, host_rows)
    for round_ in range(warm_up):
        _one_round(managers, core, notes, f"warm-up round {round_ + 1}/{warm_up} (not timed)", turns, warm_up=True)
    flags, reports = [], []
    for run in range(runs):
        of_run = f"run {run + 1}/{runs}, " if runs > 1 else ""
        per_round = {m.label: [] for m in managers}
        seconds = {m.label: [] for m in managers}
        for round_ in range(rounds):
            what = f"{of_run}round {round_ + 1}/{rounds}"
            for label, (result, took) in _one_round(managers, core, notes, what, turns).items():
                per_round[label].append(result)
                seconds[label].append(took)
        for label in set(per_round) - {m.label for m in managers}:  # an anchor that failed in a later round
            del per_round[label], seconds[label]
        run_report = report if runs == 1 else {}
        run_notes = list(notes)  # this run's: the warm-up's and earlier runs' notes plus its own
        flags += _end_to_end_tables(run_report, per_round, seconds, managers, run_notes, rounds, core, name,
                                    f"{today}; {of_run.rstrip(', ')}" if runs > 1 else today)
        if host_rows:
            flags += _bench_host_tables(run_report, per_round, managers, host_notes, rounds, core, name, today)
        reports.append(run_report)
    if runs > 1:
        ratios = [_ratios_of(r) for r in reports]
        agreement = checks.ratio_runs_flags(ratios)
        click.echo(f"x faster than default, run by run (each the median over rounds of the rounds' ratios; agree "
                   f"within {checks.TOLERANCE:.0%}?):")
        click.echo(b.render_ratio_runs(ratios, agreement))
        _echo_notes_and_flags([], agreement)
        report.update(reports[0])
        report["end_to_end_runs"] = reports
        flags += agreement
    return flags


def _end_to_end_managers(anchors: bool, no_arena: bool, baseline: str | None, host_rows: bool):
    """The end-to-end workers (the anchors that are installed, the baselines, host parts
    planned), the notes on anchors left out, and the host tables' notes."""
    from ..bench import anchors as anchor_module
    from ..bench import end_to_end as b
    from ..bench import host_tables

    managers = [m for m in b.MANAGERS if not (no_arena and m is b.ARENA)]
    notes = []
    for anchor in b.ANCHORS if anchors else []:
        if anchor_module.installed(anchor.label):
            managers.append(anchor)
        else:
            notes.append(anchor_module.missing_note(anchor.label))
    if baseline:
        managers += b.baselines(baseline)
    host_notes = []
    if host_rows:
        managers, host_notes = host_tables.plan(managers)
    return managers, notes, host_notes


def _one_round(managers: list, core: int, notes: list[str], what: str, turns: bool = False,
               warm_up: bool = False) -> dict:
    """Each manager's worker once (``warm_up``: one repeat of each figure): all at once in
    lock-step turns (``turns``, :func:`numba_pool.bench.end_to_end.measure_round`), else one after the
    other.  Returns ``{label: (result, seconds)}`` (seconds: holding the turn, or the worker's
    whole run).  An anchor
    whose worker fails is noted and leaves ``managers``; any other failure is a :class:`Failure`."""
    from ..bench import anchors as anchor_module
    from ..bench import end_to_end as b

    if turns:
        click.echo(f"{what}: measuring {len(managers)} managers, taking turns ...", err=True)
        outcomes = b.measure_round(managers, core, warm_up)
    else:
        outcomes = {}
        for manager in managers:
            click.echo(f"{what}: measuring {manager.label} ...", err=True)
            start = time.perf_counter()
            try:
                result = b.measure(manager, core, warm_up)
            except RuntimeError as err:
                result = err
            outcomes[manager.label] = (result, time.perf_counter() - start)
    anchor_labels = {a.label for a in b.ANCHORS}
    measured = {}
    for manager in list(managers):
        result, seconds = outcomes[manager.label]
        if isinstance(result, RuntimeError):
            if manager.label not in anchor_labels:
                raise Failure(str(result)) from None
            notes.append(anchor_module.failed_note(manager.label, result))  # optional: note it, go on
            managers.remove(manager)
            continue
        measured[manager.label] = (result, round(seconds, 1))
    return measured


def _end_to_end_tables(report: dict, per_round: dict, seconds: dict, managers: list, notes: list[str], rounds: int,
                       core: int, name: str, today: str) -> list:
    """Print the ``cuda.device_array`` tables of one run; fill ``report``; return the failed checks."""
    from ..bench import checks
    from ..bench import end_to_end as b

    slowest = max(((max(s), label) for label, s in seconds.items() if s), default=None)
    if slowest:
        click.echo(f"end to end: {sum(map(len, seconds.values()))} workers in {sum(map(sum, seconds.values())):.0f} s, "
                   f"the slowest {slowest[0]:.0f} s ({slowest[1]})", err=True)
    results = {label: b.median_over_rounds(r) for label, r in per_round.items()}
    for label, ratios in b.ratios_to_default(results).items():
        results[label]["vs_default"] = ratios
    flags = checks.end_to_end_floor_flags(results) + checks.rounds_flags(per_round)
    host_rows = any(m.args for m in managers)
    host_variable = "; numba_pool rows with NUMBA_POOL_HOST=1, which these figures do not use" if host_rows else ""
    click.echo(f"device: {name}; date: {today}; cuda.device_array end to end (CPU core {core}, collector off"
               f"{host_variable}): medians of {b.REPEATS} repeats of {b.MIN_PAIRS} to {b.MAX_PAIRS} pairs (about "
               f"{b.PAIRS_BUDGET_S * 1e3:.0f} ms a repeat), median over {rounds} rounds")
    click.echo(b.render(results, flags))
    if b.DEFAULT.label in results:
        click.echo(b.render_ratios(results, flags))
    pair = results.get(b.NUMBA_POOL.label, {}).get("driver_pair_us")
    if pair is not None:
        click.echo(f"a cuMemAllocFromPoolAsync + cuMemFreeAsync pair alone, from Python: {pair:.2f} us")
    if rounds < 2:
        notes.append("one round: the rounds' agreement is not checked (--rounds 5 or more)")
    _echo_notes_and_flags(notes, flags)
    report.update({"results": results, "end_to_end_notes": notes, "worker_seconds": seconds,
                   "worker_env": {m.label: m.env for m in managers}})
    return flags


def _ratios_of(report: dict) -> dict[tuple[str, str, str], float]:
    """One run's ratios to default, ``{(table, figure, row): x faster}``, default's own left out."""
    from ..bench import checks
    from ..bench import host_tables as t

    ratios = {("end to end", figure, label): ratio
              for label, r in report.get("results", {}).items() if label != checks.DEFAULT
              for figure, ratio in r.get("vs_default", {}).items()}
    for label, r in report.get("host_results", {}).items():
        if label == checks.DEFAULT:
            continue
        for field, sizes in r.get("vs_default", {}).items():
            ratios.update({(t.TABLE_OF[field], t.figure_name(field, size), label): v for size, v in sizes.items()})
    return ratios


def _bench_host_tables(report: dict, per_round: dict, managers: list, notes: list[str], rounds: int, core: int,
                       name: str, today: str) -> list:
    """Print the pinned and batch-pipeline tables from the workers' host figures
    (:mod:`numba_pool.bench.host_tables`); fill ``report``; return the failed checks."""
    from ..bench import host_tables as t
    from ..bench import host_worker as h

    host_rounds, unread = t.collect(per_round, {m.label for m in managers if m.args})
    notes = notes + unread
    results = {label: t.median_over_rounds(r) for label, r in host_rounds.items()}
    for label, ratios in t.ratios_to_default(results).items():
        results[label]["vs_default"] = ratios
    expected = {m.label for m in managers if m.env.get(t.HOST_VARIABLE) == "1"}
    flags = t.rounds_flags(results) + t.host_cache_flags(results, expected)
    method = (f"(CPU core {core}, collector off; numba_pool rows with NUMBA_POOL_HOST=1): medians of {h.REPEATS} "
              f"repeats of {h.MIN_COUNT} to {h.MAX_COUNT} operations (about {h.BUDGET_S * 1e3:.0f} ms a repeat), "
              f"median over {rounds} rounds")
    if any(h.PINNED in r for r in results.values()):
        click.echo(f"device: {name}; date: {today}; pinned host memory end to end {method}: us per allocate+free "
                   "pair of cuda.pinned_array / cuda.mapped_array (uint8), and how many times faster than default")
        click.echo(t.render_host(results, flags))
    if any(h.PIPELINE in r for r in results.values()):
        click.echo(f"device: {name}; date: {today}; batch pipeline end to end {method}: ms per batch of a pinned "
                   "staging buffer filled on the host, to_device on a stream, device temporaries of the batch size, "
                   "half of it and 4 KiB, two kernels, copy_to_host into a pinned buffer, stream synchronize; every "
                   "buffer allocated and dropped per batch; and how many times faster than default")
        click.echo(t.render_pipeline(results, flags))
    if not results:
        notes.append("no host rows: no worker returned host figures")
    _echo_notes_and_flags(notes, flags)
    report.update({"host_results": results, "host_notes": notes})
    return flags


def _human(nbytes: int) -> str:
    import humanfriendly

    return humanfriendly.format_size(nbytes, binary=True)


def _size_option(name: str, default: int, help_text: str):
    def convert(ctx, param, value):
        try:
            return _config.parse_size(value, f"--{name}") if value is not None else default
        except _config.ConfigError as err:
            raise Failure(str(err)) from None

    return click.option(f"--{name}", callback=convert, metavar="SIZE",
                        help=f"{help_text}: bytes, or a number with a unit such as KiB or MB "
                             f"(default: {_human(default)}).")


def _release_threshold(ctx, param, value):
    try:
        threshold = _config.parse_release_threshold(value, "--release-threshold")
    except _config.ConfigError as err:
        raise Failure(str(err)) from None
    return None if threshold == _config.KEEP_ALL else threshold


@main.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@_size_option("slab-size", _config.DEFAULT_ARENA_SLAB_SIZE, "Largest arena slab")
@_size_option("max-block", _config.DEFAULT_ARENA_MAX_BLOCK, "Largest block served by the arena")
@click.option("--release-threshold", default="all", callback=_release_threshold, metavar="SIZE|all",
              help="Bytes of empty slabs kept, or 'all' to keep every one (default: all).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Draw requested and reserved bytes over the replay to this .png, .svg or .pdf file "
                   "(.png added without an extension; needs matplotlib: pip install 'numba-pool[plot]').")
@click.option("--skip-bad-lines", is_flag=True, help="Count and skip lines that cannot be replayed instead of stopping.")
def replay(trace, slab_size, max_block, release_threshold, plot_path, skip_bad_lines) -> None:
    """Replay an allocation log (RMM's CSV format, plain or gzip) through the arena, with no GPU.

    Shows progress while reading and replaying, then the peaks, their ratio, and the speed.
    """
    from tabulate import tabulate
    from tqdm import tqdm

    from .. import replay as r

    try:  # everything the user typed is checked before a long read
        r.check_options(slab_size, max_block, release_threshold,
                        names=("--slab-size", "--max-block", "--release-threshold"))
    except ValueError as err:
        raise Failure(str(err)) from None
    if plot_path:
        from .. import replay_plot

        try:
            plot_path = replay_plot.plot_path(plot_path, option="--plot")
            replay_plot.require_matplotlib()
        except replay_plot.PlotError as err:
            raise Failure(str(err)) from None
    name = os.path.basename(trace)
    try:
        with tqdm(total=os.path.getsize(trace), unit="B", unit_scale=True, unit_divisor=1024, disable=None,
                  leave=False, desc=f"reading {name}") as bar:
            log = r.read_log(trace, skip_bad_lines=skip_bad_lines, progress=lambda done: bar.update(done - bar.n))
    except r.LogError as err:
        raise Failure(str(err)) from None
    except OSError as err:
        raise Failure(f"{trace}: cannot read it ({err.strerror or err})") from None
    with tqdm(total=len(log.operations), unit="op", unit_scale=True, disable=None, leave=False,
              desc="replaying") as bar:
        report = r.replay(log, slab_size=slab_size, max_block=max_block, release_threshold=release_threshold,
                          progress=lambda done: bar.update(done - bar.n))
    size = lambda n: f"{_human(n)} ({n} bytes)" if n >= 1024 else f"{n} bytes"  # noqa: E731
    speed = lambda ops, seconds: f"{ops / seconds:,.0f} ops/s ({seconds:.2f} s)" if seconds > 0 else "-"  # noqa: E731
    rows = [("operations", f"{report.operations:,}"), ("allocations", f"{report.allocations:,}"),
            ("peak requested (rounded to 256 B)", size(report.peak_requested)),
            ("peak reserved", size(report.peak_reserved)),
            ("peak reserved / peak requested", f"{report.fragmentation:.4f}"),
            ("largest slab count", report.max_slabs),
            ("replay speed", speed(report.operations, report.seconds)),
            ("end to end, reading included", speed(report.operations, report.seconds + report.read_seconds))]
    if log.failures:
        rows.append(("allocate failure lines", log.failures))
    for reason, count in sorted(log.skipped.items()):
        rows.append((f"skipped: {reason}", count))
    click.echo(tabulate(rows, tablefmt="plain", disable_numparse=True))
    if plot_path:
        try:
            written = replay_plot.plot(report, plot_path)
        except OSError as err:
            raise Failure(f"--plot {plot_path!r}: cannot write it ({err.strerror or err})") from None
        click.echo(f"plot written to {written}")

