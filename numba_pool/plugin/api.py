"""numba_pool's public functions: install the plugin, and reach the current (or given)
device's manager for its statistics, summary, trim, ``record_stream`` and scratch scopes.
:mod:`numba_pool` re-exports them.

Each acts on one Numba CUDA frontend's manager: the one named by ``frontend=``, or whose array
or stream it is given, or the one the process uses (Note [Which frontend a call acts on] in
:mod:`numba_pool.cuda.frontend`); where that is ambiguous it says so in one line
(:class:`~numba_pool.cuda.frontend.FrontendError`, a ``RuntimeError``)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from .. import config as _config
from ..allocator import threads
from ..allocator.captures import note_if_capturing
from ..allocator.scratch import ScratchBlock
from ..config import PoolConfig
from ..cuda import frontend as frontends
from ..cuda import driver, simulator
from ..cuda import mempool
from ..cuda.pointers import data_address
from ..cuda.streams import StreamRef, as_stream_ref, current_stream, enter_scope, leave_scope
from ..observe.scopes import ScopedStatistics
from ..observe.statistics import PoolStatistics
from ..observe.summary import format_summary
from ..observe import history as _history
from ..observe import snapshot as _snapshot
from . import debugging, settings
from .manager import NumbaPoolManager, manager_class, managers
from .state import process


def install(frontend: str | None = None, **options: Any) -> PoolConfig:
    """Make numba_pool the memory manager of Numba's CUDA frontend (``cuda.set_memory_manager``)
    with ``options`` overriding the ``NUMBA_POOL_*`` environment variables.

    The frontend: ``frontend`` (``"numba-cuda"`` or ``"mlir"``) when given; else every one the
    program has imported (``numba.cuda``, ``numba_cuda_mlir.cuda``); else the one
    ``NUMBA_POOL_FRONTEND`` names, or the one installed (numba-cuda when both are).

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
    :raises RuntimeError: when a CUDA context of the frontend already exists, or when the
        interpreter runs without its GIL (:func:`numba_pool.allocator.threads.require_gil`).
    :raises FrontendError: (a ``RuntimeError``) when ``frontend`` names none, or no frontend is
        installed.
    :warns SimulatorWarning: under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), which has no
        memory manager to replace: the options are checked, nothing is installed.  The warning
        never raises, even when warnings are errors (``python -W error``).
    """
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
    return config


def manager_of(device: Any = None, *, frontend: str | None = None, of: Any = None,
               call: str = "numba_pool") -> NumbaPoolManager:
    """The numba_pool manager of the current (or given) device's CUDA context, in the frontend
    that ``frontend`` names, or whose object ``device`` or ``of`` is, or that the process uses
    (Note [Which frontend a call acts on] in :mod:`numba_pool.cuda.frontend`).

    :param device: a device ordinal, or a frontend's ``Context`` or ``Device``; None: the
        current device.
    :param of: an array, stream or pointer whose frontend is meant (``record_stream``'s).
    :param call: the public function asking, for messages (``"numba_pool.stats()"``).
    :raises RuntimeError: when numba_pool is not that frontend's memory manager there, or there
        is no CUDA GPU (one line; Numba's own ``CudaSupportError`` spans many).
    :raises FrontendError: (a ``RuntimeError``) when which frontend is meant is ambiguous.
    :raises TypeError: when ``device`` is none of the above.
    """
    chosen = frontends.resolve(call, device, of, name=frontend)
    ordinal = _ordinal(device, call)
    try:
        context = chosen.current_context(ordinal)
    except chosen.CudaSupportError as err:
        cause = " ".join(part.strip(" :") for part in str(err).splitlines() if part.strip(" :"))
        raise RuntimeError(f"numba_pool: no CUDA GPU is available here ({cause or type(err).__name__})") from None
    mm = getattr(context, "memory_manager", None)  # None under the CUDA simulator
    if not isinstance(mm, NumbaPoolManager):
        if chosen.simulator:
            raise RuntimeError(f"numba_pool is not the memory manager: {simulator.NO_MEMORY_MANAGER}")
        raise RuntimeError(
            f"numba_pool is not the memory manager of this {chosen.title} context ({type(mm).__name__} is): set "
            "NUMBA_CUDA_MEMORY_MANAGER=numba_pool or call numba_pool.install() before the first CUDA use")
    return mm


def _ordinal(device: Any, call: str) -> int | None:
    """A device ordinal from what a public function's ``device`` was given."""
    if device is None or isinstance(device, int) and not isinstance(device, bool):
        return device
    owner = getattr(device, "device", device)  # a Context's device, or the Device itself
    ordinal = getattr(owner, "id", None)
    if isinstance(ordinal, int):
        return ordinal
    raise TypeError(f"{call}: device={device!r} is not a device: expected an ordinal (int), or a Numba context or "
                    "device")


def stats(device: Any = None, *, frontend: str | None = None) -> PoolStatistics:
    """Statistics of the current (or given) device's numba_pool manager.

    :param device: an ordinal, or a Numba ``Context`` or ``Device`` (its frontend is then the
        one meant); None: the current device.
    :param frontend: ``"numba-cuda"`` or ``"mlir"``: needed only when a process has imported
        both and both use numba_pool (:func:`manager_of`).
    :raises RuntimeError: when numba_pool is not Numba's memory manager, or the frontend is
        ambiguous.
    """
    return manager_of(device, frontend=frontend, call="numba_pool.stats()").statistics()


def reset_peak(device: Any = None, *, frontend: str | None = None) -> None:
    """Reset peak bytes/blocks in use and the pool's reserved/used high watermarks to the
    current values (``CU_MEMPOOL_ATTR_*_MEM_HIGH``).  ``device`` and ``frontend`` as for
    :func:`stats`."""
    manager_of(device, frontend=frontend, call="numba_pool.reset_peak()").reset_peak()


def trim(keep_bytes: int = 0, device: Any = None, *, frontend: str | None = None) -> None:
    """Synchronize the device and release cached pool memory beyond ``keep_bytes`` bytes
    (``cuMemPoolTrimTo``), including the arena's empty slabs, and (``NUMBA_POOL_HOST``) the
    cached pinned host blocks whose events completed (``cuMemFreeHost``).  ``device`` and
    ``frontend`` as for :func:`stats`."""
    manager_of(device, frontend=frontend, call="numba_pool.trim()").trim(keep_bytes)


def record_stream(array: Any, stream: Any) -> None:
    """Mark ``array`` (a device array, shape and dtype any, a ``MemoryPointer``, or with
    ``NUMBA_POOL_HOST`` a pinned or mapped array from numba_pool) as used on
    ``stream``: when it is freed, its memory is not reused until the work queued on ``stream`` by
    then has finished.  Device-side ordering through an event; the host never waits.  The
    PyTorch equivalent is ``Tensor.record_stream``.  The manager is that of the array's
    frontend (or the stream's).

    :raises ValueError: when the array's memory is not a live numba_pool allocation.
    :raises TypeError: when ``stream`` is not a stream.
    """
    of = array if frontends.name_of(array) is not None else stream
    manager_of(of=of, call="numba_pool.record_stream()").record_stream(array, stream)


def prefetch(array: Any, device: Any = None, stream: Any = 0) -> None:
    """Migrate a managed array's memory to a device or to the host ahead of its use, in stream
    order: ``cuMemPrefetchAsync`` (CUDA 13's form, with a ``CUmemLocation``), as RMM's
    ``prefetch_resource_adaptor`` and CUDA's samples do.  Without it, the first touch on the
    other side migrates the pages on demand, one page fault at a time.

    Cost: one driver call on the host (a few µs), then the migration on the device at
    interconnect bandwidth; the data is coherent throughout (accesses during the migration are
    allowed).  Pages already where they are sent move nothing.

    :param array: a managed array (``cuda.managed_array``, a view of one, or its
        ``ManagedMemory``), of any shape and dtype: its ``nbytes`` (its buffer's size for a
        pointer) from its first element.
    :param device: a device ordinal, or a Numba ``Context`` or ``Device``: prefetch there; None:
        the current device; ``"cpu"``: the host.
    :param stream: a Numba stream, ``CUstream``, int handle or ``__cuda_stream__`` object; 0,
        the legacy default stream, by default.
    :raises ValueError: when ``array`` is not managed memory (a device or pinned array), or
        ``device`` is a string other than ``"cpu"``.
    :raises TypeError: when ``array`` or ``stream`` is neither of the above.
    :raises CudaAPIError: (the frontend's) when the driver refuses the prefetch.
    """
    address = data_address(array)
    nbytes = int(getattr(array, "nbytes", getattr(array, "size", 0)))
    if isinstance(device, str):
        if device.strip().lower() != "cpu":
            raise ValueError(f"numba_pool.prefetch: device={device!r} is neither a device nor 'cpu'")
        target = None
    else:
        ordinal = _ordinal(device, "numba_pool.prefetch()")
        target = ordinal if ordinal is not None else manager_of(of=array, call="numba_pool.prefetch()").device_id
    if not mempool.is_managed(address, driver.cu):
        raise ValueError(f"numba_pool.prefetch: {type(array).__name__} at {address:#x} is not managed memory "
                         "(cuda.managed_array); device and pinned arrays stay where they are")
    if nbytes > 0:
        mempool.prefetch(driver.cu, address, nbytes, target, as_stream_ref(stream).handle)


def memory_summary(device: Any = None, *, frontend: str | None = None) -> str:
    """A printable table of the current (or given) device's numba_pool memory: allocations
    (bytes and counts: current, peak, total), the pool's reserved and used bytes with their
    high watermarks, the arena's figures (reserved, in use, cached, quarantined, free, slabs),
    the calling thread's scratch block if it is inside ``numba_pool.scratch``, and the
    out-of-memory retries and errors.  Sizes in binary units and exact bytes.  ``device`` and
    ``frontend`` as for :func:`stats`.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    manager = manager_of(device, frontend=frontend, call="numba_pool.memory_summary()")
    scratch = current_stream().scratch
    if scratch is not None and getattr(scratch.block, "context", None) is not manager.context:
        scratch = None  # another device's (or frontend's) block
    return format_summary(manager.statistics(), device=manager.device_id, scratch=scratch)


def used_bytes(device: Any = None, *, frontend: str | None = None) -> int:
    """Bytes held by live allocations of the current (or given) device, as requested (CuPy's
    ``MemoryPool.used_bytes()``, PyTorch's ``memory_allocated()``).  ``device`` and
    ``frontend`` as for :func:`stats`.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    return manager_of(device, frontend=frontend, call="numba_pool.used_bytes()").statistics().bytes_in_use


def reserved_bytes(device: Any = None, *, frontend: str | None = None) -> int:
    """Bytes the device's mempool has reserved from the device (``CU_MEMPOOL_ATTR_RESERVED_
    MEM_CURRENT``): live allocations, arena slabs and cached free memory (CuPy's
    ``MemoryPool.total_bytes()``, PyTorch's ``memory_reserved()``).  With
    ``use_default_pool`` the pool is the device's default one, shared with other libraries.
    ``device`` and ``frontend`` as for :func:`stats`.

    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    """
    return manager_of(device, frontend=frontend, call="numba_pool.reserved_bytes()").statistics().pool_reserved_bytes


@contextlib.contextmanager
def scratch(nbytes: int, *, manager=None, frontend: str | None = None) -> Iterator[ScratchBlock]:
    """Bump-allocate this thread's device allocations inside the block from one reserved
    block of ``nbytes`` bytes (a linear allocator with free-all; :mod:`numba_pool.allocator.scratch`).

    :param nbytes: bytes to reserve (rounded up to 256 per allocation inside).
    :param manager: the :class:`~numba_pool.NumbaPoolManager` to reserve from; by default the
        current CUDA context's (of ``frontend``, as for :func:`stats`).
    :raises ValueError: for ``nbytes`` <= 0.
    :raises RuntimeError: when numba_pool is not Numba's memory manager.
    :raises CudaAPIError: (the frontend's) when the block cannot be reserved.
    """
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
        raise ValueError(f"numba_pool.scratch: nbytes={nbytes!r} must be a positive number of bytes")
    manager = manager_of(frontend=frontend, call="numba_pool.scratch()") if manager is None else manager
    with manager.scratch(nbytes) as block:
        yield block


@contextlib.contextmanager
def using_stream(stream: Any) -> Iterator[StreamRef]:
    """Order the allocations made by this thread inside the block on ``stream``.

    Arrays allocated inside are allocated on ``stream`` and freed on it whenever they are
    dropped, also after the block has exited.  Work on ``stream`` may use them at once; work on
    any other stream must be ordered after ``stream`` by the caller (an event, a synchronize)
    and, if it may still run when the array is dropped, registered with
    :func:`numba_pool.record_stream`.  Scopes nest; the innermost wins.  The setting is per host
    thread.  A stream entered while it is being captured into a CUDA graph makes the capture
    known to numba_pool before its first allocation (rule 13 of :mod:`numba_pool.allocator`:
    ``cuStreamIsCapturing``, 0.3 µs per scope entered).

    :param stream: a Numba stream, ``CUstream``, int handle or ``__cuda_stream__`` object
        (:func:`numba_pool.cuda.streams.as_stream_ref`).
    :raises TypeError: when ``stream`` is not a stream.
    """
    # cuda.streams.using_stream's body with the check called directly: a scope entered costs
    # what it cost with the check registered as a hook (no call in between, no registry).
    ref = as_stream_ref(stream)
    note_if_capturing(ref)
    previous = enter_scope(ref)
    try:
        yield ref
    finally:
        leave_scope(previous)


class _ProcessScope(ScopedStatistics):
    """A :func:`statistics` scope: also counted among the scopes open in the process, and the
    first to open and the last to exit compose every device's allocation path again (the
    counting adaptor in, then out)."""

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
    """Count the device allocations this thread makes inside ``with numba_pool.statistics() as
    s:``; read ``s.current_bytes``, ``s.peak_bytes``, ``s.total_count``... (bytes and counts,
    :class:`~numba_pool.observe.scopes.ScopedStatistics`) inside or after the block.  Scopes
    nest; each thread has its own.  No cost to allocations while no scope is open.

    :param profile: also record allocations and bytes per call site (``s.report()``); walks
        the stack at each allocation.

    Under the CUDA simulator, which has no memory manager, it warns
    (:class:`numba_pool.SimulatorWarning`) that it counts nothing.
    """
    if simulator.active():
        simulator.warn_scope()
    return _ProcessScope(profile=profile)


# -- memory debugging: history, snapshots, out of memory, leaks --------------------------------

def record_history(enabled: bool = True, stacks: str = "python", max_entries: int = _history.DEFAULT_MAX_ENTRIES) -> None:
    """Record every allocation from now on, with the Python stack at each, and the events
    (allocate, free requested, free completed, out of memory, trim, reset) in a ring of
    ``max_entries`` (PyTorch's ``torch.cuda.memory._record_memory_history``).  Every device
    and kind: device arrays (mempool, arena, scratch), pinned and managed memory.

    Cost: none while off (the default: nothing is in the allocation path).  On, each
    allocate+free pair pays the stack capture (``(code, line)`` pairs, names read only when a
    snapshot is taken) and a few container operations: docs/benchmarks.md gives the µs at
    stack depths 5, 20 and 50.  Starting again drops what was recorded.

    :param enabled: False stops recording and drops the recording.
    :param stacks: ``"python"`` (each allocation's stack) or ``"none"`` (events only).
    :param max_entries: events kept, the oldest dropped first (the allocations alive are kept
        apart, whatever their age).
    :raises ValueError: for another ``stacks`` or a ``max_entries`` below 1.
    """
    process.set_recording(_history.new_recording(max_entries, stacks) if enabled else None)


def snapshot() -> dict:
    """The memory of every device numba_pool serves in this process, in the schema of PyTorch's
    ``torch.cuda.memory._snapshot()``: ``segments`` (arena slabs, mempool allocations, scratch
    blocks, the mempool's unused reserve, pinned and managed blocks; each with ``device``,
    ``kind`` and its ``blocks``: state, sizes in bytes, the allocation's ``frames``) and
    ``device_traces`` (the recorded events per device).  Frames and traces need
    :func:`record_history`.  The mapping: :mod:`numba_pool.observe.snapshot`.
    """
    return debugging.snapshot_of(managers())


def dump_snapshot(path) -> None:
    """Write :func:`snapshot` to ``path`` as a pickle: drop it on pytorch.org/memory_viz, or run
    ``python -m torch.cuda._memory_viz stats|trace|trace_plot path``, or ``numba-pool-tools snapshot
    summarize path``.

    :raises OSError: when the file cannot be written.
    """
    _snapshot.dump(snapshot(), path)


def on_out_of_memory(callback) -> None:
    """Call ``callback(device, size, snapshot)`` (an ordinal, the bytes requested, a
    :func:`snapshot`) at each out-of-memory error, after numba_pool's retry, in the allocating
    thread, before the error is raised.  Starts :func:`record_history` if it is off (the
    snapshot names allocation sites).  An exception in the callback becomes a warning.

    :raises TypeError: when ``callback`` is not callable.
    """
    debugging.add_observer(callback)


def live_allocations(group_by: str | None = "site", device: int | None = None) -> list[tuple]:
    """What is held now, from the history: with ``group_by="site"``, ``(site, bytes, arrays)``
    per allocation site (``file:line``, the first frame outside numba_pool and Numba), most
    bytes first; with None, ``(site, bytes, device, address, kind)`` per allocation.  Bytes as
    requested.

    :raises RuntimeError: when no history is recorded (:func:`record_history`).
    :raises ValueError: for another ``group_by``.
    """
    return debugging.live_allocations(group_by, device)
