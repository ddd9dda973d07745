"""The end-to-end worker: ``python -m numba_pool.bench [--host PARTS]`` checks and times under
the memory manager its environment selects, and prints one JSON line."""

import json
import sys

from numba_pool.bench import end_to_end
from numba_pool.bench.host_worker import parse_parts
from numba_pool.bench.turns import worker_turn

turn = worker_turn()
turn.begin(end_to_end.worker_core())
try:
    print(json.dumps(end_to_end.run_worker(parse_parts(sys.argv[1:]))), flush=True)
finally:
    turn.end()
