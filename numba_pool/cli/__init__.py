"""The ``numba-pool`` command line (also ``python -m numba_pool``): ``numba-pool info``; alone, its help.  Errors:
one line, no traceback (:mod:`numba_pool.cli.errors`: exit status 2 or 3).  The benchmark, replay and snapshot
readers are ``numba-pool-tools``' (``tools/``): asked for one, it says so, exit status 2 (:data:`MOVED`)."""

from __future__ import annotations

import click

from . import info
from .errors import OneLineErrors

#: The commands that moved to ``numba-pool-tools``, and how to install it.
MOVED = ("bench", "replay", "snapshot")
TOOLS_INSTALL = "pip install -e ./tools from a numba-pool checkout"


class _Commands(OneLineErrors):
    """``numba-pool``'s group: a moved command is a usage error (exit status 2) naming where it went."""

    def resolve_command(self, ctx, args):
        if args and args[0] in MOVED and args[0] not in self.commands:
            raise click.UsageError(f"'numba-pool {args[0]}' moved to the numba-pool-tools command: "
                                   f"{TOOLS_INSTALL}, then run numba-pool-tools {args[0]}")
        return super().resolve_command(ctx, args)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="numba-pool")
def main() -> None:
    """numba-pool: Numba's CUDA allocations served by a stream-ordered memory pool.

    The benchmark, replay and snapshot commands are numba-pool-tools' (pip install -e ./tools from a checkout)."""


main.add_command(info.info)
