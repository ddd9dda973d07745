"""``python -m numba_pool.cli``, as ``python -m numba_pool``."""

from . import main

main()
