"""numba_pool's EMM plugin: Numba device allocations served by a stream-ordered mempool.

A thin class: it picks the path for each request (the arena for small blocks when it is on,
the mempool otherwise, a scratch block inside ``numba_pool.scratch``) and the allocation stream
(:mod:`numba_pool.streams`); :mod:`numba_pool.ordering` allocates, and decides when memory may
be reused (the stream-safety rule is stated at its top); :mod:`numba_pool.mempool` holds the
pool; statistics are replayed from usage events (:mod:`numba_pool.stats`).

The subtle lifetime issue: an array may outlive :meth:`NumbaPoolManager.reset` (or its
context).  Its release must then neither raise nor free memory that a later allocation owns at
the same address: the ordering of the old generation is dropped whole (its ledger emptied, its
arena marked dropped), and a late release finds nothing to free.  Numba keeps the manager
across a reset and does not call :meth:`initialize` again, so ``reset`` also unbinds the fast
allocation path: the next :meth:`memalloc` initializes first.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from functools import partial

import humanfriendly
try:
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer
    from numba.cuda.cudadrv.driver import CudaAPIError, MemoryInfo
except ImportError:  # the CUDA simulator's numba.cuda has no memory managers: stand-ins
    from . import _simulator

    if not _simulator.enabled():
        raise
    from numba.cuda.cudadrv.driver import CudaAPIError
    from ._simulator import HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer

    _simulator.note_environment()

from . import config as _config
from . import driver
from .alloclog import AllocationLog
from .host import HostBlock, HostBlocks, host_flags
from .mempool import MemPool, device_memory_info
from .ordering import StreamOrdering
from .pointer import PooledPinnedMemory
from .stats import PoolStatistics, UsageTracker
from .streams import LEGACY, _state, as_stream_ref, scopes_entered


def _fmt(nbytes: int) -> str:
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)"


class NumbaPoolManager(HostOnlyCUDAMemoryManager):
    """EMM plugin serving Numba's device allocations from a stream-ordered mempool.

    Numba creates one instance per CUDA context, hence per device.  Pinned and mapped host
    memory come from :mod:`numba_pool.host`'s cache when ``NUMBA_POOL_HOST`` is on; otherwise,
    and for ``mempin`` and managed memory, Numba's own handling (``HostOnlyCUDAMemoryManager``).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.config: _config.PoolConfig | None = None
        self._pool: MemPool | None = None
        self._ordering: StreamOrdering | None = None
        self._init_lock = threading.Lock()
        self._usage = UsageTracker()
        self._log: AllocationLog | None = None
        self._host: HostBlocks | None = None

    @property
    def device_id(self) -> int:
        """The context's device ordinal.  A context that Numba attached to a primary context
        made by another library holds a raw ``CUdevice`` instead of a Numba ``Device``."""
        device = self.context.device
        return device.id if hasattr(device, "id") else int(device)

    @property
    def interface_version(self) -> int:
        """Numba's EMM plugin interface version implemented: 1."""
        return 1

    def initialize(self) -> None:
        """Create (or look up) the device's mempool with the process's configuration, set its
        release threshold, pre-reserve ``initial_size`` bytes and bind the allocation path.
        Idempotent: Numba calls it each time the context is pushed.

        :raises ConfigError: when a ``NUMBA_POOL_*`` variable is bad (first context only).
        :raises CudaAPIError: when the driver refuses to create or configure the pool.
        """
        if self._ordering is not None:
            return
        with self._init_lock:
            if self._ordering is not None:
                return
            config = _config_in_effect()
            cu = driver.cu
            _note_device(cu, self.device_id)
            _, total = device_memory_info(cu)
            pool = MemPool(cu, self.device_id, config, total)
            pool.reserve(config.initial_size)
            ordering = StreamOrdering(cu, pool, self.context, self._usage, config,
                                      before_retry=self.deallocations.clear,
                                      describe_out_of_memory=self._out_of_memory_message)
            self.config, self._pool = config, pool
            if config.host and self._host is None:
                threshold = None if config.host_release_threshold == _config.KEEP_ALL else config.host_release_threshold
                self._host = HostBlocks(cu, max_size=config.host_max_size, release_threshold=threshold,
                                        owner=driver.OwnerContext(cu, getattr(self.context, "handle", None)))
                self._context_proxy = weakref.proxy(self.context)  # as Numba's memhostalloc passes
            self._bind(ordering, config)
            self._ordering = ordering

    def _bind(self, ordering: StreamOrdering, config: _config.PoolConfig) -> None:
        # Decided once, by binding instance attributes that shadow the class's memalloc, so that
        # neither the arena test nor the logging test costs anything when they are off.
        ordering.pooled.in_scratch = self._allocate_in_scratch
        allocate = ordering.pooled.allocate
        if ordering.arena is not None:
            ordering.arena.delegate = allocate  # large blocks and scratch
            allocate = ordering.arena.allocate
        self.allocate_unlogged = allocate  # what scratch blocks are reserved through
        if config.log:
            if self._log is None:
                self._log = AllocationLog(config.log)
            allocate = partial(_memalloc_logged, allocate, self._log)
        from .scoped_stats import bind_memalloc  # wrapped by a counter while numba_pool.statistics() is open

        self.memalloc = bind_memalloc(self, allocate)

    def memalloc(self, size: int) -> MemoryPointer:
        """Allocate ``size`` bytes of device memory, stream-ordered on the thread's allocation
        stream; the returned pointer releases it, by :mod:`numba_pool.ordering`'s rule, when
        Numba drops it or on ``free()``.  (Bound to the chosen path by :meth:`initialize`.)

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` when the request cannot be met even
            after synchronizing and trimming the pool (the message gives the requested size, the
            pool's reserved and used bytes and the device's free and total); any other driver
            error as returned.
        """
        self.initialize()
        return self.memalloc(size)

    def allocate_unlogged(self, size: int) -> MemoryPointer:
        """:meth:`memalloc` without the allocation log (scratch blocks are not logged; the
        arrays carved from them are)."""
        self.initialize()
        return self.allocate_unlogged(size)

    def scratch_ordering(self) -> StreamOrdering:
        """The ordering that ``numba_pool.scratch`` registers its blocks with (initializes)."""
        self.initialize()
        return self._ordering

    def _allocate_in_scratch(self, stream, size: int) -> MemoryPointer:
        return stream.scratch.allocate(self, size)

    def memhostalloc(self, size: int, mapped: bool = False, portable: bool = False, wc: bool = False):
        """``size`` bytes of page-locked host memory, as Numba's: a ``PinnedMemory``, or with
        ``mapped`` the owned view of a ``MappedMemory`` whose device pointer kernels can use
        (``cuMemHostGetDevicePointer``).  With ``NUMBA_POOL_HOST`` on, from the cache of
        ``cuMemHostAlloc`` blocks (:mod:`numba_pool.host`; the block goes back to the cache,
        not to ``cuMemFreeHost``, when Numba drops the memory); else, and for 0 bytes, Numba's.

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the host cache's sizes.
        """
        self.initialize()
        host = self._host
        if host is None or size <= 0:
            return super().memhostalloc(size, mapped, portable, wc)
        block = host.allocate(size, host_flags(mapped, portable, wc))
        finalizer = partial(_release_host, self, host, block, mapped)
        if not mapped:
            return PooledPinnedMemory(self._context_proxy, block.host, size, finalizer)
        mem = _pooled_mapped_memory(self._context_proxy, block, size, finalizer)
        self.allocations[block.host] = mem
        return mem.own()

    def _hold_back_host(self, release) -> bool:
        """Inside ``defer_cleanup``: keep ``release`` for the outermost exit; True if kept."""
        ordering = self._ordering
        if ordering is None or not ordering.waits.depth:
            return False
        ordering.waits.held_back.append(release)
        if not ordering.waits.depth:  # the block exited meanwhile
            ordering.waits.flush()
        return True

    def get_memory_info(self) -> MemoryInfo:
        """``(free, total)`` bytes that allocations through this manager can still get.

        For a pool, *free* is the device's free memory (``cuMemGetInfo``) plus the memory the
        pool has reserved but not handed out (reserved - used), since the pool serves requests
        from it first; with ``max_size`` it is at most ``max_size - used`` and *total* is
        ``max_size``.  Other processes and libraries can take device memory at any moment, so
        this is an estimate, as it is for Numba's default manager.
        """
        self.initialize()
        free, total = device_memory_info(self._pool._cu)
        usage = self._pool.usage()
        free += usage.reserved - usage.used
        if self._ordering.arena is not None:
            arena = self._ordering.arena.statistics()
            free += arena.reserved - arena.in_use
        cap = self._pool.max_size
        if cap:
            total = cap
            free = min(free, cap - usage.used)
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        """An IPC handle for ``memory`` (a pointer from this manager, or a view of one) that
        another process opens with Numba's ``IpcHandle`` methods; see :mod:`numba_pool.ipc`
        (``cuMemPoolExportPointer`` on an exportable pool) for the lifetimes.

        :raises ValueError: when ``memory`` is not in a live numba_pool allocation.
        :raises RuntimeError: when the pool cannot be exported, with the reason
            (``NUMBA_POOL_IPC=0``, ``NUMBA_POOL_USE_DEFAULT_POOL``, or no support: WSL2).
        """
        from . import ipc

        self.initialize()
        return ipc.export(self, memory)

    def reset(self) -> None:
        """Free every allocation of this context and destroy the private pool (trim the shared
        default pool).  Safe before :meth:`initialize` and safe to repeat; arrays still alive
        afterwards point to freed memory, as with Numba's default manager, and their releases
        do nothing.  The next allocation creates a new pool.  Also clears Numba's host
        allocations (``super().reset()``)."""
        super().reset()
        if self._host is not None:
            self._host.reset()
        with self._init_lock:
            ordering = self._ordering
            if ordering is None:
                return
            self._ordering = None
            for bound in ("memalloc", "allocate_unlogged"):  # the next allocation initializes again
                self.__dict__.pop(bound, None)
            ordering.reset()
            self._usage.forget_in_use()  # arena and scratch blocks still alive count as freed
            if self._log is not None:
                self._log.flush()

    @contextlib.contextmanager
    def defer_cleanup(self):
        """While active, hold back the stream-ordered frees of arrays dropped inside it; they
        are issued (still without host synchronization) when the outermost block exits.

        A stream-ordered free never blocks the host, and on the legacy default stream it waits
        for the work of Numba's blocking streams anyway; deferring keeps Numba's promise that
        no memory is released inside the block, which matters for work on non-blocking
        streams.  Also defers Numba's cleanup of host allocations (``super()``)."""
        self.initialize()
        with super().defer_cleanup(), self._ordering.waits.holding_back():
            yield

    # -- numba_pool extensions ------------------------------------------------------------

    def record_stream(self, array, stream) -> None:
        """Keep ``array``'s block from reuse until the work queued on ``stream`` by the time
        the array is freed has finished (an event recorded on ``stream`` at free time, waited
        for by the allocation stream).

        :raises ValueError: when the array's memory is not a live allocation of this manager.
        """
        ref = as_stream_ref(stream)
        address = _data_address(array)
        self.initialize()
        if not self._ordering.record_stream(address, ref) and not (
                self._host is not None and self._host.record_stream(address, ref)):
            raise ValueError(
                f"numba_pool.record_stream: address {address:#x} is not in a live allocation of "
                f"numba_pool on device {self.device_id}")

    def statistics(self) -> PoolStatistics:
        """A snapshot of this manager's usage and its pool's attributes."""
        self.initialize()
        pool = self._pool.usage()
        u = self._usage
        u.drain()
        return PoolStatistics(
            bytes_in_use=u.bytes_in_use, peak_bytes_in_use=u.peak_bytes_in_use,
            blocks_in_use=u.blocks_in_use, peak_blocks_in_use=u.peak_blocks_in_use,
            total_allocations=u.total_allocations, total_frees=u.total_frees, total_bytes=u.total_bytes,
            pool_reserved_bytes=pool.reserved, pool_reserved_high=pool.reserved_high,
            pool_used_bytes=pool.used, pool_used_high=pool.used_high,
            oom_retries=u.oom_retries, oom_errors=u.oom_errors, **self._arena_fields(), **self._host_fields())

    def _host_fields(self) -> dict:
        if self._host is None:
            return {}
        return {"host_on": True, **self._host.statistics()}

    def _arena_fields(self) -> dict:
        if self._ordering.arena is None:
            return {}
        a = self._ordering.arena.statistics()
        return {"arena_reserved_bytes": a.reserved, "arena_in_use_bytes": a.in_use,
                "arena_free_blocks": a.free_blocks, "arena_largest_free_block": a.largest_free_block,
                "arena_on": True, "arena_cached_bytes": a.cached, "arena_quarantined_bytes": a.quarantined,
                "arena_free_bytes": a.free, "arena_slabs": a.slabs}

    def reset_peak(self) -> None:
        """Reset the peaks (ours and the pool's high watermarks) to the current values."""
        self.initialize()
        self._usage.reset_peak()
        self._pool.reset_high_watermarks()

    def trim(self, keep_bytes: int = 0) -> None:
        """Give the arena's empty slabs back, synchronize the context so every stream-ordered
        free has completed, then release reserved but unused pool memory down to
        ``keep_bytes`` (``cuMemPoolTrimTo``); with ``NUMBA_POOL_HOST``, free the cached pinned
        blocks whose events completed (``cuMemFreeHost``)."""
        self.initialize()
        self._ordering.trim(keep_bytes)
        if self._host is not None:
            self._host.trim()

    def _out_of_memory_message(self, size: int) -> str:
        pool = self._pool
        usage = pool.usage()
        free, total = device_memory_info(pool._cu)
        kind = "private mempool" if pool.is_private else "device default mempool"
        cap = f" (capped at {_fmt(pool.max_size)})" if pool.max_size else ""
        arena = ""
        if self._ordering is not None and self._ordering.arena is not None:
            a = self._ordering.arena.statistics()
            arena = f", arena slabs {_fmt(a.reserved)} of which {_fmt(a.in_use)} in blocks"
        return (f"numba_pool: out of memory allocating {_fmt(size)} on device {pool.device_id} "
                f"after synchronizing, trimming and retrying once: {kind}{cap} reserves {_fmt(usage.reserved)}, "
                f"of which {_fmt(usage.used)} used{arena}; device has {_fmt(free)} free of {_fmt(total)}")


def _memalloc_logged(allocate, log: AllocationLog, size: int) -> MemoryPointer:
    """``memalloc`` when ``NUMBA_POOL_LOG`` is set: log the allocation (or its failure), and
    its free when the memory is released (``free()`` or collection), before the release, so
    that the free row precedes the row of any later allocation at the same address."""
    stream = _state.stream.value
    try:
        mem = allocate(size)
    except CudaAPIError:
        log.failure(size, stream)
        raise
    address = mem.device_pointer_value
    log.allocate(address, size, stream)
    release = getattr(mem, "_release", None)
    if release is not None:
        mem._release = partial(_log_then_release, log, address, size, stream, release)
    else:  # not one of our pointers (cannot happen today): log at collection
        weakref.finalize(mem, log.free, address, size, stream)
    return mem


def _log_then_release(log: AllocationLog, address: int, size: int, stream: int, release) -> None:
    log.free(address, size, stream)
    release()


def _release_host(manager: NumbaPoolManager, host: HostBlocks, block: HostBlock, mapped: bool) -> None:
    """The finalizer of pinned/mapped memory from the host cache: drop Numba's record of a
    mapped block, then give the block back (held back inside ``defer_cleanup``)."""
    if mapped:
        manager.allocations.pop(block.host, None)
    release = partial(host.release, block)
    if not manager._hold_back_host(release):
        release()


def _pooled_mapped_memory(context, block: HostBlock, size: int, finalizer):
    """Numba's ``MappedMemory`` for a cached block, built as its constructor builds it but
    with the device pointer the cache got (``cuMemHostGetDevicePointer`` through numba_pool's
    driver object) instead of a second driver call."""
    from cuda.bindings import driver as binding
    from numba.cuda.cudadrv.driver import AutoFreePointer, MappedMemory

    mem = MappedMemory.__new__(MappedMemory)
    mem.owned = None
    mem.host_pointer = block.host
    mem._bufptr_ = block.host
    AutoFreePointer.__init__(mem, context, binding.CUdeviceptr(block.device), size, finalizer=finalizer)
    mem.handle = mem.host_pointer
    mem._buflen_ = mem.size
    return mem


def _data_address(array) -> int:
    """The device address of an array's first byte (CUDA Array Interface) or of a
    ``MemoryPointer``; for host memory (a pinned NumPy array, ``PinnedMemory``) its host
    address."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    pointer = getattr(array, "device_pointer_value", None)
    if pointer is not None:
        return int(pointer)
    interface = getattr(array, "__array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    pointer = getattr(array, "host_pointer", None)
    if pointer is not None:
        return int(pointer)
    raise TypeError(f"numba_pool: {type(array).__name__} is neither a device array, a pinned host array nor a MemoryPointer")


# -- process-wide configuration ------------------------------------------------------------

_config_lock = threading.Lock()
_installed: _config.PoolConfig | None = None


def _config_in_effect() -> _config.PoolConfig:
    """The configuration set by :func:`numba_pool.install`, else read from the environment
    once, when the first context initializes the plugin."""
    global _installed
    with _config_lock:
        if _installed is None:
            _installed = _config.load()
        return _installed


def _set_config(config: _config.PoolConfig) -> None:
    global _installed
    with _config_lock:
        _installed = config


_devices_initialized: set[int] = set()  # device ordinals with a manager in this process


def _note_device(cu, device: int) -> None:
    # Rule 10 of numba_pool.ordering: where the process sees two devices, a release checks the
    # current context (another device's may be current, made so by Numba or by another library).
    _devices_initialized.add(device)
    err, count = cu.cuDeviceGetCount()
    if len(_devices_initialized) > 1 or (err == driver.SUCCESS and count > 1):
        driver.OwnerContext.several = True
