"""numba_pool: a Numba External Memory Management (EMM) plugin on a CUDA stream-ordered mempool.

Switch it on with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` or :func:`install`.
"""

from __future__ import annotations

from typing import Any

from . import config as _config
from .config import ConfigError, PoolConfig
from ._simulator import SimulatorWarning
from .manager import NumbaPoolManager
from .scratch import scratch
from .scoped_stats import ScopedStatistics, statistics
from .stats import PoolStatistics
from .summary import memory_summary, reserved_bytes, used_bytes
from .streams import using_stream

__all__ = [
    "ConfigError", "NumbaPoolManager", "PoolConfig", "PoolStatistics", "SimulatorWarning", "install", "record_stream",
    "reset_peak", "scratch", "stats", "trim", "using_stream",
    "ScopedStatistics", "memory_summary", "reserved_bytes", "statistics", "used_bytes",
]
__version__ = "0.1.0"

#: Numba's contract for ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool``.
_numba_memory_manager = NumbaPoolManager


def install(**options: Any) -> PoolConfig:
    """Make numba_pool Numba's memory manager (``numba.cuda.set_memory_manager``) with
    ``options`` overriding the ``NUMBA_POOL_*`` environment variables.

    Options (each also an environment variable, ``NUMBA_POOL_<OPTION>``; see
    :mod:`numba_pool.config`): ``release_threshold`` (bytes, or ``"all"``), ``max_size`` (bytes,
    or a fraction of device memory: a float in (0, 1] or ``"50%"``; an int below 1 MiB is refused
    as a likely slip for ``1.0``, write ``"512 KiB"`` for a cap that small), ``initial_size``
    (bytes), ``use_default_pool``, ``arena``, ``ipc`` (bools), ``arena_max_block``,
    ``arena_slab_size`` (bytes, multiples of 256, block <= slab), ``log`` (path of a CSV
    allocation log, checked now), ``host`` (bool: pinned/mapped host memory from a cache of
    ``cuMemHostAlloc`` blocks; off by default, not yet validated on a GPU), ``host_max_size``
    (bytes, or ``"none"``) and ``host_release_threshold`` (bytes, or ``"all"``).  Sizes are ints or strings with units (``"64 MiB"``,
    ``"1.5 GiB"``; KiB = 1024 B, KB = 1000 B) and must be whole bytes up to 2**64 - 1.  ``None``
    means the option's default, whatever the environment says.

    Call it before the first CUDA use in the process: Numba binds a context's memory manager
    when it creates the context.

    :returns: the configuration in effect.
    :raises ConfigError: for an unknown option, a bad value or contradicting options: one line
        naming the keyword (``install(max_size)=1``) or environment variable and the value.
    :raises RuntimeError: when a CUDA context already exists.
    :warns SimulatorWarning: under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), which has no
        memory manager to replace: the options are checked, nothing is installed.
    """
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    from . import _simulator, manager

    config = _config.load(**options)
    if _simulator.enabled():
        _simulator.warn_install()
        return config
    existing = [dev.id for dev in driver.devices.values() if getattr(dev, "primary_context", None) is not None]
    if existing:
        raise RuntimeError(
            f"numba_pool.install: CUDA context(s) already exist on device(s) {existing}; Numba binds the memory "
            "manager when it creates a context, so call install() before the first CUDA use")
    manager._set_config(config)
    cuda.set_memory_manager(NumbaPoolManager)
    return config


def _manager(device: int | None = None) -> NumbaPoolManager:
    from numba import cuda

    context = cuda.current_context(device) if device is not None else cuda.current_context()
    mm = getattr(context, "memory_manager", None)  # None under the CUDA simulator
    if not isinstance(mm, NumbaPoolManager):
        from . import _simulator

        if _simulator.enabled():
            raise RuntimeError(f"numba_pool is not the memory manager: {_simulator.NO_MEMORY_MANAGER}")
        raise RuntimeError(
            f"numba_pool is not the memory manager of this context ({type(mm).__name__} is): set "
            "NUMBA_CUDA_MEMORY_MANAGER=numba_pool or call numba_pool.install() before the first CUDA use")
    return mm


def stats(device: int | None = None) -> PoolStatistics:
    """Statistics of the current (or given) device's numba_pool manager.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    return _manager(device).statistics()


def reset_peak(device: int | None = None) -> None:
    """Reset peak bytes/blocks in use and the pool's reserved/used high watermarks to the
    current values (``CU_MEMPOOL_ATTR_*_MEM_HIGH``)."""
    _manager(device).reset_peak()


def trim(keep_bytes: int = 0, device: int | None = None) -> None:
    """Synchronize the device and release cached pool memory beyond ``keep_bytes`` bytes
    (``cuMemPoolTrimTo``), including the arena's empty slabs, and (``NUMBA_POOL_HOST``) the
    cached pinned host blocks whose events completed (``cuMemFreeHost``)."""
    _manager(device).trim(keep_bytes)


def record_stream(array: Any, stream: Any) -> None:
    """Mark ``array`` (a device array, shape and dtype any, a ``MemoryPointer``, or with
    ``NUMBA_POOL_HOST`` a pinned or mapped array from numba_pool) as used on
    ``stream``: when it is freed, its memory is not reused until the work queued on ``stream`` by
    then has finished.  Device-side ordering through an event; the host never waits.  The
    PyTorch equivalent is ``Tensor.record_stream``.

    :raises ValueError: when the array's memory is not a live numba_pool allocation.
    :raises TypeError: when ``stream`` is not a stream.
    """
    _manager().record_stream(array, stream)
