"""``numba-pool-tools replay``: an allocation log replayed through the arena, with no GPU."""

from __future__ import annotations

import os

import click

from numba_pool import config as _config
from numba_pool.cli.errors import Failure

from .. import replay as offline_replay
from ..replay import figure as replay_plot
from ..replay.figure import size_text


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
    return _config.release_limit(threshold)


@click.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@_size_option("slab-size", _config.DEFAULT_ARENA_SLAB_SIZE, "Largest arena slab")
@_size_option("max-block", _config.DEFAULT_ARENA_MAX_BLOCK, "Largest block served by the arena")
@click.option("--release-threshold", default="all", callback=_release_threshold, metavar="SIZE|all",
              help="Bytes of empty slabs kept, or 'all' to keep every one (default: all).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Draw requested and reserved bytes over the replay to this .png, .svg or .pdf file "
                   "(.png added without an extension; needs matplotlib: pip install -e './tools[plot]').")
@click.option("--skip-bad-lines", is_flag=True, help="Count and skip lines that cannot be replayed instead of stopping.")
def replay(trace, slab_size, max_block, release_threshold, plot_path, skip_bad_lines) -> None:
    """Replay an allocation log (RMM's CSV format, plain or gzip) through the arena, with no GPU.

    Shows progress while reading and replaying, then the peaks, their ratio, and the speed.
    """
    from tabulate import tabulate

    # Everything the user typed is checked before a long read.
    _check_arena_options(slab_size, max_block, release_threshold)
    plot_path = _checked_plot_path(plot_path) if plot_path is not None else None
    log = _read_log(trace, skip_bad_lines)
    report = _replay(log, slab_size, max_block, release_threshold)
    click.echo(tabulate(_rows(report, log), tablefmt="plain", disable_numparse=True))
    if plot_path is not None:
        _plot(report, plot_path)


def _check_arena_options(slab_size, max_block, release_threshold) -> None:
    try:
        offline_replay.check_options(slab_size, max_block, release_threshold,
                                     names=("--slab-size", "--max-block", "--release-threshold"))
    except ValueError as err:
        raise Failure(str(err)) from None


def _read_log(trace: str, skip_bad_lines: bool):
    """The log in ``trace``, read with a progress bar (bytes).

    :raises Failure: naming the file (and line) when it cannot be read or parsed.
    """
    from tqdm import tqdm

    total = os.path.getsize(trace) if os.path.isfile(trace) else None  # a pipe has no size
    try:
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, disable=None,
                  leave=False, desc=f"reading {os.path.basename(trace)}") as bar:
            return offline_replay.read_log(trace, skip_bad_lines=skip_bad_lines,
                                           progress=lambda done: bar.update(done - bar.n))
    except offline_replay.LogError as err:
        raise Failure(str(err)) from None
    except OSError as err:
        raise Failure(f"{trace}: cannot read it ({err.strerror or err})") from None


def _replay(log, slab_size, max_block, release_threshold):
    """The replay's report, with a progress bar (operations)."""
    from tqdm import tqdm

    try:
        with tqdm(total=len(log.operations), unit="op", unit_scale=True, disable=None, leave=False,
                  desc="replaying") as bar:
            return offline_replay.replay(log, slab_size=slab_size, max_block=max_block,
                                         release_threshold=release_threshold,
                                         progress=lambda done: bar.update(done - bar.n))
    except offline_replay.LogError as err:  # nothing to replay
        raise Failure(str(err)) from None


def _rows(report, log) -> list[tuple]:
    """The table: operations, peaks (bytes) and their ratio, speeds, failures and skipped lines."""
    rows = [("operations", f"{report.operations:,}"), ("allocations", f"{report.allocations:,}"),
            ("peak requested (rounded to 256 B)", size_text(report.peak_requested)),
            ("peak reserved", size_text(report.peak_reserved)),
            ("peak reserved / peak requested", f"{report.fragmentation:.4f}"),
            ("largest slab count", report.max_slabs),
            ("replay speed", _speed(report.operations, report.seconds)),
            ("end to end, reading included", _speed(report.operations, report.seconds + report.read_seconds))]
    if log.failures:
        rows.append(("allocate failure lines", log.failures))
    if log.managed:
        rows.append(("managed memory lines (not replayed)", log.managed))
    for reason, count in sorted(log.skipped.items()):
        rows.append((f"skipped: {reason}", count))
    return rows


def _checked_plot_path(path: str) -> str:
    """``--plot``'s file (:func:`numba_pool_tools.replay.figure.checked_path`), tried before the replay.

    :raises Failure: when it cannot be written there, or matplotlib cannot be imported.
    """
    try:
        return replay_plot.checked_path(path, "--plot")
    except replay_plot.PlotError as err:
        raise Failure(str(err)) from None


def _speed(operations: int, seconds: float) -> str:
    return f"{operations / seconds:,.0f} ops/s ({seconds:.2f} s)" if seconds > 0 else "-"


def _plot(report, plot_path: str) -> None:
    try:
        written = replay_plot.plot(report, plot_path)
    except OSError as err:
        raise Failure(f"--plot {plot_path!r}: cannot write it ({err.strerror or err})") from None
    click.echo(f"plot written to {written}")
