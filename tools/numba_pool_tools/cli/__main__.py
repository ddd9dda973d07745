"""``python -m numba_pool_tools.cli``, as ``python -m numba_pool_tools``."""

from . import main

main(prog_name="numba-pool-tools")
