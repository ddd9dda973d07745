"""numba_pool: a Numba External Memory Management (EMM) plugin on a CUDA stream-ordered mempool.

Switch it on: ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` or :func:`install`.  The layers (config, cuda, allocator, observe
and ipc, plugin, integrations, cli; each imports only those below) and tools: ``docs/architecture.md``."""

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
    "ConfigError", "FrontendError", "MemoryResource", "PinnedMemoryResource", "ManagedMemoryResource",
    "NumbaPoolManager", "cupy_allocator", "cupy_pinned_allocator", "torch_allocator", "PoolConfig", "PoolStatistics",
    "SimulatorWarning", "install",
    "prefetch", "record_stream", "record_history", "snapshot", "dump_snapshot", "on_out_of_memory",
    "live_allocations",
    "reset_peak", "scratch", "stats", "trim", "using_stream",
    "ScopedStatistics", "memory_summary", "reserved_bytes", "statistics", "used_bytes",
]
__version__ = "0.1.0"


def __getattr__(name: str):  # the other doors import their library (cuda.core, CuPy, PyTorch) at first use
    if name in ("MemoryResource", "PinnedMemoryResource", "ManagedMemoryResource"):
        from .plugin import resource

        return getattr(resource, name)
    if name in ("cupy_allocator", "cupy_pinned_allocator"):
        from .plugin import cupy_allocator

        return getattr(cupy_allocator, name)
    if name == "torch_allocator":
        from .plugin.torch_allocator import torch_allocator

        return torch_allocator
    raise AttributeError(f"module 'numba_pool' has no attribute {name!r}")

import sys as _sys


def _command_starting() -> bool:  # `numba-pool`/`python -m numba_pool`: no user frame; the command says it in one line
    argv = getattr(_sys, "orig_argv", _sys.argv)
    return _sys.argv[0].endswith("numba-pool") or "-m" in argv and argv[argv.index("-m") + 1:][:1] == ["numba_pool"]


if _simulator.requested() and not _command_starting():  # the simulator ignores NUMBA_CUDA_MEMORY_MANAGER: say so
    _simulator.note_environment()

#: Numba's contract for ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool``, read by either frontend: the frontend-neutral class,
#: which instantiates as the frontend's own (Note [One class for every frontend] in :mod:`numba_pool.plugin.manager`).
_numba_memory_manager = NumbaPoolManager
