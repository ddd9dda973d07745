"""The ``numba-pool`` command line (also ``python -m numba_pool``).

One line on standard error and no traceback for every error: exit status 2 for bad
configuration, bad options and bad input files, 3 for a machine without a CUDA GPU
(:mod:`numba_pool.cli.errors`).  The command alone prints its help (exit status 0).

One module per command: :mod:`~numba_pool.cli.info`, :mod:`~numba_pool.cli.replay` and
:mod:`~numba_pool.cli.bench` (whose measuring is :mod:`numba_pool.bench`'s); the ``snapshot``
group is a package, :mod:`~numba_pool.cli.snapshot`, one module per subcommand.
"""

from __future__ import annotations

import click

from . import bench, info, replay
from .snapshot import snapshot
from .errors import OneLineErrors


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="numba-pool")
def main() -> None:
    """numba-pool: Numba's CUDA allocations served by a stream-ordered memory pool."""


main.add_command(info.info)
main.add_command(bench.bench)
main.add_command(replay.replay)
main.add_command(snapshot)
