"""numba_pool's EMM plugin: Numba's device allocations served by a stream-ordered mempool.

A thin class.  :meth:`NumbaPoolManager.initialize` makes the device's mempool and allocator
(:mod:`numba_pool.allocator`, which owns the stream rule) and composes the allocation path
(:mod:`numba_pool.plugin.path`); everything else forwards to the allocator, the pinned host
cache or the statistics.

Note [The path is the manager's memalloc]
    Numba calls ``context.memory_manager.memalloc(size)``.  A method that forwarded to the path
    would put one more Python call on every allocation, so :meth:`NumbaPoolManager._bind` makes
    the composed path itself the instance's ``memalloc``, and it is the only code that sets or
    removes it.  The class's :meth:`~NumbaPoolManager.memalloc` runs only when no path is bound:
    before the first initialization and after a reset (Numba keeps the manager across a reset and
    does not call ``initialize`` again), and initializes first.

Note [One class for every frontend]
    Each Numba CUDA frontend (numba-cuda, Numba-CUDA-MLIR) has its own EMM base classes, so the
    manager Numba instantiates is :class:`NumbaPoolManager` on that frontend's
    ``HostOnlyCUDAMemoryManager`` (:func:`manager_class`, one class per frontend).
    :class:`NumbaPoolManager` itself, what ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` and
    ``cuda.set_memory_manager(numba_pool.NumbaPoolManager)`` hand to either frontend, is the
    frontend-neutral base: instantiating it (``__new__``) builds the class of the frontend whose
    context it is given, or, for the context-less instance ``set_memory_manager`` makes to read
    the interface version, of the frontend module calling.  ``isinstance(m, NumbaPoolManager)``
    holds for either frontend's managers.

Note [Lifetimes across a reset]
    An array may outlive :meth:`NumbaPoolManager.reset` (or its context).  Its release must then
    neither raise nor free memory that a later allocation owns at the same address: the reset
    drops the allocator whole (its ledger emptied, its arena marked dropped), and a late release
    finds nothing to free.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from functools import partial

from .. import config as _config
from ..allocator import threads
from ..allocator.device import DeviceAllocator
from ..allocator.host_blocks import HostBlocks
from ..allocator.scratch import scratch_scope
from ..allocator.usage import UsageTracker
from ..allocator.waits import Deferral
from ..cuda import driver
from ..cuda import frontend as frontends
from ..cuda.context import OwnerContext
from ..cuda.frontend import Frontend
from ..cuda.mempool import MemPool, device_memory_info
from ..cuda.pointers import PoolPointer, data_address
from ..cuda.streams import as_stream_ref
from ..observe.alloclog import AllocationLog
from ..observe.statistics import PoolStatistics, collect
from . import debugging, settings
from .host_memory import host_memory
from .managed_memory import ManagedSource, managed_cache
from .path import Path, Recording, compose
from .state import process


class NumbaPoolManager:
    """EMM plugin serving Numba's device allocations from a stream-ordered mempool.

    Numba creates one instance per CUDA context, hence per device and frontend; each frontend's
    instances are of :func:`manager_class`'s subclass for it (Note [One class for every
    frontend]).  Pinned and mapped host
    memory come from the host cache (:mod:`numba_pool.allocator.host_blocks`) when
    ``NUMBA_POOL_HOST`` is on, managed memory from the managed cache when ``NUMBA_POOL_MANAGED``
    is on (the default) and the device has concurrent managed access; otherwise, and for
    ``mempin`` and host-attached managed memory, Numba's own handling
    (``HostOnlyCUDAMemoryManager``).

    :param config: the options of this manager (tests and the benchmark); None: the process's
        (:mod:`numba_pool.plugin.settings`), as Numba's ``context=`` alone gives.

    Documented seams, for tests and tools: :attr:`allocator` (the device's
    :class:`~numba_pool.allocator.device.DeviceAllocator`, None before initialization and after a
    reset), :attr:`path` (the composed :class:`~numba_pool.plugin.path.Path`), :attr:`host` (the
    pinned host cache, or None), :attr:`managed` (the managed cache, or None;
    :attr:`managed_off_because` says why when it is None), :attr:`log` (the allocation log, or
    None), :attr:`config` (the options in effect once initialized).
    """

    #: The frontend whose base classes this class derives from (None on this neutral base).
    frontend: Frontend | None = None

    def __new__(cls, *args, **kwargs):
        if cls is NumbaPoolManager:  # Note [One class for every frontend]
            context = kwargs.get("context", args[0] if args else None)
            name = (None if context is None else frontends.name_of(context)) or frontends.of_caller(1)
            chosen = frontends.load(name) if name else frontends.resolve("numba_pool.NumbaPoolManager(context)")
            cls = manager_class(chosen)
        return super().__new__(cls)

    def __init__(self, *args, config: _config.PoolConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if self.context is not None:
            frontends.note_serving(self.frontend)
        self._requested_config = config
        self.config: _config.PoolConfig | None = None
        self.allocator: DeviceAllocator | None = None
        self.path: Path | None = None
        self.host: HostBlocks | None = None  # kept across resets, as Numba keeps its own host memory
        self.managed: HostBlocks | None = None  # the managed cache and its pool, kept across resets
        self.managed_off_because = "the plugin is not initialized yet"
        self._init_lock = threading.Lock()  # guards initialization, reset and composing the path
        self._usage = UsageTracker()  # this device's usage events, across resets
        self.log: AllocationLog | None = None  # NUMBA_POOL_LOG's, kept across resets
        self.context_proxy = None  # what pinned memory holds, as Numba's memhostalloc passes
        self.deferral = Deferral()  # defer_cleanup's blocks and held-back releases, across resets

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
        release threshold, pre-reserve ``initial_size`` bytes and compose the allocation path.
        Idempotent: Numba calls it each time the context is pushed.

        :raises ConfigError: when a ``NUMBA_POOL_*`` variable is bad (first context only).
        :raises RuntimeError: when the interpreter runs without its GIL
            (:func:`numba_pool.allocator.threads.require_gil`).
        :raises CudaAPIError: when the driver refuses to create or configure the pool.
        """
        if self.allocator is not None:
            return
        with self._init_lock:
            if self.allocator is not None:
                return
            threads.require_gil()
            config = self._requested_config or settings.config_in_effect()
            cu = driver.cu
            _, total = device_memory_info(cu)
            pool = MemPool(cu, self.device_id, config, total)
            pool.reserve(config.initial_size)
            allocator = DeviceAllocator(cu, pool, self.context, self._usage, config,
                                        before_retry=self.deallocations.clear, deferral=self.deferral,
                                        after_reset=self.allocate_block, pointer=self.frontend.PoolPointer)
            self.config = config
            if self.context_proxy is None:
                self.context_proxy = _proxy(self.context)
            if config.host and self.host is None:
                self.host = HostBlocks(cu, max_size=config.host_max_size,
                                       release_threshold=_config.release_limit(config.host_release_threshold),
                                       owner=OwnerContext.of(cu, self.context))
            if self.managed is None:
                self.managed, self.managed_off_because = managed_cache(cu, self.device_id, self.context, config)
            if config.log and self.log is None:
                self.log = AllocationLog(config.log)
            process.register(self)  # before composing: a scope opening from now on recomposes this path
            self._bind(allocator)
            self.allocator = allocator  # last: initialize()'s check without the lock reads it
        # Outside the lock: starting the history composes every registered manager's path again,
        # this one's included, which takes this lock (a reset leaves the manager registered).
        if config.leak_report:
            debugging.enable_leak_report(managers)
        if config.oom_snapshot:
            debugging.ensure_recording()

    def _bind(self, allocator: DeviceAllocator | None) -> None:
        """Compose ``allocator``'s path and make it this instance's ``memalloc``; None unbinds
        it (Note [The path is the manager's memalloc]).  Under ``_init_lock``."""
        if allocator is None:
            self.path = None
            self.__dict__.pop("memalloc", None)
            return
        self.path = _compose(self, allocator)
        self.memalloc = self.path.allocate

    def recompose(self) -> None:
        """Compose the allocation path again, for the adaptors switched on now."""
        with self._init_lock:
            if self.allocator is not None:  # else the next memalloc initializes and composes
                self._bind(self.allocator)

    def memalloc(self, size: int) -> PoolPointer:
        """Allocate ``size`` bytes of device memory, stream-ordered on the thread's allocation
        stream; the returned pointer releases it, by the stream rule
        (:mod:`numba_pool.allocator`), when Numba drops it or on ``free()``.  Once initialized,
        the composed path serves this call (Note [The path is the manager's memalloc]).

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` when the request cannot be met even
            after synchronizing and trimming the pool (the message gives the requested size, the
            pool's reserved and used bytes and the device's free and total); any other driver
            error as returned.
        """
        self.initialize()
        return self.memalloc(size)

    def allocate_unadapted(self, size: int) -> PoolPointer:
        """:meth:`memalloc` from the block source, without the adaptors (scratch blocks are
        neither logged nor counted: the arrays carved from them are)."""
        self.initialize()
        return self.allocator.source.allocate(size)

    def allocate_block(self, size: int, stream) -> "Block":
        """The core's ``allocate(size, stream)`` on this device's current generation
        (:meth:`DeviceAllocator.allocate <numba_pool.allocator.device.DeviceAllocator.allocate>`):
        what an allocation that a reset overtook gets instead."""
        self.initialize()
        return self.allocator.allocate(size, stream)

    def scratch(self, nbytes: int):
        """This thread's scratch scope on this device (:func:`numba_pool.scratch`)."""
        self.initialize()
        return scratch_scope(self.allocator, nbytes, self.allocate_unadapted)

    def memhostalloc(self, size: int, mapped: bool = False, portable: bool = False, wc: bool = False):
        """``size`` bytes of page-locked host memory, as Numba's: a ``PinnedMemory``, or with
        ``mapped`` the owned view of a ``MappedMemory`` whose device pointer kernels can use
        (``cuMemHostGetDevicePointer``).  With ``NUMBA_POOL_HOST`` on, from the cache of
        ``cuMemHostAlloc`` blocks (the block goes back to the cache, not to ``cuMemFreeHost``,
        when Numba drops the memory); else, and for 0 bytes, Numba's.

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the host cache's sizes.
        """
        self.initialize()
        if self.host is None or size <= 0:
            return super().memhostalloc(size, mapped, portable, wc)
        return host_memory(self, self.host, size, mapped, portable, wc)

    def memallocmanaged(self, size: int, attach_global: bool = True):
        """``size`` bytes of managed (unified) memory, which the host and every device may
        access, as Numba's: a ``ManagedMemory`` that is also a buffer (``cuda.managed_array``
        wraps it in a NumPy array).  With ``NUMBA_POOL_MANAGED`` on, globally attached memory
        comes from the device's managed mempool through a cache under the host rule (a block is
        handed out again only once the host has observed every earlier use complete:
        :mod:`numba_pool.allocator`, rule 9); host-attached memory (``attach_global=False``),
        0 bytes, and a device without concurrent managed access get Numba's own
        (``cuMemAllocManaged``).

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the managed cache's sizes and
            its cap (``NUMBA_POOL_MANAGED_MAX_SIZE``).
        """
        self.initialize()
        path = self.path
        allocate = None if path is None else path.allocate_managed
        if allocate is None or not attach_global or size <= 0:
            return super().memallocmanaged(size, attach_global)
        return allocate(size)

    def get_memory_info(self):
        """``(free, total)`` bytes that allocations through this manager can still get.

        For a pool, *free* is the device's free memory (``cuMemGetInfo``) plus the memory the
        pool has reserved but not handed out (reserved - used), since the pool serves requests
        from it first; with ``max_size`` it is at most ``max_size - used`` and *total* is
        ``max_size``.  Other processes and libraries can take device memory at any moment, so
        this is an estimate, as it is for Numba's default manager.
        """
        self.initialize()
        free, total = self.allocator.memory_info()
        return self.frontend.MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        """An IPC handle for ``memory`` (a pointer from this manager, or a view of one) that
        another process opens with Numba's ``IpcHandle`` methods; see :mod:`numba_pool.ipc`
        (``cuMemPoolExportPointer`` on an exportable pool) for the lifetimes.

        :raises ValueError: when ``memory`` is not in a live numba_pool allocation.
        :raises RuntimeError: when the pool cannot be exported, with the reason
            (``NUMBA_POOL_IPC=0``, ``NUMBA_POOL_USE_DEFAULT_POOL``, or no support: WSL2).
        """
        from ..ipc import export  # multiprocessing's reduction and the lease files: imported at the first export

        self.initialize()
        return export(self.allocator, memory, self.context.device.get_device_identity(), self.frontend,
                      process.leases)

    def reset(self) -> None:
        """Free every allocation of this context and destroy the private pool (trim the shared
        default pool).  Safe before :meth:`initialize` and safe to repeat; device arrays still
        alive afterwards point to freed memory, as with Numba's default manager, and their
        releases do nothing (Note [Lifetimes across a reset]).  The next allocation creates a
        new pool.  Pinned and managed arrays still alive keep valid memory (the host may touch
        it: freeing it would crash the process) until they are dropped; the caches free what
        they hold.  Also clears Numba's host allocations (``super().reset()``)."""
        _note("reset", self.device_id)
        super().reset()
        if self.host is not None:
            self.host.reset()
        if self.managed is not None:
            self.managed.reset()
        with self._init_lock:
            allocator = self.allocator
            if allocator is None:
                return
            self.allocator = None
            self._bind(None)  # the next allocation initializes again
            allocator.reset()
            self._usage.forget_in_use()  # arena and scratch blocks still alive count as freed
            if self.log is not None:
                self.log.flush()

    @contextlib.contextmanager
    def defer_cleanup(self):
        """While active, the memory of arrays dropped inside it is not handed out again; it is
        released (still without host synchronization) when the outermost block exits, ordered
        after the work queued by the drop on the array's allocation stream and its
        ``record_stream`` streams, and after the work of every blocking stream by the exit
        (Note [A release made free later orders now] in :mod:`numba_pool.allocator.waits`).
        Work on another non-blocking stream that relies on the block must have completed, as
        the host sees it, by the exit (synchronize that stream inside the block).  The block
        stays open across a :meth:`reset`, as Numba's own.  Also defers Numba's cleanup of
        host allocations (``super()``)."""
        self.initialize()
        with super().defer_cleanup(), self.deferral.holding_back():
            yield

    # -- numba_pool extensions ------------------------------------------------------------

    def record_stream(self, array, stream) -> None:
        """Keep ``array``'s block from reuse until the work queued on ``stream`` by the time
        the array is freed has finished (an event recorded on ``stream`` at free time, waited
        for by the allocation stream).

        :raises ValueError: when the array's memory is not a live allocation of this manager.
        :raises TypeError: when ``stream`` is not a stream, or ``array`` not an array.
        """
        ref = as_stream_ref(stream)
        address = data_address(array)
        self.initialize()
        if not self.allocator.record_stream(address, ref) and not any(
                cache is not None and cache.record_stream(address, ref) for cache in (self.host, self.managed)):
            raise ValueError(
                f"numba_pool.record_stream: address {address:#x} is not in a live allocation of "
                f"numba_pool on device {self.device_id}")

    def statistics(self) -> PoolStatistics:
        """A snapshot of this manager's usage and its pool's attributes."""
        self.initialize()
        return collect(self._usage, self.allocator, self.host, self.managed)

    def reset_peak(self) -> None:
        """Reset the peaks (ours and the pool's high watermarks) to the current values."""
        self.initialize()
        self._usage.reset_peak()
        self.allocator.issue_frees()  # the legacy-stream frees releases queued, before the pool's figures
        self.allocator.pool.reset_high_watermarks()

    def trim(self, keep_bytes: int = 0) -> None:
        """Give the arena's empty slabs back, synchronize the context so every stream-ordered
        free has completed, then release reserved but unused pool memory down to
        ``keep_bytes`` (``cuMemPoolTrimTo``); with ``NUMBA_POOL_HOST``, free the cached pinned
        blocks whose events completed (``cuMemFreeHost``); with ``NUMBA_POOL_MANAGED``, give
        the cached managed blocks whose events completed back to the managed mempool and trim
        it to 0 (after another synchronize)."""
        self.initialize()
        _note("trim", self.device_id)
        self.allocator.trim(keep_bytes)
        for cache in (self.host, self.managed):
            if cache is not None:
                cache.trim()


def _proxy(context):
    """What pinned and managed memory hold of their context: a weak proxy, as Numba's own pass
    (no reference cycle through the context), or the object itself where it cannot be weakly
    referenced (a stand-in context of a test or a tool)."""
    try:
        return weakref.proxy(context)
    except TypeError:
        return context


# -- the managers of the process, kept by the process state (numba_pool.plugin.state) ------------

def manager_class(frontend: Frontend) -> type:
    """:class:`NumbaPoolManager` on ``frontend``'s ``HostOnlyCUDAMemoryManager``: the class
    that frontend's contexts instantiate (Note [One class for every frontend])."""
    return process.manager_class(
        frontend, lambda: frontend.derive(NumbaPoolManager, frontend.HostOnlyCUDAMemoryManager))


def managers() -> list[NumbaPoolManager]:
    """The managers initialized at least once, every frontend's, alive now."""
    return process.managers()


def _compose(manager: NumbaPoolManager, allocator: DeviceAllocator) -> Path:
    """``manager``'s allocation paths with the adaptors switched on now
    (:func:`numba_pool.plugin.path.compose`)."""
    managed = None
    if manager.managed is not None:
        prefetch_to = manager.device_id if manager.config.managed_prefetch else None
        managed = ManagedSource(manager, manager.managed, prefetch_to).allocate
    recording = None
    history = process.recording
    if history is not None:
        recording = Recording(history, manager.device_id, manager.deferral, lambda: device_memory_info(allocator.cu)[0],
                              partial(debugging.out_of_memory, managers, manager.config.oom_snapshot))
    return compose(allocator, managed=managed, log=manager.log, counting=process.counting(), recording=recording)


def _note(action: str, device: int) -> None:
    """A ``trim`` or ``reset`` event in the history, when it records."""
    history = process.recording
    if history is not None:
        history.record(action, device, 0, 0, 0, "device")
