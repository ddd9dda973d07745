"""The bench's anchors: other EMM plugins, measured beside numba_pool where they are installed.

* ``rmm (pool)``: RMM's plugin (``rmm.allocators.numba.RMMNumbaManager``) on RMM's pool
  (``rmm.reinitialize(pool_allocator=True)``);
* ``rmm (cuda_async)``: the same plugin on ``rmm.mr.CudaAsyncMemoryResource`` (the driver's
  stream-ordered pool, as numba_pool);
* ``cupy (pool)``: :class:`CupyNumbaManager`, a plugin on CuPy's device pool written as Numba's
  EMM documentation describes one (a ``HostOnlyCUDAMemoryManager`` whose ``memalloc`` returns a
  ``MemoryPointer`` with a finalizer that hands the block back); bench-only, a comparison.
  Select it with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool_tools.bench.anchors``.

An anchor not installed, not built for the bench's frontend, or failing to start, is left out
with a one-line note.  RMM's plugin derives from numba-cuda's EMM classes (``numba.cuda``), so
its rows run under numba-cuda only (:func:`supported`); the CuPy anchor derives from the
bench's frontend's (:mod:`numba_pool_tools.bench.core`), so it runs under either.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

from cuda.bindings.driver import CUdeviceptr

from .core import FRONTEND, GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer, TITLES
from .labels import CUPY, RMM_ASYNC, RMM_POOL

RMM_VARIABLE = "NUMBA_POOL_BENCH_RMM"  # set in the workers of RMM's rows: the resource its plugin allocates from
#: The package each anchor needs, and the pip name to suggest.
PACKAGES = {RMM_POOL: ("rmm", "rmm-cu13"), RMM_ASYNC: ("rmm", "rmm-cu13"), CUPY: ("cupy", "cupy-cuda13x")}
#: The frontends an anchor's plugin is built for, where not every one: RMM's derives from
#: numba-cuda's classes (``rmm.allocators.numba.RMMNumbaManager``).
BUILT_FOR = {RMM_POOL: "numba-cuda", RMM_ASYNC: "numba-cuda"}
_PLUGIN = dict.fromkeys((RMM_POOL, RMM_ASYNC), "RMM's plugin (rmm.allocators.numba.RMMNumbaManager)")


def supported(label: str, frontend: str = FRONTEND.name) -> bool:
    """Whether the anchor ``label`` can run under ``frontend`` (``numba-cuda`` or ``mlir``)."""
    return BUILT_FOR.get(label, frontend) == frontend


def unsupported_note(label: str, frontend: str = FRONTEND.name) -> str:
    """One line for an anchor whose plugin is not built for ``frontend``, saying why."""
    built_for = BUILT_FOR[label]
    return (f"{label}: row skipped, {_PLUGIN[label]} is built on {TITLES[built_for]}'s EMM classes, "
            f"not {TITLES[frontend]}'s (--frontend {built_for} runs it)")


def installed(label: str) -> bool:
    """Whether the package ``label`` needs can be imported (without importing it)."""
    return importlib.util.find_spec(PACKAGES[label][0]) is not None


def missing_note(label: str) -> str:
    """One line for an anchor whose package is not installed, with what to install."""
    module, pip_name = PACKAGES[label]
    return f"{label}: row skipped, {module} is not installed (pip install {pip_name})"


def failed_note(label: str, err: BaseException | str) -> str:
    """One line for an anchor that is installed but failed: the last line of what it said."""
    text = str(err).strip().splitlines()
    detail = text[-1] if text else type(err).__name__
    return f"{label}: row skipped, it failed: {detail}"


class CupyNumbaManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Device memory from CuPy's default pool (``cupy.get_default_memory_pool().malloc``).

    The CuPy ``MemoryPointer`` is kept in ``self.allocations`` (cleared by ``reset``) until
    Numba's pointer dies; its finalizer drops it and CuPy takes the block back into its pool.
    """

    def initialize(self) -> None:
        import cupy

        self._pool = cupy.get_default_memory_pool()

    def memalloc(self, size: int) -> MemoryPointer:
        block = self._pool.malloc(size)
        address = block.ptr
        allocations = self.allocations
        allocations[address] = block

        def finalizer():
            allocations.pop(address, None)  # gone already after a reset

        return MemoryPointer(self.context, CUdeviceptr(address), size, finalizer=finalizer)

    def get_memory_info(self) -> MemoryInfo:
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        return MemoryInfo(free=free, total=total)

    @property
    def interface_version(self) -> int:
        return 1


_numba_memory_manager = CupyNumbaManager


def prepare_rmm(kind: str) -> None:
    """In a bench worker whose Numba uses RMM's plugin: RMM's current resource, ``pool`` (also
    ``1``, as before) or ``cuda_async``."""
    import rmm

    if kind == "cuda_async":
        rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())
    else:
        rmm.reinitialize(pool_allocator=True)


def in_process(context, frontend: str = FRONTEND.name) -> tuple[dict[str, Callable], dict[str, Callable[[], None]],
                                                                 list[str]]:
    """The anchors' ``memalloc`` on ``context`` (a context of ``frontend``, the bench's) without
    replacing Numba's manager: per label, ``memalloc``; what to call (untimed) before each block
    of it (RMM's current resource is one per device, so the two RMM rows switch it); and one
    note per anchor left out."""
    memallocs, prepare, notes = {}, {}, []
    for label, start in ((RMM_POOL, rmm_in_process), (CUPY, cupy_in_process)):
        if not supported(label, frontend):
            notes.append(unsupported_note(label, frontend))
            if label == RMM_POOL:
                notes.append(unsupported_note(RMM_ASYNC, frontend))
            continue
        if not installed(label):
            notes.append(missing_note(label))
            if label == RMM_POOL:
                notes.append(missing_note(RMM_ASYNC))
            continue
        try:
            started = start(context)
        except Exception as err:  # an optional comparison: note it and go on
            notes += [failed_note(row, err) for row in ((RMM_POOL, RMM_ASYNC) if label == RMM_POOL else (label,))]
            continue
        for row, (memalloc, before) in started.items():
            memallocs[row] = memalloc
            if before is not None:
                prepare[row] = before
    return memallocs, prepare, notes


def rmm_in_process(context) -> dict:
    """RMM's plugin on ``context`` (RMM's pool made current): per RMM row, its ``memalloc`` and
    what makes that row's resource current."""
    import rmm
    from rmm.allocators.numba import RMMNumbaManager

    rmm.reinitialize(pool_allocator=True)
    resources = {RMM_POOL: rmm.mr.get_current_device_resource(), RMM_ASYNC: rmm.mr.CudaAsyncMemoryResource()}
    manager = RMMNumbaManager(context=context)
    manager.initialize()
    return {label: (manager.memalloc, lambda mr=mr: rmm.mr.set_current_device_resource(mr))
            for label, mr in resources.items()}


def cupy_in_process(context) -> dict:
    """:class:`CupyNumbaManager` on ``context``: its ``memalloc``, nothing to do before a block."""
    manager = CupyNumbaManager(context=context)
    manager.initialize()
    return {CUPY: (manager.memalloc, None)}
