"""numba_pool's EMM plugin: Numba device allocations served by a stream-ordered mempool.

Stream-safety rule (the one invariant this module exists to keep)
----------------------------------------------------------------
A block is never handed to work that can run before the last use of its previous owner has
finished.

How the mempool path keeps it:

1. Every allocation is made with ``cuMemAllocFromPoolAsync`` on its *allocation stream* S (the
   thread's :func:`numba_pool.using_stream` stream, else the legacy default stream) and freed,
   when Numba drops its last reference, with ``cuMemFreeAsync`` on the same S.  The driver
   returns the block to the pool only in S's order, after all work enqueued on S before the
   free, and hands it to another stream only once that free has completed or after inserting
   a dependency on it (the pool's reuse policies: CUDA Programming Guide, "Stream Ordered
   Memory Allocator", memory reuse policies).
2. With S the legacy default stream, the free also waits for all work enqueued earlier on every
   blocking stream (all of Numba's ``cuda.stream()`` streams), and work enqueued later on them
   waits for the allocation: nothing more is needed.
3. Work on a stream that S does not wait for (a non-blocking stream, or any stream other than
   S inside ``using_stream``) is made to finish before the free by :func:`record_stream`: at
   free time an event is recorded on each recorded stream and S waits for it
   (``cuStreamWaitEvent``) before the ``cuMemFreeAsync``.  No host synchronization.
4. Inside ``defer_cleanup`` the frees are held back and issued, in the same way, when the
   outermost block exits.

With the arena on, requests up to ``arena_max_block`` bytes are served from slabs by
:mod:`numba_pool.arena`, which keeps the same rule with its own means (stated at its top);
larger requests take the path above.  A :func:`numba_pool.scratch` block is one mempool
allocation, freed by that path once its scope has exited and its last array is gone.

The subtle lifetime issue: an array may outlive :meth:`NumbaPoolManager.reset` (or its
context).  Its finalizer must then neither raise nor free a block that a later allocation owns
at the same address.  Each allocation's finalizer holds the *ledger* (``address -> size``) of
the generation it was allocated in; ``reset`` takes every entry out of it (``popitem``), frees
them and starts a new ledger, so a late finalizer finds nothing to free.

The hot path takes no lock: ``dict`` insert/pop and ``list.append`` are atomic, and a lock
would both double our cost and deadlock if the garbage collector ran one of our finalizers
inside the locked section.  Statistics are replayed from the usage events (:mod:`.stats`).
The pointers handed to Numba are :class:`~numba_pool.pointer.PoolPointer`, released from
``__del__`` rather than through ``weakref.finalize`` (why, and what that changes, at its top).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
import weakref
from collections import deque
from functools import partial

import humanfriendly
from cuda.bindings import driver as cu
from numba.cuda import HostOnlyCUDAMemoryManager, MemoryPointer
from numba.cuda.cudadrv.driver import CudaAPIError, MemoryInfo

from . import config as _config
from .alloclog import AllocationLog
from .arena import Arena
from .mempool import MemPool, SlabSource, check, device_memory_info
from .pointer import PoolPointer
from .stats import PoolStatistics, UsageTracker
from .streams import LEGACY, StreamRef, _state, as_stream_ref, scopes_entered

_OOM = cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
# Errors a late free meets when the context or driver is already gone (interpreter exit,
# cuda.close()): the memory went with the context, so there is nothing to report.
_GONE = {cu.CUresult.CUDA_ERROR_DEINITIALIZED, cu.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,
         cu.CUresult.CUDA_ERROR_INVALID_CONTEXT}

# Bound once: attribute lookups on the hot path cost as much as the rest of our bookkeeping.
_alloc_async = cu.cuMemAllocFromPoolAsync
_free_async = cu.cuMemFreeAsync
_CUdeviceptr = cu.CUdeviceptr


def _fmt(nbytes: int) -> str:
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)"


class NumbaPoolManager(HostOnlyCUDAMemoryManager):
    """EMM plugin serving Numba's device allocations from a stream-ordered mempool.

    Numba creates one instance per CUDA context, hence per device.  Pinned, mapped and managed
    memory keep Numba's own handling (``HostOnlyCUDAMemoryManager``).  See the module docstring
    for the stream-safety rule.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pool: MemPool | None = None
        self._pool_handle = None
        self.config: _config.PoolConfig | None = None
        self._init_lock = threading.Lock()
        self._usage = UsageTracker()
        self._note = self._usage.events.append  # on every allocate (size) and free (~size)
        self._ledger: dict = {}  # CUdeviceptr -> size of the live mempool allocations
        self._recorded: dict[int, list[StreamRef]] = {}
        self._defer_lock = threading.Lock()
        self._defer_depth = 0
        self._deferred: deque = deque()  # zero-argument callables that issue a held-back free
        self._arena: Arena | None = None
        self._slab_source: SlabSource | None = None
        self._arena_max_block = 0
        self._arena_streams: dict[int, StreamRef] = {LEGACY.key: LEGACY}
        self._log: AllocationLog | None = None

    @property
    def device_id(self) -> int:
        """The context's device ordinal.  A context that Numba attached to a primary context
        made by another library holds a raw ``CUdevice`` instead of a Numba ``Device``."""
        device = self.context.device
        return device.id if hasattr(device, "id") else int(device)

    # -- EMM interface --------------------------------------------------------------------

    @property
    def interface_version(self) -> int:
        """Numba's EMM plugin interface version implemented: 1."""
        return 1

    def initialize(self) -> None:
        """Create (or look up) the device's mempool with the process's configuration, set its
        release threshold and pre-reserve ``initial_size`` bytes.  Idempotent: Numba calls it
        each time the context is pushed.

        :raises ConfigError: when a ``NUMBA_POOL_*`` variable is bad (first context only).
        :raises CudaAPIError: when the driver refuses to create or configure the pool.
        """
        if self._pool is not None:
            return
        with self._init_lock:
            if self._pool is not None:
                return
            config = _config_in_effect()
            _, total = device_memory_info()
            pool = MemPool(self.device_id, config, total)
            pool.reserve(config.initial_size)
            self.config = config
            if config.arena:
                threshold = None if config.release_threshold == _config.KEEP_ALL else config.release_threshold
                self._slab_source = SlabSource(pool, self._arena_streams, LEGACY.key)
                self._arena = Arena(self._slab_source, slab_size=config.arena_slab_size,
                                    max_block=config.arena_max_block, fenced_stream=LEGACY.key,
                                    release_threshold=threshold)
                self._arena_max_block = config.arena_max_block
            self._choose_allocator(config)
            self._pool_handle = pool.handle
            self._pool = pool

    def _choose_allocator(self, config: _config.PoolConfig) -> None:
        # Decided once, by binding an instance attribute that shadows the class's memalloc, so
        # that neither the arena test nor the logging test costs anything when they are off.
        allocate = self._memalloc_arena if config.arena else self._memalloc_pool
        if config.log:
            if self._log is None:
                self._log = AllocationLog(config.log)
            allocate = partial(_memalloc_logged, self, allocate, self._log)
        self.memalloc = allocate

    def memalloc(self, size: int) -> MemoryPointer:
        """Allocate ``size`` bytes of device memory, stream-ordered on the thread's allocation
        stream (``cuMemAllocFromPoolAsync``); the returned :class:`PoolPointer` frees it on the
        same stream (``cuMemFreeAsync``) when Numba drops it or on ``free()``.

        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` when the request cannot be met even
            after synchronizing and trimming the pool (the message gives the requested size, the
            pool's reserved and used bytes and the device's free and total); any other driver
            error as returned.
        """
        return self._memalloc_pool(size)

    def _memalloc_pool(self, size: int) -> MemoryPointer:
        # The mempool path: every allocation with the arena off, large ones with it on.
        stream = _state.stream if scopes_entered else LEGACY
        if stream.scratch is not None:
            return stream.scratch.allocate(self, size)
        err, ptr = _alloc_async(size, self._pool_handle, stream.handle)
        if err:
            ptr = self._allocate_slow(size, stream, err)
        ledger = self._ledger
        ledger[ptr] = size  # keyed by the CUdeviceptr object: identity hash, no int() needed
        self._note(size)
        self._usage.drain_if_due()
        return PoolPointer(self.context, ptr, size, partial(_release, self, ledger, ptr, stream))

    def _memalloc_arena(self, size: int) -> MemoryPointer:
        # The arena path: blocks of up to arena_max_block bytes carved out of slabs.
        if size > self._arena_max_block:
            return self._memalloc_pool(size)
        stream = _state.stream if scopes_entered else LEGACY
        arena = self._arena
        if stream is LEGACY:  # no scope, no scratch: try the ready cache first (no lock)
            ready = arena.ready.get((size + 255) & -256 or 256)
            address = None
            if ready:
                try:
                    address = ready.pop()
                except IndexError:  # another thread took the last one
                    pass
            if address is None:
                address = self._arena_allocate(size, stream)
            self._note(size)
            return PoolPointer(self.context, _CUdeviceptr(address), size,
                               partial(_release_legacy_block, self, arena, address, size))
        if stream.scratch is not None:
            return stream.scratch.allocate(self, size)
        key = stream.key
        if key not in self._arena_streams:
            self._arena_streams[key] = stream  # kept: the arena may order work on it later
        address = self._arena_allocate(size, stream)
        self._note(size)
        return PoolPointer(self.context, _CUdeviceptr(address), size,
                           partial(_release_block, self, arena, address, key, size, stream))

    def _arena_allocate(self, size: int, stream: StreamRef) -> int:
        # The arena's path past its ready cache.  Checking the events here is enough to bound
        # them: the cache holds at most CACHE_BLOCKS blocks a size, so misses keep coming.
        self._usage.drain_if_due()
        try:
            return self._arena.allocate(size, stream.key)
        except CudaAPIError as err:
            return self._arena_after_error(size, stream.key, err)

    def get_memory_info(self) -> MemoryInfo:
        """``(free, total)`` bytes that allocations through this manager can still get.

        For a pool, *free* is the device's free memory (``cuMemGetInfo``) plus the memory the
        pool has reserved but not handed out (reserved - used), since the pool serves requests
        from it first; with ``max_size`` it is at most ``max_size - used`` and *total* is
        ``max_size``.  Other processes and libraries can take device memory at any moment, so
        this is an estimate, as it is for Numba's default manager.
        """
        self.initialize()
        free, total = device_memory_info()
        usage = self._pool.usage()
        free += usage.reserved - usage.used
        if self._arena is not None:
            arena = self._arena.statistics()
            free += arena.reserved - arena.in_use
        cap = self._pool.max_size
        if cap:
            total = cap
            free = min(free, cap - usage.used)
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        """Not supported yet.

        :raises NotImplementedError: always.  ``cuIpcGetMemHandle`` does not accept mempool
            allocations; sharing them needs a pool created with an exportable handle type and
            ``cuMemPoolExportToShareableHandle`` / ``cuMemPoolExportPointer``, which numba_pool
            does not implement yet.
        """
        raise NotImplementedError(
            "numba_pool: CUDA IPC of stream-ordered mempool allocations is not supported yet "
            "(cuIpcGetMemHandle rejects them; they need cuMemPoolExportPointer on an exportable pool). "
            "Allocate arrays to be shared between processes under Numba's default memory manager.")

    def reset(self) -> None:
        """Free every allocation of this context and destroy the private pool (trim the shared
        default pool).  Safe before :meth:`initialize` and safe to repeat; arrays still alive
        afterwards point to freed memory, as with Numba's default manager, and their finalizers
        do nothing.  Also clears Numba's host allocations (``super().reset()``)."""
        super().reset()
        with self._init_lock:
            pool = self._pool
            if pool is None:
                return
            self._pool = None
            self._pool_handle = None
            ledger, self._ledger = self._ledger, {}
            pointers = []
            while ledger:  # popitem, not a copy: a finalizer racing with us pops each key at most once
                try:
                    ptr, size = ledger.popitem()
                except KeyError:
                    break
                self._note(~size)
                pointers.append(ptr)
            arena, self._arena = self._arena, None
            if arena is not None:  # its live blocks are abandoned: their finalizers see `dropped`
                pointers += [cu.CUdeviceptr(start) for start, _ in arena.drop_all()]
                self._slab_source.close()
                self._slab_source = None
                self._arena_streams = {LEGACY.key: LEGACY}
            self._usage.forget_in_use()  # arena and scratch blocks still alive count as freed
            self._recorded = {}
            _ignore_gone(cu.cuCtxSynchronize())
            while self._deferred:  # held-back frees (already counted as freed): issue them now
                with contextlib.suppress(CudaAPIError):
                    self._deferred.popleft()()
            for ptr in pointers:
                _ignore_gone(_free_async(ptr, LEGACY.handle))
            _ignore_gone(cu.cuCtxSynchronize())
            with contextlib.suppress(CudaAPIError):
                pool.destroy()
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
        with super().defer_cleanup():
            with self._defer_lock:
                self._defer_depth += 1
            try:
                yield
            finally:
                with self._defer_lock:
                    self._defer_depth -= 1
                    done = self._defer_depth == 0
                if done:
                    self._flush_deferred()

    # -- numba_pool extensions ------------------------------------------------------------

    def record_stream(self, array, stream) -> None:
        """Keep ``array``'s block from reuse until the work queued on ``stream`` by the time
        the array is freed has finished (an event recorded on ``stream`` at free time, waited
        for by the allocation stream before ``cuMemFreeAsync``).

        :raises ValueError: when the array's memory was not allocated by this manager.
        """
        ref = as_stream_ref(stream)
        address = _data_address(array)
        key = _containing_block(self._ledger, address)
        if key is None and self._arena is not None:
            key = self._arena.containing_block(address)
        if key is None:
            raise ValueError(
                f"numba_pool.record_stream: address {address:#x} is not in a live allocation of "
                f"numba_pool on device {self.device_id}")
        self._recorded.setdefault(key, []).append(ref)

    def statistics(self) -> PoolStatistics:
        """A snapshot of this manager's usage and its pool's attributes."""
        self.initialize()
        pool = self._pool.usage()
        u = self._usage
        u.drain()
        return PoolStatistics(
            bytes_in_use=u.bytes_in_use, peak_bytes_in_use=u.peak_bytes_in_use,
            blocks_in_use=u.blocks_in_use, peak_blocks_in_use=u.peak_blocks_in_use,
            total_allocations=u.total_allocations, total_frees=u.total_frees,
            pool_reserved_bytes=pool.reserved, pool_reserved_high=pool.reserved_high,
            pool_used_bytes=pool.used, pool_used_high=pool.used_high,
            oom_retries=u.oom_retries, oom_errors=u.oom_errors, **self._arena_fields())

    def _arena_fields(self) -> dict:
        if self._arena is None:
            return {}
        a = self._arena.statistics()
        return {"arena_reserved_bytes": a.reserved, "arena_in_use_bytes": a.in_use,
                "arena_free_blocks": a.free_blocks, "arena_largest_free_block": a.largest_free_block}

    def reset_peak(self) -> None:
        """Reset the peaks (ours and the pool's high watermarks) to the current values."""
        self.initialize()
        self._usage.reset_peak()
        self._pool.reset_high_watermarks()

    def trim(self, keep_bytes: int = 0) -> None:
        """Synchronize the context, so every stream-ordered free has completed, then release
        reserved but unused pool memory down to ``keep_bytes`` (``cuMemPoolTrimTo``)."""
        self.initialize()
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self._release_cached_slabs()
        self._pool.trim(keep_bytes)

    def _release_cached_slabs(self) -> None:
        # Only right after a device synchronize: consolidate() merges all streams' free blocks.
        if self._arena is not None:
            self._arena.consolidate()
            self._arena.trim()

    # -- internals ------------------------------------------------------------------------

    def _defer(self, issue_free) -> None:
        self._deferred.append(issue_free)
        if not self._defer_depth:  # the block exited while we were appending: flush ourselves
            self._flush_deferred()

    def _flush_deferred(self) -> None:
        while True:
            try:
                issue_free = self._deferred.popleft()
            except IndexError:
                return
            issue_free()

    def _enqueue_free(self, ptr, stream: StreamRef) -> None:
        if self._recorded:
            recorded = self._recorded.pop(int(ptr), None)
            if recorded:
                _wait_for_streams(recorded, stream)
        err, = _free_async(ptr, stream.handle)
        if err and err not in _GONE:
            warnings.warn(f"numba_pool: cuMemFreeAsync({int(ptr):#x}) failed with {err.name}", RuntimeWarning)

    def _allocate_slow(self, size: int, stream: StreamRef, err):
        """The slow path of :meth:`memalloc`: create the pool if a ``reset`` dropped it; on out
        of memory, let every pending stream-ordered free complete, release unused pool memory,
        and try once more."""
        if self._pool is None:
            self.initialize()
            err, ptr = _alloc_async(size, self._pool_handle, stream.handle)
            if not err:
                return ptr
        if err != _OOM:
            raise CudaAPIError(err, f"numba_pool: cuMemAllocFromPoolAsync({size} bytes) failed with {err.name}")
        self._usage.count_oom(failed=False)
        self._make_room()
        err, ptr = _alloc_async(size, self._pool_handle, stream.handle)
        if not err:
            return ptr
        self._usage.count_oom(failed=True)
        if err != _OOM:
            raise CudaAPIError(err, f"numba_pool: cuMemAllocFromPoolAsync({size} bytes) failed with {err.name}")
        raise CudaAPIError(err, self._oom_message(size))

    def _make_room(self) -> None:
        """Before retrying an allocation that ran out of memory: let every pending
        stream-ordered free complete, give empty arena slabs back, release unused pool memory."""
        self.deallocations.clear()
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        self._release_cached_slabs()
        self._pool.trim(0)

    def _arena_after_error(self, size: int, key: int, err: CudaAPIError) -> int:
        """The arena's slow path: its upstream could not get a slab."""
        if err.code != _OOM:
            raise err
        self._usage.count_oom(failed=False)
        self._make_room()
        try:
            return self._arena.allocate(size, key)
        except CudaAPIError as again:
            self._usage.count_oom(failed=True)
            if again.code != _OOM:
                raise
            raise CudaAPIError(again.code, self._oom_message(size)) from None

    def _oom_message(self, size: int) -> str:
        usage = self._pool.usage()
        free, total = device_memory_info()
        pool = "private mempool" if self._pool.is_private else "device default mempool"
        cap = f" (capped at {_fmt(self._pool.max_size)})" if self._pool.max_size else ""
        arena = ""
        if self._arena is not None:
            a = self._arena.statistics()
            arena = f", arena slabs {_fmt(a.reserved)} of which {_fmt(a.in_use)} in blocks"
        return (f"numba_pool: out of memory allocating {_fmt(size)} on device {self._pool.device_id} "
                f"after synchronizing, trimming and retrying once: {pool}{cap} reserves {_fmt(usage.reserved)}, "
                f"of which {_fmt(usage.used)} used{arena}; device has {_fmt(free)} free of {_fmt(total)}")


def _release(manager: NumbaPoolManager, ledger: dict, ptr, stream: StreamRef) -> None:
    """The release of every mempool allocation: runs when Numba drops the last reference,
    possibly in another thread, and must never raise."""
    size = ledger.pop(ptr, None)
    if size is None:  # reset() freed it already
        return
    manager._note(~size)
    if manager._defer_depth:
        manager._defer(partial(manager._enqueue_free, ptr, stream))
        return
    if manager._recorded:
        manager._enqueue_free(ptr, stream)
        return
    err, = _free_async(ptr, stream.handle)
    if err and err not in _GONE:
        warnings.warn(f"numba_pool: cuMemFreeAsync({int(ptr):#x}) failed with {err.name}", RuntimeWarning)


def _release_legacy_block(manager: NumbaPoolManager, arena: Arena, address: int, size: int) -> None:
    """The finalizer of an arena block allocated on the legacy default stream.  The common case
    (nothing recorded or deferred) takes no lock and makes no driver call: the block goes to the
    arena's quarantine."""
    if arena.dropped:  # reset() already released it
        return
    manager._note(~size)
    if manager._recorded or manager._defer_depth:
        _release_block_slowly(manager, arena, address, arena.fenced_stream, LEGACY)
        return
    rounded = (size + 255) & -256 or 256  # arena.free_fenced(), inlined: the block's size is
    waiting = arena.quarantine.get(rounded)  # the request rounded like Arena.allocate does
    if waiting is None:
        waiting = arena.quarantine.setdefault(rounded, [])
    waiting.append(address)


def _release_block(manager: NumbaPoolManager, arena: Arena, address: int, key, size: int,
                   stream: StreamRef) -> None:
    """The finalizer of an arena block allocated inside ``using_stream`` or ``scratch``."""
    if arena.dropped:
        return
    manager._note(~size)
    _release_block_slowly(manager, arena, address, key, stream)


def _release_block_slowly(manager: NumbaPoolManager, arena: Arena, address: int, key, stream: StreamRef) -> None:
    recorded = manager._recorded.pop(address, None) if manager._recorded else None
    if recorded:
        _wait_for_streams(recorded, stream)
    if key != arena.fenced_stream:
        # Mark, while the stream surely exists, the point after which its domain's blocks are
        # free; another stream that takes them over later waits for this event, not the stream.
        manager._slab_source.record_free(stream)
    if manager._defer_depth:
        manager._defer(partial(arena.release, address, key))
    else:
        arena.release(address, key)


def _memalloc_logged(manager: NumbaPoolManager, allocate, log: AllocationLog, size: int) -> MemoryPointer:
    """``memalloc`` when ``NUMBA_POOL_LOG`` is set: log the allocation (or its failure) and,
    through a second finalizer, its free."""
    stream = _state.stream
    try:
        mem = allocate(size)
    except CudaAPIError:
        log.failure(size, stream.value)
        raise
    address = int(mem.device_pointer)
    log.allocate(address, size, stream.value)
    weakref.finalize(mem, log.free, address, size, stream.value)
    return mem


def _ignore_gone(result) -> None:
    err = result[0]
    if err and err not in _GONE:
        warnings.warn(f"numba_pool: reset: {err.name}", RuntimeWarning)


def _wait_for_streams(recorded: list[StreamRef], stream: StreamRef) -> None:
    """Make ``stream`` wait, on the device, for the work queued so far on each recorded
    stream: an event per stream, recorded there and waited on by ``stream``."""
    flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    for ref in recorded:
        if int(ref.handle) == int(stream.handle):
            continue
        event = check(cu.cuEventCreate(flags), "cuEventCreate")
        try:
            check(cu.cuEventRecord(event, ref.handle), "cuEventRecord")
            check(cu.cuStreamWaitEvent(stream.handle, event, 0), "cuStreamWaitEvent")
        finally:
            cu.cuEventDestroy(event)  # released by the driver once the wait is done


def _data_address(array) -> int:
    """The device address of an array's first byte (CUDA Array Interface) or of a
    ``MemoryPointer``."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    pointer = getattr(array, "device_pointer_value", None)
    if pointer is not None:
        return int(pointer)
    raise TypeError(f"numba_pool: {type(array).__name__} is neither a device array nor a MemoryPointer")


def _containing_block(ledger: dict, address: int) -> int | None:
    """The start address of the live mempool allocation holding ``address`` (a scan:
    record_stream is rare)."""
    for ptr, size in list(ledger.items()):
        start = int(ptr)
        if start <= address < start + size:
            return start
    return None


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
