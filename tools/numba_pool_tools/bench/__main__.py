"""The end-to-end worker: ``python -m numba_pool_tools.bench [--host PARTS] [--no-device]`` checks and
times under the memory manager its environment selects
(:func:`numba_pool_tools.bench.worker.run_worker`), taking lock-step turns with the round's other
workers where the parent gives them (:mod:`numba_pool_tools.bench.turns`), and prints one JSON line.

A numba_pool from before the tools moved out of it (``--baseline DIR``) runs its own
``numba_pool.bench``, a module with the same entry
(:func:`numba_pool_tools.bench.launch.worker_package`).
"""

import sys

from numba_pool_tools.bench.host_worker import parse_arguments
from numba_pool_tools.bench.timing import serve
from numba_pool_tools.bench.worker import run_worker

serve(lambda: run_worker(*parse_arguments(sys.argv[1:])))
