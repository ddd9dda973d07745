"""The EMM plugin, a thin class: :meth:`NumbaPoolManager.initialize` makes the device's mempool and allocator (the
stream rule, :mod:`numba_pool.allocator`) and composes the path (:mod:`numba_pool.plugin.path`); the rest forwards.

Note [The path is the manager's memalloc]
    :meth:`NumbaPoolManager._bind` (alone setting or removing them) makes the composed path the instance's ``memalloc``
    and the block source's ``allocate_block`` its ``allocate_block`` (the doors'): no forwarding call per allocation.
    Unbound (before initialization; after a reset, Numba calls no ``initialize``), the class's methods initialize first.

Note [One class for every frontend]
    Each frontend has EMM bases: :func:`manager_class` puts :class:`NumbaPoolManager` on its
    ``HostOnlyCUDAMemoryManager``; ``isinstance(m, NumbaPoolManager)`` holds for all.  The neutral base's ``__new__``
    builds it for the context's frontend, else (``set_memory_manager`` asking the interface version) the caller's.

Note [Lifetimes across a reset]
    An array may outlive :meth:`NumbaPoolManager.reset`; its release must neither raise nor free memory a
    later allocation owns there: the reset drops the allocator, so a late release finds nothing to free."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from functools import partial

from .. import config as _config
from ..allocator import threads
from ..allocator.device import DeviceAllocator
from ..allocator.fences import AfterFence
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
from .free_lists import DoorFreeLists


class NumbaPoolManager:
    """EMM plugin: one instance per CUDA context (device and frontend; Note [One class for every frontend]).  Device
    memory from the mempool; pinned/mapped memory from the host cache with ``NUMBA_POOL_HOST``; managed from the managed
    cache with ``NUMBA_POOL_MANAGED`` (default) given concurrent managed access; otherwise, and for ``mempin``, Numba's
    own.  Seams (tests, tools): :attr:`allocator` (None before initialization and after a reset), :attr:`path`,
    :attr:`host`, :attr:`managed` (:attr:`managed_off_because` when None), :attr:`log`, :attr:`config`.
    :param config: this manager's options (tests, benchmark); None: the process's."""

    frontend: Frontend | None = None  #: The frontend whose base classes this class derives from (None here).
    #: ``(cuStreamIsCapturing, cuStreamGetId, cuStreamGetFlags)`` of the driver object of the last initialization (a
    #: reset keeps them; the first two ``driver.hot``'s): the doors' (Note [A raw handle's stream], Note [The doors'
    #: free lists]).
    stream_queries = None

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
        #: The doors keeping blocks their owners freed (Note [The doors' free lists]): given back
        #: before figures, trims, resets and out-of-memory retries.
        self.free_lists = DoorFreeLists(self._usage)
        self.log: AllocationLog | None = None  # NUMBA_POOL_LOG's, kept across resets
        self.context_proxy = None  # what pinned memory holds, as Numba's memhostalloc passes
        self.deferral = Deferral()  # defer_cleanup's blocks and held-back releases, across resets
        # Releases made free after a fence, across resets (a dropped generation's run by the next one's fences).
        self.after_fence, self.unseen = AfterFence(), []

    @property
    def device_id(self) -> int:
        """The context's device ordinal (a primary context made by another library holds a raw ``CUdevice``)."""
        device = self.context.device
        return device.id if hasattr(device, "id") else int(device)

    @property
    def usage(self) -> UsageTracker:
        """This device's usage events, across resets (the statistics' source)."""
        return self._usage

    @property
    def interface_version(self) -> int:
        """Numba's EMM plugin interface version implemented: 1."""
        return 1

    def initialize(self) -> None:
        """Make the device's mempool and allocator, reserve ``initial_size`` bytes, compose the path; idempotent (Numba
        calls it at each context push).  :raises ConfigError: for a bad ``NUMBA_POOL_*`` variable.
        :raises RuntimeError: without the GIL (``require_gil``).  :raises CudaAPIError: if the pool is refused."""
        if self.allocator is not None:
            return
        with self._init_lock:
            if self.allocator is not None:
                return
            threads.require_gil()
            config = self._requested_config or settings.config_in_effect()
            cu = driver.cu
            self.stream_queries = (driver.hot(cu, "cuStreamIsCapturing"), driver.hot(cu, "cuStreamGetId"),
                                   cu.cuStreamGetFlags)
            _, total = device_memory_info(cu)
            pool = MemPool(cu, self.device_id, config, total)
            pool.reserve(config.initial_size)
            allocator = DeviceAllocator(cu, pool, self.context, self._usage, config,
                                        before_retry=partial(_before_retry, self.deallocations, self.free_lists),
                                        deferral=self.deferral,
                                        after_fence=self.after_fence, unseen=self.unseen,
                                        on_wait=self.free_lists.forget,
                                        after_reset=partial(NumbaPoolManager.allocate_block, self), pointer=self.frontend.PoolPointer)
            self.config = config
            if self.context_proxy is None:
                self.context_proxy = _proxy(self.context)
            if config.host and self.host is None:
                self.host = HostBlocks(cu, max_size=config.host_max_size,
                                       release_threshold=_config.release_limit(config.host_release_threshold),
                                       owner=OwnerContext.of(cu, self.context), deferral=self.deferral)
            if self.managed is None:
                self.managed, self.managed_off_because = managed_cache(cu, self.device_id, self.context, config, self.deferral)
            if config.log and self.log is None:
                self.log = AllocationLog(config.log)
            process.register(self)  # before composing: a scope opening from now on recomposes this path
            self._bind(allocator)
            self.allocator = allocator  # last: initialize()'s check without the lock reads it
        if config.cuda_core:  # the cuda.core door, where Numba's launches allocate (numba_pool.plugin.resource)
            from .resource import install  # imports cuda.core
            install(self)
        if config.leak_report:  # these two outside the lock: starting the history recomposes every path, ours too
            debugging.enable_leak_report(managers)
        if config.oom_snapshot:
            debugging.ensure_recording()

    def _bind(self, allocator: DeviceAllocator | None) -> None:
        """Compose ``allocator``'s path and make it this instance's ``memalloc``; None unbinds
        it (Note [The path is the manager's memalloc]).  Under ``_init_lock``."""
        if allocator is None:
            self.path = None
            self.__dict__.pop("memalloc", None)
            self.__dict__.pop("allocate_block", None)
            return
        self.path = _compose(self, allocator)
        self.memalloc = self.path.allocate
        self.allocate_block = allocator.source.allocate_block

    def recompose(self) -> None:
        """Compose the allocation path again, for the adaptors switched on now."""
        with self._init_lock:
            if self.allocator is not None:  # else the next memalloc initializes and composes
                self._bind(self.allocator)

    def memalloc(self, size: int) -> PoolPointer:
        """``size`` bytes, ordered on the thread's allocation stream, released by the stream rule once dropped
        (Note [The path is the manager's memalloc]).  :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` after
        synchronizing and trimming (pool's and device's sizes); other driver errors as returned."""
        self.initialize()
        return self.memalloc(size)

    def allocate_unadapted(self, size: int) -> PoolPointer:
        """:meth:`memalloc` without the adaptors (scratch blocks: the arrays carved from them are counted)."""
        self.initialize()
        return self.allocator.source.allocate(size)

    def allocate_block(self, size: int, stream, not_capturing: bool = False) -> "Block":
        """The current generation's ``allocate(size, stream)`` (for an allocation a reset overtook; ``not_capturing``
        is ignored: the source asks again)."""
        self.initialize()
        return self.allocator.allocate(size, stream)

    def scratch(self, nbytes: int):
        """This thread's scratch scope on this device (:func:`numba_pool.scratch`)."""
        self.initialize()
        return scratch_scope(self.allocator, nbytes, self.allocate_unadapted)

    def memhostalloc(self, size: int, mapped: bool = False, portable: bool = False, wc: bool = False):
        """``size`` bytes of page-locked host memory as Numba's (``PinnedMemory``; ``mapped``: a ``MappedMemory`` view,
        ``cuMemHostGetDevicePointer``): with ``NUMBA_POOL_HOST`` from the ``cuMemHostAlloc`` block cache, else (and for
        0 bytes) Numba's.  :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the host cache's sizes."""
        self.initialize()
        if self.host is None or size <= 0:
            return super().memhostalloc(size, mapped, portable, wc)
        return host_memory(self, self.host, size, mapped, portable, wc)

    def memallocmanaged(self, size: int, attach_global: bool = True):
        """``size`` bytes as Numba's ``ManagedMemory``: global ones, with ``NUMBA_POOL_MANAGED``, from the managed cache
        (rule 9); host-attached, 0 bytes or no concurrent managed access: Numba's (both ``cuMemAllocManaged``).
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the cache's sizes and its cap."""
        self.initialize()
        path = self.path
        allocate = None if path is None else path.allocate_managed
        if allocate is None or not attach_global or size <= 0:
            return super().memallocmanaged(size, attach_global)
        return allocate(size)

    def get_memory_info(self):
        """``(free, total)`` bytes, an estimate: the device's free memory (``cuMemGetInfo``) plus the
        pool's reserved-but-unused; with ``max_size``, at most ``max_size - used`` of ``max_size``."""
        self.initialize()
        self.free_lists.give_back(streams=False)
        free, total = self.allocator.memory_info()
        return self.frontend.MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        """An IPC handle for ``memory`` (``cuMemPoolExportPointer``; lifetimes: :mod:`numba_pool.ipc`).
        :raises ValueError: ``memory`` in no live allocation.  :raises RuntimeError: pool not exportable (why)."""
        from ..ipc import export  # multiprocessing's reduction and the lease files: imported at the first export

        self.initialize()
        return export(self.allocator, memory, self.context.device.get_device_identity(), self.frontend,
                      process.leases)

    def reset(self) -> None:
        """Free all allocations, destroy the private pool (trim a shared one), ``super().reset()``; repeatable.  Live
        device arrays, then dangling, release nothing (Note [Lifetimes across a reset]); pinned/managed stay valid.
        :raises RuntimeError: while a capture numba_pool knows of is under way (rule 13: it synchronizes), with nothing
            freed."""
        allocator = self.allocator
        if allocator is not None:
            allocator.refuse_during_capture("reset()")
        _note("reset", self.device_id)
        try:  # Note [The doors' free lists]: every door's free list paused for the device meanwhile
            process.pause_free_lists(self.device_id, 1)
            self._reset()
        finally:
            process.pause_free_lists(self.device_id, -1)

    def _reset(self) -> None:
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
        """Hold back the memory of arrays dropped inside, released at the outermost exit after their streams' work and
        every blocking stream's (Note [A release made free later orders now] in :mod:`numba_pool.allocator.waits`);
        synchronize other non-blocking streams inside.  Stays open across a :meth:`reset`; also ``super()``'s."""
        self.initialize()
        with super().defer_cleanup(), self.deferral.holding_back():
            yield

    # -- numba_pool extensions ------------------------------------------------------------
    def record_stream(self, array, stream) -> bool:
        """:func:`numba_pool.record_stream` here: True if the array is this manager's live allocation (use recorded),
        else False (its owner frees it).  :raises TypeError: for a non-stream ``stream`` or non-array ``array``."""
        ref = as_stream_ref(stream)
        address = data_address(array)
        self.initialize()
        return self.allocator.record_stream(address, ref) or any(
            cache is not None and cache.record_stream(address, ref) for cache in (self.host, self.managed))

    def statistics(self) -> PoolStatistics:
        """A snapshot of this manager's usage and its pool's attributes."""
        self.initialize()
        self.free_lists.give_back(streams=False)
        figures = collect(self._usage, self.allocator, self.host, self.managed)
        blocks, nbytes = self.free_lists.kept_on_streams()  # Note [The doors' free lists]: freed, as figures go
        if blocks:
            figures = dataclasses.replace(figures, bytes_in_use=figures.bytes_in_use - nbytes,
                                          blocks_in_use=figures.blocks_in_use - blocks,
                                          total_frees=figures.total_frees + blocks)
        return figures

    def reset_peak(self) -> None:
        """Reset the peaks (ours and the pool's high watermarks) to the current values."""
        self.initialize()
        self.free_lists.give_back(streams=False)
        self._usage.reset_peak()
        self.allocator.issue_frees()  # the legacy-stream frees releases queued, before the pool's figures
        self.allocator.pool.reset_high_watermarks()

    def trim(self, keep_bytes: int = 0) -> None:
        """Trim: empty slabs back, synchronize, ``cuMemPoolTrimTo(keep_bytes)``; caches free completed blocks."""
        self.initialize()
        _note("trim", self.device_id)
        self.free_lists.give_back()
        self.allocator.trim(keep_bytes)
        for cache in (self.host, self.managed):
            if cache is not None:
                cache.trim()


def _before_retry(deallocations, free_lists: DoorFreeLists) -> None:
    # Before an out-of-memory retry: Numba's pending deallocations, and the blocks the doors' free lists keep
    deallocations.clear()
    free_lists.give_back()


def _proxy(context):
    """A weak proxy of the context, as Numba's (no cycle), or the object itself where it cannot be."""
    try:
        return weakref.proxy(context)
    except TypeError:
        return context


# -- the managers of the process, kept by the process state (numba_pool.plugin.state) ------------
def manager_class(frontend: Frontend) -> type:
    """:class:`NumbaPoolManager` on ``frontend``'s ``HostOnlyCUDAMemoryManager``."""
    return process.manager_class(
        frontend, lambda: frontend.derive(NumbaPoolManager, frontend.HostOnlyCUDAMemoryManager))


def managers() -> list[NumbaPoolManager]:
    """The managers initialized at least once, every frontend's, alive now."""
    return process.managers()


def _compose(manager: NumbaPoolManager, allocator: DeviceAllocator) -> Path:
    """``manager``'s paths with the adaptors on now (:func:`numba_pool.plugin.path.compose`)."""
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
