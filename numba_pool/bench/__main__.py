"""The end-to-end worker: ``python -m numba_pool.bench [--host PARTS] [--no-device]`` checks and
times under the memory manager its environment selects
(:func:`numba_pool.bench.worker.run_worker`), taking lock-step turns with the round's other
workers where the parent gives them (:mod:`numba_pool.bench.turns`), and prints one JSON line.

A numba_pool from before this package (``--baseline DIR``) runs the same way: its
``numba_pool.bench`` is a module with the same entry.
"""

import sys

from numba_pool.bench.host_worker import parse_arguments
from numba_pool.bench.timing import serve
from numba_pool.bench.worker import run_worker

serve(lambda: run_worker(*parse_arguments(sys.argv[1:])))
