"""``python -m numba_pool_tools``, as ``numba-pool-tools``."""

from .cli import main

main(prog_name="numba-pool-tools")
