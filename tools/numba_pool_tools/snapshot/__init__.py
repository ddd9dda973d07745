"""``numba-pool-tools snapshot``: a memory snapshot read with no GPU, one module per subcommand:
:mod:`~numba_pool_tools.snapshot.summarize` and :mod:`~numba_pool_tools.snapshot.plot`; both read
the file with :mod:`~numba_pool_tools.snapshot.load` (which unpickles it with
:mod:`~numba_pool_tools.snapshot.unpickle`, and checks what it holds).

The file is ``numba_pool.dump_snapshot``'s (or ``NUMBA_POOL_OOM_SNAPSHOT``'s), or PyTorch's
``torch.cuda.memory._snapshot()`` pickled: the schema is :mod:`numba_pool.observe.snapshot`'s.
"""

from __future__ import annotations

import click

from numba_pool.cli.errors import OneLineErrors
from . import plot, summarize


@click.group(cls=OneLineErrors)
def snapshot() -> None:
    """Read a memory snapshot (numba_pool.dump_snapshot's pickle, or PyTorch's
    torch.cuda.memory._snapshot() pickled), with no GPU."""


snapshot.add_command(summarize.summarize)
snapshot.add_command(plot.plot)
