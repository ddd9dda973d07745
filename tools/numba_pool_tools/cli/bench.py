"""``numba-pool-tools bench``: the command line of the benchmark (:mod:`numba_pool_tools.bench`).

The options are read and checked here, the device named, and the parts run by
:func:`numba_pool_tools.bench.report.run`; a :class:`~numba_pool_tools.bench.report.BenchError` becomes the
command's one-line error (exit status 2), a failed self-check exit status 1.

``--frontend`` names the Numba CUDA frontend the bench runs under (``numba-cuda`` or ``mlir``;
default: :func:`numba_pool.cuda.frontend.for_tools`'s choice).  The command sets
``NUMBA_POOL_FRONTEND`` to it while it runs, before :mod:`numba_pool_tools.bench` is imported (its
:mod:`~numba_pool_tools.bench.core` takes the frontend from there, once), and every process the bench
starts gets it too (:func:`numba_pool_tools.bench.core.worker_environment`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os

import click

from numba_pool import config as _config
from numba_pool.cli.errors import Failure, load_config, require_gpu
from numba_pool.cuda import frontend as frontends


def _frontend(ctx, param, value):
    """``--frontend``'s frontend name; without it, the tools' choice (``NUMBA_POOL_FRONTEND``,
    else the one imported, else the one installed, numba-cuda first).

    :raises Failure: for a value that names no frontend (naming ``--frontend`` and the value), a
        bad ``NUMBA_POOL_FRONTEND``, or no frontend installed.
    """
    try:
        if value is None:
            return frontends.for_tools().name
        return frontends.parse_name(value, "--frontend")
    except frontends.FrontendError as err:
        raise Failure(str(err)) from None


@click.command()
@click.option("--frontend", "frontend", metavar="numba-cuda|mlir", callback=_frontend,
              help="The Numba CUDA frontend every measuring process runs under: numba-cuda (numba.cuda) or mlir "
                   f"(Numba-CUDA-MLIR, numba_cuda_mlir.cuda); its workers get {frontends.VARIABLE}.  Default: "
                   f"{frontends.VARIABLE}, else the one installed (numba-cuda where both are).  The tables and the "
                   "JSON report name it, with its version.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True),
              help="Also write the raw medians, the notes and the failed checks to this JSON file.")
@click.option("--anchors/--no-anchors", default=True, show_default=True,
              help="Rows for the anchors where installed: RMM's plugin on its pool and on cuda_async, "
                   "a plugin on CuPy's pool (numba_pool_tools.bench.anchors); one note per anchor left out.")
@click.option("--with-rmm", is_flag=True, hidden=True, help="Kept for old scripts: the anchors are rows by default.")
@click.option("--no-arena", is_flag=True, help="Leave out the arena row.")
@click.option("--rounds", type=click.IntRange(1, 20), default=5, show_default=True,
              help="End to end and overlap: interleaved rounds of all managers; the table shows medians over "
                   "rounds, and flags figures whose rounds disagree by more than 10 %.")
@click.option("--repeat-run", type=click.IntRange(1, 10), default=1, show_default=True,
              help="Run each part this many times (allocator: the in-process measurement, each in a fresh "
                   "process; end to end and overlap: all their rounds); shows each run's tables, then their ratios "
                   "side by side, and flags ratios that disagree between runs by more than 10 %.")
@click.option("--turns/--no-turns", default=True, show_default=True,
              help="End to end and overlap: the workers of a round run at once on one CPU core, taking turns "
                   "timed block by timed block (a slow spell of the host hits every manager alike); --no-turns runs "
                   "them one after the other.")
@click.option("--warm-up-rounds", type=click.IntRange(0, 5), default=1, show_default=True,
              help="End to end: untimed rounds of all managers, each figure once, before the first run (a "
                   "machine just started timed its first rounds up to 1.6x slower).")
@click.option("--core", type=click.IntRange(0), default=None, metavar="N",
              help="The CPU core every measuring process pins itself to (default: the lowest this process may use).")
@click.option("--baseline", type=click.Path(exists=True, file_okay=False),
              help="A folder holding another installed numba_pool: add its rows, to compare versions in one run.")
@click.option("--part", type=click.Choice(["all", "allocator", "end-to-end", "graphs", "overlap"]), default="all",
              show_default=True,
              help="allocator: memalloc+release timed in one process, managers taking turns; "
                   "end-to-end: cuda.device_array (and pinned and managed memory, see the row switches below) per "
                   "manager, each in its own process; graphs: a pipeline with a temporary launched eagerly and "
                   "replayed from a CUDA graph, per manager; overlap: 2 and 4 cuda.stream()s each allocating a "
                   "temporary per 1 ms kernel (also inside using_stream), per manager in its own process, taking "
                   "turns: ms per batch, how much the streams overlap, numba_pool checked at most 1.05x default's "
                   "time.")
@click.option("--plain-pool", is_flag=True,
              help="Allocator part: add numba_pool on a pool neither exportable (IPC) nor reachable from peers, "
                   "to show what those cost.")
@click.option("--host-rows/--no-host-rows", default=True, show_default=True,
              help="End to end: also time cuda.pinned_array and mapped_array allocate+free (4 KiB, 1 MiB, 64 MiB) "
                   "and a batch pipeline (pinned staging, to_device on a stream, device temporaries, two kernels, "
                   "copy_to_host into pinned memory) in default's and numba_pool's workers, the pipeline in the "
                   "anchors' too; numba_pool's workers then run with NUMBA_POOL_HOST=1.")
@click.option("--managed-rows/--no-managed-rows", default=True, show_default=True,
              help="End to end: also time cuda.managed_array allocate+free (4 KiB, 1 MiB, 64 MiB) and a managed "
                   "pipeline (a managed array filled on the host, an increment kernel, synchronize, its sum read on "
                   "the host, dropped; per batch of 4 KiB, 1 MiB, 64 MiB) in default's and numba_pool's workers (not "
                   "the anchors' or the floors': their managed memory is Numba's own); numba_pool's workers then run "
                   "with NUMBA_POOL_MANAGED=1.  Checked against the project's managed targets: numba_pool's allocate+free at "
                   "least 2x faster than default at 4 KiB and 5x at 64 MiB, its pipeline faster at every size.")
@click.option("--device-rows/--no-device-rows", default=True, show_default=True,
              help="End to end: the cuda.device_array rows (benchmark loop, allocate+free) and the no-op floors, "
                   "which time nothing else.  --no-device-rows leaves them out: with --no-host-rows --no-anchors, "
                   "only default's and numba_pool's managed rows are timed.")
def bench(frontend: str, json_path: str | None, anchors: bool, with_rmm: bool, no_arena: bool, rounds: int,
          repeat_run: int, warm_up_rounds: int, turns: bool, core: int | None, baseline: str | None, part: str,
          plain_pool: bool, host_rows: bool, managed_rows: bool, device_rows: bool) -> None:
    """Allocation speed: Numba's default manager vs numba_pool vs the no-op floors and the anchors.

    Every table is checked (numba_pool_tools.bench.checks): a row below a floor, rounds or runs more
    than 10 % apart, or a target missed (managed memory, stream overlap), is marked '!' and named
    under the table; exit status 1 if any check failed.
    """
    with _frontend_variable(frontend):
        _bench(frontend, json_path, anchors=anchors or with_rmm, no_arena=no_arena, rounds=rounds, runs=repeat_run,
               warm_up=warm_up_rounds, turns=turns, core=core, baseline=baseline, part=part, plain_pool=plain_pool,
               host_rows=host_rows, managed_rows=managed_rows, device_rows=device_rows)


@contextlib.contextmanager
def _frontend_variable(name: str):
    """Inside: ``NUMBA_POOL_FRONTEND`` names the frontend ``name``, for :mod:`numba_pool_tools.bench`'s
    import and for what the command checks before it; restored after (the command may run inside
    another program, a test's)."""
    before = os.environ.get(frontends.VARIABLE)
    os.environ[frontends.VARIABLE] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(frontends.VARIABLE, None)
        else:
            os.environ[frontends.VARIABLE] = before


def _bench(frontend: str, json_path: str | None, *, anchors: bool, no_arena: bool, rounds: int, runs: int,
           warm_up: int, turns: bool, core: int | None, baseline: str | None, part: str, plain_pool: bool,
           host_rows: bool, managed_rows: bool, device_rows: bool) -> None:
    """The command, under ``NUMBA_POOL_FRONTEND=frontend``: everything the user gave is checked before the GPU
    (exit status 2 before 3), so that a bad value is learnt on any machine, not only on a GPU."""
    load_config()
    bench_core = _bench_core(frontend)  # imports the frontend, which needs no GPU
    core = _checked_core(core)
    json_path = _checked_json_path(json_path)
    _check_baseline(baseline)
    require_gpu()
    from ..bench import checks
    from ..bench import report as bench_report

    setting = _setting(core, bench_core.cuda, frontend)
    try:
        report, flags = bench_report.run(
            setting, part=part, baseline=os.path.abspath(baseline) if baseline else None,  # the workers start elsewhere
            anchors=anchors, plain_pool=plain_pool, no_arena=no_arena, rounds=rounds, runs=runs, warm_up=warm_up,
            turns=turns, host_rows=host_rows, managed_rows=managed_rows, device_rows=device_rows)
    except bench_report.BenchError as err:
        raise Failure(str(err)) from None
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    click.echo(checks.summary(flags))
    if flags:
        raise SystemExit(1)


def _bench_core(frontend: str):
    """:mod:`numba_pool_tools.bench.core`, imported under ``frontend``.

    :raises Failure: when that frontend is not installed (saying how to install it), or when
        the bench was imported earlier in this process under another frontend.
    """
    try:
        from ..bench import core as bench_core
    except frontends.FrontendError as err:
        raise Failure(str(err)) from None
    if bench_core.FRONTEND.name != frontend:
        raise Failure(f"--frontend {frontend}: this process imported numba_pool_tools.bench under "
                      f"{bench_core.FRONTEND.title} already; run numba-pool-tools bench in a process of its own")
    return bench_core


def _checked_core(core: int | None) -> int:
    """``--core``'s CPU core, else the lowest this process may use.

    :raises Failure: for a core this process may not run on, naming the ones it may.
    """
    from ..bench.timing import chosen_core

    try:
        return chosen_core(core, os.sched_getaffinity(0))
    except ValueError as err:
        raise Failure(str(err)) from None


def _checked_json_path(path: str | None) -> str | None:
    """``--json``'s file, tried now (:func:`numba_pool.config.parse_path`, creating nothing), not after a
    bench of minutes.

    :raises Failure: naming ``--json`` and the path, for a folder, a missing or unwritable folder, a file
        that is not regular or not writable.
    """
    if path is None:
        return None
    try:
        return _config.parse_path(path, "--json", "a JSON report")
    except _config.ConfigError as err:
        raise Failure(str(err)) from None


def _check_baseline(folder: str | None) -> None:
    """:raises Failure: when ``--baseline``'s folder holds no ``numba_pool`` package (what its rows import)."""
    if folder is not None and not os.path.isfile(os.path.join(folder, "numba_pool", "__init__.py")):
        raise Failure(f"--baseline {folder!r}: no numba_pool/__init__.py in it: expected a folder holding another "
                      "installed numba_pool")


def _setting(core: int, cuda, frontend: str):
    """Where and when the bench runs (:class:`numba_pool_tools.bench.report.Setting`): the current
    device's name (``cuda``: the frontend's module), today's date, ``core`` (checked) and ``frontend``."""
    from ..bench.report import Setting

    name = cuda.get_current_device().name
    return Setting(device=name.decode() if isinstance(name, bytes) else name, date=datetime.date.today().isoformat(),
                   core=core, frontend=frontend)
