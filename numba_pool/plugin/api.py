"""numba_pool's public functions: install the plugin, and reach the current (or given)
device's manager for its statistics, summary, trim, ``record_stream`` and scratch scopes.
:mod:`numba_pool` re-exports them."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .. import config as _config
from ..allocator import threads
from ..allocator.scratch import ScratchBlock
from ..config import PoolConfig
from ..cuda import simulator
from ..cuda.frontend import CudaSupportError
from ..cuda.streams import current_stream
from ..observe.statistics import PoolStatistics
from ..observe.summary import format_summary
from . import settings
from .manager import NumbaPoolManager


def install(**options: Any) -> PoolConfig:
    """Make numba_pool Numba's memory manager (``numba.cuda.set_memory_manager``) with
    ``options`` overriding the ``NUMBA_POOL_*`` environment variables.

    Options (each also an environment variable, ``NUMBA_POOL_<OPTION>``; see
    :mod:`numba_pool.config`): ``release_threshold`` (bytes, or ``"all"``), ``max_size`` (bytes,
    or a fraction of device memory: a float, numpy's too, in [0.01, 1], or ``"50%"``; a bare
    number below 1 MiB or a fraction below 1 % is refused as a likely slip, write ``"512 KiB"``
    for a cap that small), ``initial_size`` (bytes), ``use_default_pool``, ``arena``, ``ipc``
    (bools), ``arena_max_block``, ``arena_slab_size`` (bytes, multiples of 256, block <= slab),
    ``log`` (path of a CSV allocation log, checked now), ``host`` (bool: pinned/mapped host
    memory from a cache of ``cuMemHostAlloc`` blocks; off by default), ``host_max_size`` (bytes,
    or ``"none"``) and ``host_release_threshold`` (bytes, or ``"all"``).  Sizes take the syntax
    of every entry point (:mod:`numba_pool.config.sizes`): ints, or strings with units
    (``"64 MiB"``, ``"1.5 GiB"``; KiB = 1024 B, KB = 1000 B), whole bytes up to 2**64 - 1.
    ``None`` means the option's default, whatever the environment says.

    Call it before the first CUDA use in the process: Numba binds a context's memory manager
    when it creates the context.

    :returns: the configuration in effect.
    :raises ConfigError: for an unknown option, a bad value or contradicting options: one line
        naming the keyword (``install(max_size)=1``) or environment variable and the value.
    :raises RuntimeError: when a CUDA context already exists, or when the interpreter runs
        without its GIL (:func:`numba_pool.allocator.threads.require_gil`).
    :warns SimulatorWarning: under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), which has no
        memory manager to replace: the options are checked, nothing is installed.  The warning
        never raises, even when warnings are errors (``python -W error``).
    """
    from numba import cuda
    from numba.cuda.cudadrv.driver import driver

    config = _config.load(**options)
    if simulator.enabled():
        simulator.warn_install()
        return config
    threads.require_gil()
    existing = [dev.id for dev in driver.devices.values() if getattr(dev, "primary_context", None) is not None]
    if existing:
        raise RuntimeError(
            f"numba_pool.install: CUDA context(s) already exist on device(s) {existing}; Numba binds the memory "
            "manager when it creates a context, so call install() before the first CUDA use")
    settings.set_config(config)
    cuda.set_memory_manager(NumbaPoolManager)
    return config


def manager_of(device: int | None = None) -> NumbaPoolManager:
    """The numba_pool manager of the current (or given) device's CUDA context.

    :raises RuntimeError: when numba_pool is not Numba's memory manager there, or there is no
        CUDA GPU (one line; Numba's own ``CudaSupportError`` spans many).
    """
    from numba import cuda

    try:
        context = cuda.current_context(device) if device is not None else cuda.current_context()
    except CudaSupportError as err:
        cause = " ".join(part.strip(" :") for part in str(err).splitlines() if part.strip(" :"))
        raise RuntimeError(f"numba_pool: no CUDA GPU is available here ({cause or type(err).__name__})") from None
    mm = getattr(context, "memory_manager", None)  # None under the CUDA simulator
    if not isinstance(mm, NumbaPoolManager):
        if simulator.enabled():
            raise RuntimeError(f"numba_pool is not the memory manager: {simulator.NO_MEMORY_MANAGER}")
        raise RuntimeError(
            f"numba_pool is not the memory manager of this context ({type(mm).__name__} is): set "
            "NUMBA_CUDA_MEMORY_MANAGER=numba_pool or call numba_pool.install() before the first CUDA use")
    return mm


def stats(device: int | None = None) -> PoolStatistics:
    """Statistics of the current (or given) device's numba_pool manager.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    return manager_of(device).statistics()


def reset_peak(device: int | None = None) -> None:
    """Reset peak bytes/blocks in use and the pool's reserved/used high watermarks to the
    current values (``CU_MEMPOOL_ATTR_*_MEM_HIGH``)."""
    manager_of(device).reset_peak()


def trim(keep_bytes: int = 0, device: int | None = None) -> None:
    """Synchronize the device and release cached pool memory beyond ``keep_bytes`` bytes
    (``cuMemPoolTrimTo``), including the arena's empty slabs, and (``NUMBA_POOL_HOST``) the
    cached pinned host blocks whose events completed (``cuMemFreeHost``)."""
    manager_of(device).trim(keep_bytes)


def record_stream(array: Any, stream: Any) -> None:
    """Mark ``array`` (a device array, shape and dtype any, a ``MemoryPointer``, or with
    ``NUMBA_POOL_HOST`` a pinned or mapped array from numba_pool) as used on
    ``stream``: when it is freed, its memory is not reused until the work queued on ``stream`` by
    then has finished.  Device-side ordering through an event; the host never waits.  The
    PyTorch equivalent is ``Tensor.record_stream``.

    :raises ValueError: when the array's memory is not a live numba_pool allocation.
    :raises TypeError: when ``stream`` is not a stream.
    """
    manager_of().record_stream(array, stream)


def memory_summary(device: int | None = None) -> str:
    """A printable table of the current (or given) device's numba_pool memory: allocations
    (bytes and counts: current, peak, total), the pool's reserved and used bytes with their
    high watermarks, the arena's figures (reserved, in use, cached, quarantined, free, slabs),
    the calling thread's scratch block if it is inside ``numba_pool.scratch``, and the
    out-of-memory retries and errors.  Sizes in binary units and exact bytes.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    manager = manager_of(device)
    scratch = current_stream().scratch
    if scratch is not None and getattr(scratch.block, "context", None) is not manager.context:
        scratch = None  # another device's block
    return format_summary(manager.statistics(), device=manager.device_id, scratch=scratch)


def used_bytes(device: int | None = None) -> int:
    """Bytes held by live allocations of the current (or given) device, as requested (CuPy's
    ``MemoryPool.used_bytes()``, PyTorch's ``memory_allocated()``).

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    return manager_of(device).statistics().bytes_in_use


def reserved_bytes(device: int | None = None) -> int:
    """Bytes the device's mempool has reserved from the device (``CU_MEMPOOL_ATTR_RESERVED_
    MEM_CURRENT``): live allocations, arena slabs and cached free memory (CuPy's
    ``MemoryPool.total_bytes()``, PyTorch's ``memory_reserved()``).  With
    ``use_default_pool`` the pool is the device's default one, shared with other libraries.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    return manager_of(device).statistics().pool_reserved_bytes


@contextlib.contextmanager
def scratch(nbytes: int, *, manager=None) -> Iterator[ScratchBlock]:
    """Bump-allocate this thread's device allocations inside the block from one reserved
    block of ``nbytes`` bytes (a linear allocator with free-all; :mod:`numba_pool.allocator.scratch`).

    :param nbytes: bytes to reserve (rounded up to 256 per allocation inside).
    :param manager: the :class:`~numba_pool.NumbaPoolManager` to reserve from; by default the
        current CUDA context's.
    :raises ValueError: for ``nbytes`` <= 0.
    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    :raises numba.cuda.cudadrv.driver.CudaAPIError: when the block cannot be reserved.
    """
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        raise ValueError(f"numba_pool.scratch: nbytes={nbytes!r} must be a positive number of bytes")
    manager = manager_of() if manager is None else manager
    with manager.scratch(nbytes) as block:
        yield block
