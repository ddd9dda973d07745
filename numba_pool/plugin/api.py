"""numba_pool's public functions (re-exported by :mod:`numba_pool`).  Each acts on one frontend's manager
(Note [Which frontend a call acts on] in :mod:`numba_pool.cuda.frontend`; where ambiguous, its ``FrontendError``)."""

from __future__ import annotations

import contextlib
import numbers
import warnings
from typing import Any, Iterator

from .. import config as _config
from ..allocator import threads
from ..allocator.captures import note_if_capturing
from ..allocator.scratch import ScratchBlock
from ..config import PoolConfig
from ..config.values import byte_count, device_ordinal, switch
from ..config.variables import user_stacklevel
from ..cuda import frontend as frontends
from ..cuda import driver, simulator
from ..cuda import mempool
from ..cuda.pointers import data_address
from ..cuda.streams import LEGACY, StreamRef, as_stream_ref, current_stream, enter_scope, leave_scope
from ..observe.scopes import ScopedStatistics
from ..observe.statistics import PoolStatistics
from ..observe.summary import format_summary
from ..observe import history as _history
from ..observe import snapshot as _snapshot
from . import debugging, settings
from .manager import NumbaPoolManager, manager_class, managers
from .state import process


def install(frontend: str | None = None, **options: Any) -> PoolConfig:
    """Make numba_pool Numba's CUDA memory manager (``cuda.set_memory_manager``), ``options`` over the ``NUMBA_POOL_*``
    variables; call it before the first CUDA use.  The frontend: ``frontend`` (``"numba-cuda"`` or ``"mlir"``); else
    those imported, else ``NUMBA_POOL_FRONTEND``'s, or the one installed (numba-cuda when both are).  Options: keys of
    :data:`numba_pool.config.OPTIONS`, ``None`` the default (README's table; sizes: :mod:`numba_pool.config.sizes`).
    :returns: the configuration in effect.  :raises FrontendError: when ``frontend`` names none, or none is installed.
    :raises ConfigError: for an unknown option, a bad value or contradicting options (one line).
    :raises RuntimeError: when the frontend has a CUDA context already, or without the GIL (``require_gil``).
    :warns SimulatorWarning: under the CUDA simulator (never raised): options checked, nothing installed."""
    config = _config.load(**options)
    if frontend is not None:
        targets = [frontends.load(frontends.parse_name(frontend, "numba_pool.install(frontend)"))]
    else:
        targets = [frontends.load(name) for name in frontends.imported()] or [frontends.for_tools()]
    if any(target.simulator for target in targets):
        simulator.warn_install()
        return config
    threads.require_gil()
    for target in targets:
        existing = target.devices_with_context()
        if existing:
            raise RuntimeError(
                f"numba_pool.install: {target.title} CUDA context(s) already exist on device(s) {existing}; Numba binds "
                "the memory manager when it creates a context, so call install() before the first CUDA use")
    settings.set_config(config)
    for target in targets:
        target.cuda.set_memory_manager(manager_class(target))
    if not any(getattr(target.cuda, "is_available", lambda: True)() for target in targets):
        warnings.warn("numba_pool.install(): no CUDA GPU is available here, so Numba's CUDA calls will fail; "
                      "NUMBA_ENABLE_CUDASIM=1 runs kernels without one (docs/guide.md, \"Without a GPU\")",
                      RuntimeWarning, stacklevel=user_stacklevel())
    return config


def manager_of(device: Any = None, *, frontend: str | None = None, of: Any = None,
               call: str = "numba_pool") -> NumbaPoolManager:
    """The numba_pool manager of the current (or given) device's context in the frontend meant.  :param device: an
    ordinal, or a frontend's ``Context`` or ``Device``; None: the current device.  :param of: an array, stream or
    pointer whose frontend is meant.  :param call: the public function asking, for messages.
    :raises RuntimeError: when numba_pool is not the memory manager there, or there is no GPU.
    :raises FrontendError: for an ambiguous frontend.  :raises TypeError: for a ``device`` none of the above."""
    ordinal = _ordinal(device, call)  # a bad device is told before the frontend's ambiguity
    chosen = frontends.resolve(call, device, of, name=frontend)
    try:
        context = chosen.current_context(ordinal)
    except chosen.CudaSupportError as err:
        raise frontends.no_gpu(err) from None
    mm = getattr(context, "memory_manager", None)  # None under the CUDA simulator
    if not isinstance(mm, NumbaPoolManager):
        if chosen.simulator:
            raise RuntimeError(f"numba_pool is not the memory manager: {simulator.NO_MEMORY_MANAGER}")
        raise RuntimeError(
            f"numba_pool is not the memory manager of this {chosen.title} context ({type(mm).__name__} is): set "
            "NUMBA_CUDA_MEMORY_MANAGER=numba_pool or call numba_pool.install() before the first CUDA use")
    return mm


def _ordinal(device: Any, call: str) -> int | None:
    """A device ordinal from what a public function's ``device`` was given (NumPy integers too), a C int.
    :raises ValueError: for an ordinal outside [0, 2**31).  :raises TypeError: for what is no device."""
    if device is None:
        return None
    if isinstance(device, numbers.Integral) and not isinstance(device, bool):
        return device_ordinal(device, call, "device")
    owner = getattr(device, "device", device)  # a Context's device, or the Device itself
    ordinal = getattr(owner, "id", None)
    if isinstance(ordinal, int):
        return ordinal
    raise TypeError(f"{call}: device={device!r} is not a device: expected an ordinal (int), or a Numba context or "
                    "device")


def stats(device: Any = None, *, frontend: str | None = None) -> PoolStatistics:
    """Statistics of the current (or given) device's manager.  ``device``: as for :func:`manager_of`; ``frontend``:
    needed only when two frontends use numba_pool.  :raises RuntimeError: as :func:`manager_of`."""
    return manager_of(device, frontend=frontend, call="numba_pool.stats()").statistics()


def reset_peak(device: Any = None, *, frontend: str | None = None) -> None:
    """Reset the peaks, and the pool's ``CU_MEMPOOL_ATTR_*_MEM_HIGH`` watermarks, to now.  Arguments: :func:`stats`."""
    manager_of(device, frontend=frontend, call="numba_pool.reset_peak()").reset_peak()


def trim(keep_bytes: int = 0, device: Any = None, *, frontend: str | None = None) -> None:
    """Synchronize the device and release cached memory beyond ``keep_bytes`` bytes (``cuMemPoolTrimTo``; the
    arena's empty slabs; completed pinned blocks, ``cuMemFreeHost``).  Arguments as for :func:`stats`."""
    keep_bytes = byte_count(keep_bytes, "numba_pool.trim", "keep_bytes", positive=False)
    manager_of(device, frontend=frontend, call="numba_pool.trim()").trim(keep_bytes)


def record_stream(array: Any, stream: Any) -> bool:
    """Mark ``array`` (a device array of any shape and dtype, a ``MemoryPointer``, a numba_pool pinned array, a
    CuPy array, a PyTorch tensor or a cuda.core ``Buffer``) as used on ``stream``: its memory is not reused until
    the work queued there by the time it is freed has finished (an event; the host never waits).  PyTorch's
    ``Tensor.record_stream``; as there, a no-op on memory the allocator does not own.
    :returns: True for live numba_pool memory (recorded), else False (its owner frees it, e.g. Numba's pinned arrays).
    :raises TypeError: when ``stream`` is not a stream, or ``array`` none of the above."""
    if _simulator_stream(stream, "numba_pool.record_stream()"):
        return False
    ref = as_stream_ref(stream)  # a bad stream, then array, is told before the GPU is needed
    try:
        data_address(array)
    except TypeError as err:
        raise TypeError(f"numba_pool.record_stream: array={array!r:.80}: {str(err).partition(': ')[2]}") from None
    of = array if frontends.name_of(array) is not None else stream
    return manager_of(of=of, call="numba_pool.record_stream()").record_stream(array, ref)


def prefetch(array: Any, device: Any = None, stream: Any = 0) -> None:
    """Migrate a managed array to a device or the host in stream order (``cuMemPrefetchAsync``), not on first touch.
    :param array: a managed array, view or ``ManagedMemory`` (any shape, dtype); ``nbytes`` from its first element.
    :param device: an ordinal, ``Context`` or ``Device``; None: the current device; ``"cpu"``.
    :param stream: a Numba stream, ``CUstream``, int handle or ``__cuda_stream__``; 0 by default.
    :raises ValueError: when ``array`` is not managed memory, or ``device`` is another string.
    :raises TypeError: for an ``array`` or ``stream`` none of the above.  :raises CudaAPIError: the driver refused."""
    address, ref = data_address(array), as_stream_ref(stream)  # checked before the GPU is needed
    nbytes = int(getattr(array, "nbytes", getattr(array, "size", 0)))
    if isinstance(device, str):
        if device.strip().lower() != "cpu":
            raise ValueError(f"numba_pool.prefetch: device={device!r} is neither a device nor 'cpu'")
        target = None
    else:
        ordinal = _ordinal(device, "numba_pool.prefetch()")
        target = ordinal if ordinal is not None else manager_of(of=array, call="numba_pool.prefetch()").device_id
    try:
        managed = mempool.is_managed(address, driver.cu)
    except RuntimeError as err:  # cuda-pathfinder's DynamicLibNotFoundError: no driver here
        raise RuntimeError(f"numba_pool.prefetch: no CUDA GPU is available here ({err})") from None
    if not managed:
        raise ValueError(f"numba_pool.prefetch: {type(array).__name__} at {address:#x} is not managed memory "
                         "(cuda.managed_array); device and pinned arrays stay where they are")
    if nbytes > 0:
        mempool.prefetch(driver.cu, address, nbytes, target, ref.handle)


def memory_summary(device: Any = None, *, frontend: str | None = None) -> str:
    """A printable table of the device's numba_pool memory (allocations, the pool, the arena, this thread's
    scratch block, out-of-memory retries); sizes in binary units and bytes.  Arguments as for :func:`stats`.
    :raises RuntimeError: as :func:`manager_of` (under the simulator, the one line saying why is returned)."""
    if simulator.active():  # the arguments checked all the same, as manager_of does
        _ordinal(device, "numba_pool.memory_summary()")
        if frontend is not None:
            frontends.parse_name(frontend, "numba_pool.memory_summary(): frontend")
        return f"numba_pool: no memory summary: {simulator.NO_MEMORY_MANAGER}"
    manager = manager_of(device, frontend=frontend, call="numba_pool.memory_summary()")
    scratch = current_stream().scratch
    if scratch is not None and getattr(scratch.block, "context", None) is not manager.context:
        scratch = None  # another device's (or frontend's) block
    return format_summary(manager.statistics(), device=manager.device_id, scratch=scratch)


def used_bytes(device: Any = None, *, frontend: str | None = None) -> int:
    """Bytes held by live allocations, as requested (CuPy's ``used_bytes()``, PyTorch's
    ``memory_allocated()``).  Arguments as for :func:`stats`; raises as :func:`manager_of`."""
    return manager_of(device, frontend=frontend, call="numba_pool.used_bytes()").statistics().bytes_in_use


def reserved_bytes(device: Any = None, *, frontend: str | None = None) -> int:
    """Bytes the mempool reserved from the device (``CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT``; CuPy's ``total_bytes()``,
    PyTorch's ``memory_reserved()``); the default pool's is shared.  Arguments and errors as :func:`stats`."""
    return manager_of(device, frontend=frontend, call="numba_pool.reserved_bytes()").statistics().pool_reserved_bytes


@contextlib.contextmanager
def scratch(nbytes: int, *, manager=None, frontend: str | None = None) -> Iterator[ScratchBlock]:
    """Bump-allocate this thread's device allocations inside the block from one reserved block of ``nbytes`` bytes
    (:mod:`numba_pool.allocator.scratch`); 256-byte granules.
    :param manager: the manager to reserve from; by default the current context's.
    :raises ValueError: for ``nbytes`` <= 0.  :raises TypeError: for a ``manager`` without ``scratch``.
    :raises RuntimeError: as :func:`manager_of`.  :raises CudaAPIError: when the block cannot be reserved."""
    nbytes = byte_count(nbytes, "numba_pool.scratch", "nbytes", positive=True)
    if manager is not None and not callable(getattr(manager, "scratch", None)):
        raise TypeError(f"numba_pool.scratch: manager={manager!r:.80} is not a manager (no scratch method) or None")
    manager = manager_of(frontend=frontend, call="numba_pool.scratch()") if manager is None else manager
    with manager.scratch(nbytes) as block:
        yield block


@contextlib.contextmanager
def using_stream(stream: Any) -> Iterator[StreamRef]:
    """Allocate this thread's arrays inside the block on ``stream`` and free them there, even after the block
    exits; the caller orders other streams after it (and uses :func:`record_stream`).  Scopes nest, per host
    thread.  A capturing stream is noted before its first allocation (rule 13 of :mod:`numba_pool.allocator`).
    :raises TypeError: when ``stream`` is not a stream (:func:`numba_pool.cuda.streams.as_stream_ref`)."""
    if _simulator_stream(stream, "numba_pool.using_stream()"):
        yield LEGACY
        return
    ref = as_stream_ref(stream)  # cuda.streams.using_stream's body, calling the capture check directly (no hook)
    note_if_capturing(ref)
    previous = enter_scope(ref)
    try:
        yield ref
    finally:
        leave_scope(previous)


def _simulator_stream(stream: Any, call: str) -> bool:
    """Whether ``stream`` is the CUDA simulator's (no handle: nothing to order), noted once as ``call``'s."""
    if simulator.active() and type(stream).__module__.startswith("numba.cuda.simulator"):
        simulator.note_nothing(call, "orders")
        return True
    return False


class _ProcessScope(ScopedStatistics):
    """A :func:`statistics` scope counted process-wide: the first open and last exit recompose every path."""

    def __enter__(self) -> "_ProcessScope":
        super().__enter__()
        if process.scope_opened():
            process.recompose()
        return self

    def __exit__(self, *exc_info) -> None:
        super().__exit__(*exc_info)
        if process.scope_closed():
            process.recompose()


def statistics(*, profile: bool = False) -> ScopedStatistics:
    """Count this thread's device allocations inside ``with numba_pool.statistics() as s:`` (bytes and
    counts: :class:`~numba_pool.observe.scopes.ScopedStatistics`).  Scopes nest, per thread; free
    while none is open.  ``profile``: also per call site (``s.report()``), walking the stack.
    Under the simulator it warns (:class:`numba_pool.SimulatorWarning`) that it counts nothing.
    :raises TypeError: when ``profile`` is not a switch (a bool, or 0/1)."""
    profile = switch(profile, "numba_pool.statistics", "profile")
    if simulator.active():
        simulator.warn_scope()
    return _ProcessScope(profile=profile)


# -- memory debugging: history, snapshots, out of memory, leaks --------------------------------
def record_history(enabled: bool = True, stacks: str = "python", max_entries: int = _history.DEFAULT_MAX_ENTRIES) -> None:
    """Record every allocation's Python stack and the events (allocate, free, out of memory, trim, reset) of every
    device and kind in a ring of ``max_entries`` (PyTorch's ``_record_memory_history``).  Free while off; the cost on:
    Note [Stack walks].  Starting again drops the recording; under the simulator it warns that nothing is recorded.
    :param enabled: False stops and drops the recording.  :param stacks: ``"python"`` or ``"none"`` (events only).
    :param max_entries: events kept, oldest dropped first (live allocations are kept apart).
    :raises ValueError: for another ``stacks`` or ``max_entries`` not in [1, 2**63).  :raises TypeError: ``enabled``."""
    enabled = switch(enabled, "numba_pool.record_history", "enabled")
    recording = _history.new_recording(max_entries, stacks)  # checked whether on or off
    if enabled and simulator.active():
        simulator.note_nothing("numba_pool.record_history()")
    process.set_recording(recording if enabled else None)


def snapshot() -> dict:
    """Every device's memory in ``torch.cuda.memory._snapshot()``'s schema: ``segments`` with ``blocks``,
    ``device_traces`` (mapping: :mod:`numba_pool.observe.snapshot`); frames, traces need :func:`record_history`."""
    return debugging.snapshot_of(managers())


def dump_snapshot(path) -> None:
    """Pickle :func:`snapshot` to ``path`` (pytorch.org/memory_viz, ``torch.cuda._memory_viz``, ``numba-pool-tools``).
    :raises ConfigError: (a ValueError) ``path`` is no file path one can write, before anything is written.
    :raises OSError: when writing fails (one line naming the path)."""
    path = _config.parse_path(path, "numba_pool.dump_snapshot(path)", what="a snapshot (pickle)")
    if simulator.active():
        simulator.note_nothing("numba_pool.dump_snapshot()")
    try:
        _snapshot.dump(snapshot(), path)
    except OSError as err:
        raise OSError(f"numba_pool.dump_snapshot: {path!r} could not be written ({err.strerror or err})") from None


def on_out_of_memory(callback) -> None:
    """Call ``callback(device, size, snapshot)`` at each out-of-memory error, after the retry, before raising; starts
    :func:`record_history`; its exception becomes a warning.  :raises TypeError: when ``callback`` is not callable."""
    debugging.add_observer(callback)


def live_allocations(group_by: str | None = "site", device: int | None = None) -> list[tuple]:
    """What is held now, from the history: ``(site, bytes, arrays)`` per site, most bytes first (``group_by="site"``),
    or ``(site, bytes, device, address, kind)`` per allocation (None).  :raises RuntimeError: without a history.
    :raises ValueError: for another ``group_by`` or ``device`` not in [0, 2**31).  :raises TypeError: no ordinal."""
    return debugging.live_allocations(group_by, _ordinal(device, "numba_pool.live_allocations"))
