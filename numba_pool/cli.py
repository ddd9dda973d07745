"""The ``numba-pool`` command line (also ``python -m numba_pool``).

Exit status 2, with one line on standard error and no traceback, for bad configuration, bad
input files, and machines without a CUDA GPU.
"""

from __future__ import annotations

import datetime
import json
import os

import click

from . import config as _config


class Failure(click.ClickException):
    """A user-facing error: printed as ``Error: ...``, exit status 2."""

    exit_code = 2


def _load_config() -> _config.PoolConfig:
    try:
        return _config.load()
    except _config.ConfigError as err:
        raise Failure(str(err)) from None


def _require_gpu() -> None:
    from numba import cuda

    if not cuda.is_available():
        raise Failure("no CUDA GPU is available here (numba.cuda.is_available() is False): "
                      "numba-pool needs one for this command")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="numba-pool")
def main() -> None:
    """numba-pool: Numba's CUDA allocations served by a stream-ordered memory pool."""


@main.command()
def info() -> None:
    """Device, driver, versions, the configuration in effect and the pool's attributes."""
    config = _load_config()
    _require_gpu()
    import humanfriendly
    import numba
    import numba_cuda
    from cuda import bindings
    from numba import cuda
    from tabulate import tabulate

    import numba_pool

    numba_pool.install()
    context = cuda.current_context()
    device = context.device
    driver_version = _driver_version()
    usage = context.memory_manager._pool.usage()
    rows = [
        ("device", f"{device.id}: {device.name.decode() if isinstance(device.name, bytes) else device.name}"),
        ("compute capability", ".".join(map(str, device.compute_capability))),
        ("driver (CUDA version)", f"{driver_version // 1000}.{driver_version % 1000 // 10}"),
        ("numba", numba.__version__), ("numba-cuda", numba_cuda.__version__),
        ("cuda-bindings", bindings.__version__), ("numba-pool", numba_pool.__version__),
    ]
    rows += [(f"config: {k}", v) for k, v in config.describe().items()]
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
              help="Also write the raw medians to this JSON file.")
@click.option("--with-rmm", is_flag=True, help="Add a row for rmm.allocators.numba on an RMM pool (needs rmm).")
@click.option("--no-arena", is_flag=True, help="Leave out the arena row.")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Interleaved rounds of all managers; the table shows medians over rounds.")
@click.option("--baseline", type=click.Path(exists=True, file_okay=False),
              help="A folder holding another installed numba_pool: add its rows, to compare versions in one run.")
@click.option("--part", type=click.Choice(["all", "allocator", "end-to-end"]), default="all", show_default=True,
              help="allocator: memalloc+release timed in one process, managers taking turns; "
                   "end-to-end: cuda.device_array per manager, each in its own process.")
def bench(json_path: str | None, with_rmm: bool, no_arena: bool, rounds: int, baseline: str | None,
          part: str) -> None:
    """Allocation speed: Numba's default manager vs numba_pool vs the no-op floors."""
    _load_config()
    _require_gpu()
    from numba import cuda

    name = cuda.get_current_device().name
    name = name.decode() if isinstance(name, bytes) else name
    today = datetime.date.today().isoformat()
    report = {"device": name, "date": today}
    baseline = os.path.abspath(baseline) if baseline else None  # the workers start elsewhere
    if part in ("all", "allocator"):
        report["allocator"] = _bench_allocator(baseline, name, today)
    if part in ("all", "end-to-end"):
        report["results"] = _bench_end_to_end(with_rmm, no_arena, rounds, baseline, name, today)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)


def _bench_allocator(baseline: str | None, name: str, today: str) -> dict:
    from . import allocator_cost as a
    from . import bench as b

    click.echo("measuring the allocators in one process ...", err=True)
    try:
        results = b.run_module("numba_pool.allocator_cost", [baseline] if baseline else [])
    except RuntimeError as err:
        raise Failure(str(err)) from None
    click.echo(f"device: {name}; date: {today}; allocator cost in one process: medians of {a.REPEATS} "
               f"repeats of {a.PAIRS} pairs, allocators taking turns")
    click.echo(a.render(results))
    return results


def _bench_end_to_end(with_rmm: bool, no_arena: bool, rounds: int, baseline: str | None,
                      name: str, today: str) -> dict:
    from . import bench as b

    managers = [m for m in b.MANAGERS if not (no_arena and m is b.ARENA)]
    if with_rmm:
        managers.append(b.RMM)
    if baseline:
        managers += b.baselines(baseline)
    per_round: dict[str, list] = {m.label: [] for m in managers}
    for round_ in range(rounds):
        for manager in list(managers):
            click.echo(f"round {round_ + 1}/{rounds}: measuring {manager.label} ...", err=True)
            try:
                per_round[manager.label].append(b.measure(manager))
            except RuntimeError as err:
                if manager is b.RMM:  # an optional comparison: report it and go on
                    click.echo(f"skipping the RMM row: {err}", err=True)
                    managers.remove(manager)
                    del per_round[manager.label]
                    continue
                raise Failure(str(err)) from None
    results = {label: b.median_over_rounds(r) for label, r in per_round.items()}
    click.echo(f"device: {name}; date: {today}; cuda.device_array end to end: medians of {b.REPEATS} repeats, "
               f"median over {rounds} rounds")
    click.echo(b.render(results))
    pair = results.get(b.NUMBA_POOL.label, {}).get("driver_pair_us")
    if pair is not None:
        click.echo(f"a cuMemAllocFromPoolAsync + cuMemFreeAsync pair alone, from Python: {pair:.2f} us")
    return results


def _size_option(name: str, default: int, help_text: str):
    def convert(ctx, param, value):
        try:
            return _config.parse_size(value, f"--{name}") if value is not None else default
        except _config.ConfigError as err:
            raise click.BadParameter(str(err)) from None

    return click.option(f"--{name}", callback=convert, help=f"{help_text} (default {default} bytes).")


@main.command()
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@_size_option("slab-size", _config.DEFAULT_ARENA_SLAB_SIZE, "Arena slab size")
@_size_option("max-block", _config.DEFAULT_ARENA_MAX_BLOCK, "Largest block served by the arena")
@click.option("--release-threshold", default=None, help="Bytes of empty slabs kept (default: all).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Draw requested and reserved bytes to this PNG.")
@click.option("--skip-bad-lines", is_flag=True, help="Count and skip lines that cannot be replayed instead of stopping.")
def replay(trace, slab_size, max_block, release_threshold, plot_path, skip_bad_lines) -> None:
    """Replay an allocation log (RMM's CSV format) through the arena, with no GPU."""
    from tabulate import tabulate
    from tqdm import tqdm

    from . import replay as r
    from .arena import ArenaError

    threshold = None
    if release_threshold is not None:
        try:
            threshold = _config.parse_size(release_threshold, "--release-threshold")
        except _config.ConfigError as err:
            raise Failure(str(err)) from None
    try:
        with open(trace, newline="") as f:
            log = r.parse_log(f, skip_bad_lines=skip_bad_lines, source=trace)
    except (r.LogError, UnicodeDecodeError) as err:
        raise Failure(str(err)) from None
    with tqdm(total=len(log.operations), unit="op", disable=None, leave=False) as bar:
        try:
            report = r.replay(log, slab_size=slab_size, max_block=max_block, release_threshold=threshold,
                              progress=lambda done: bar.update(done - bar.n))
        except ArenaError as err:
            raise Failure(str(err)) from None
    mib = lambda n: f"{n / 2**20:.3f} MiB ({n} bytes)"  # noqa: E731
    rows = [("operations", report.operations), ("allocations", report.allocations),
            ("peak requested (rounded to 256 B)", mib(report.peak_requested)),
            ("peak reserved", mib(report.peak_reserved)),
            ("peak reserved / peak requested", f"{report.fragmentation:.4f}"),
            ("largest slab count", report.max_slabs), ("replay speed", f"{report.ops_per_second:,.0f} ops/s")]
    if log.failures:
        rows.append(("allocate failure lines", log.failures))
    for reason, count in sorted(log.skipped.items()):
        rows.append((f"skipped: {reason}", count))
    click.echo(tabulate(rows, tablefmt="plain"))
    if plot_path:
        r.plot(report, plot_path, title=trace)
        click.echo(f"plot written to {plot_path}")


if __name__ == "__main__":
    main()
