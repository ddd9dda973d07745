"""numba_pool: a Numba External Memory Management (EMM) plugin on a CUDA stream-ordered mempool.

Switch it on with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` or :func:`install`.

The package's layers, each importing only those below it (``docs/architecture.md``):
:mod:`~numba_pool.config` (options, no CUDA); :mod:`~numba_pool.cuda` (the seam to CUDA and
Numba); :mod:`~numba_pool.allocator` (the stream rule and the block sources);
:mod:`~numba_pool.observe` and :mod:`~numba_pool.ipc` (statistics, summary, allocation log;
IPC of pool memory); :mod:`~numba_pool.plugin` (the EMM plugin, its composed allocation path
and the functions below); :mod:`~numba_pool.integrations` (Dask); the command line,
:mod:`~numba_pool.cli` (``numba-pool info``).  The benchmark, the replay tool and the snapshot
readers live beside the package, in ``tools/`` (``numba_pool_tools``), the example kernels in
``kernels/``.
"""

from __future__ import annotations

from .config import ConfigError, PoolConfig
from .cuda.frontend import FrontendError
from .cuda import simulator as _simulator
from .cuda.simulator import SimulatorWarning
from .observe.scopes import ScopedStatistics
from .observe.statistics import PoolStatistics
from .plugin.api import (dump_snapshot, install, live_allocations, memory_summary, on_out_of_memory, prefetch,
                         record_history, record_stream, reserved_bytes, reset_peak, scratch, snapshot, statistics, stats,
                         trim, used_bytes, using_stream)
from .plugin.manager import NumbaPoolManager

__all__ = [
    "ConfigError", "FrontendError", "NumbaPoolManager", "PoolConfig", "PoolStatistics", "SimulatorWarning", "install",
    "prefetch", "record_stream", "record_history", "snapshot", "dump_snapshot", "on_out_of_memory",
    "live_allocations",
    "reset_peak", "scratch", "stats", "trim", "using_stream",
    "ScopedStatistics", "memory_summary", "reserved_bytes", "statistics", "used_bytes",
]
__version__ = "0.1.0"

if _simulator.requested():  # numba-cuda's simulator ignores NUMBA_CUDA_MEMORY_MANAGER: say so, once
    _simulator.note_environment()

#: Numba's contract for ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool``, read by either frontend: the
#: frontend-neutral class, which instantiates as the frontend's own (Note [One class for every
#: frontend] in :mod:`numba_pool.plugin.manager`).
_numba_memory_manager = NumbaPoolManager
