"""The ``numba-pool`` command line (also ``python -m numba_pool``).

Exit status 2, with one line on standard error and no traceback, for bad configuration, bad
options, bad input files, and machines without a CUDA GPU.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

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
    from ..bench import report as bench_report
    from ..bench.timing import chosen_core

    try:
        core = chosen_core(core, os.sched_getaffinity(0))
    except ValueError as err:
        raise Failure(str(err)) from None
    name = cuda.get_current_device().name
    setting = bench_report.Setting(device=name.decode() if isinstance(name, bytes) else name,
                                   date=datetime.date.today().isoformat(), core=core)
    try:
        report, flags = bench_report.run(
            setting, part=part, baseline=os.path.abspath(baseline) if baseline else None,  # the workers start elsewhere
            anchors=anchors or with_rmm, plain_pool=plain_pool, no_arena=no_arena, rounds=rounds, runs=repeat_run,
            warm_up=warm_up_rounds, turns=turns, host_rows=host_rows)
    except bench_report.BenchError as err:
        raise Failure(str(err)) from None
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    click.echo(checks.summary(flags))
    if flags:
        raise SystemExit(1)


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

