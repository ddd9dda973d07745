"""The ``numba-pool-tools`` command line (also ``python -m numba_pool_tools``): ``bench``,
``replay`` and ``snapshot summarize|plot``.

One line on standard error and no traceback for every error, as ``numba-pool``'s
(:mod:`numba_pool.cli.errors`): exit status 2 for bad configuration, bad options and bad input
files, 3 for a machine without a CUDA GPU; ``bench`` exits 1 when a self-check failed.  The
command alone prints its help (exit status 0).

One module per command: :mod:`~numba_pool_tools.cli.bench` (whose measuring is
:mod:`numba_pool_tools.bench`'s) and :mod:`~numba_pool_tools.cli.replay`; the ``snapshot`` group
is :mod:`numba_pool_tools.snapshot`, one module per subcommand.
"""

from __future__ import annotations

import warnings

import click

# numba_pool may warn as it is imported (NUMBA_CUDA_MEMORY_MANAGER=numba_pool under the CUDA simulator): held here
# and shown by the command as its own warnings are, one line naming it, not this import's line.
with warnings.catch_warnings(record=True) as _import_warnings:
    from numba_pool.cli.errors import OneLineErrors

    from ..snapshot import snapshot
    from . import bench, replay


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="numba-pool-tools")
def main() -> None:
    """numba-pool-tools: numba-pool's benchmark, allocation-log replay and snapshot readers."""
    while _import_warnings:  # once per process (numba_pool warns at its first import only)
        caught = _import_warnings.pop(0)
        warnings.showwarning(caught.message, caught.category, caught.filename, caught.lineno)


main.add_command(bench.bench)
main.add_command(replay.replay)
main.add_command(snapshot)
