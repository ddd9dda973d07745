"""numba_pool: a Numba External Memory Management (EMM) plugin on a CUDA stream-ordered mempool.

Switch it on with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` or :func:`install`.
"""

from __future__ import annotations

from typing import Any

from . import config as _config
from .config import ConfigError, PoolConfig
from .manager import NumbaPoolManager
from .scratch import scratch
from .stats import PoolStatistics
from .streams import using_stream

__all__ = [
    "ConfigError", "NumbaPoolManager", "PoolConfig", "PoolStatistics", "install", "record_stream",
    "reset_peak", "scratch", "stats", "trim", "using_stream",
]
__version__ = "0.1.0"

#: Numba's contract for ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool``.
_numba_memory_manager = NumbaPoolManager


def install(**options: Any) -> PoolConfig:
    """Make numba_pool Numba's memory manager (``numba.cuda.set_memory_manager``) with
    ``options`` overriding the ``NUMBA_POOL_*`` environment variables.

    Options: ``release_threshold`` (bytes or ``"all"``), ``max_size`` (bytes, or a fraction of
    device memory as a float or ``"50%"``), ``initial_size`` (bytes), ``use_default_pool``
    (bool), ``arena`` (bool), ``arena_max_block``, ``arena_slab_size`` (bytes), ``log`` (path of
    a CSV allocation log).  Sizes may be ints or strings with units (``"64 MiB"``).

    Call it before the first CUDA use in the process: Numba binds a context's memory manager
    when it creates the context.

    :returns: the configuration in effect.
    :raises ConfigError: for an unknown option or a bad value (named in the message).
    :raises RuntimeError: when a CUDA context already exists.
    """
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    from . import manager

    config = _config.load(**options)
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
    mm = context.memory_manager
    if not isinstance(mm, NumbaPoolManager):
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
    (``cuMemPoolTrimTo``), including the arena's empty slabs."""
    _manager(device).trim(keep_bytes)


def record_stream(array: Any, stream: Any) -> None:
    """Mark ``array`` (a device array, shape and dtype any, or a ``MemoryPointer``) as used on
    ``stream``: when it is freed, its memory is not reused until the work queued on ``stream`` by
    then has finished.  Device-side ordering through an event; the host never waits.  The
    PyTorch equivalent is ``Tensor.record_stream``.

    :raises ValueError: when the array's memory is not a live numba_pool allocation.
    :raises TypeError: when ``stream`` is not a stream.
    """
    _manager().record_stream(array, stream)
