"""Everything the benchmark takes from numba_pool's allocator core and from the Numba CUDA
frontend, in one place: the bench's other modules reach both through here only (the allocator
part's import of a whole numba_pool package aside).

* :data:`FRONTEND`, the frontend every bench process runs under
  (:func:`numba_pool.cuda.frontend.for_tools`: ``NUMBA_POOL_FRONTEND``, which the parent passes
  to each process it starts, :func:`worker_environment`; else the one imported; else the one
  installed, numba-cuda first), taken once, at import; :data:`cuda`, its module
  (``numba.cuda`` or ``numba_cuda_mlir.cuda``), which the bench uses as programs use
  ``from numba import cuda``; :func:`frontend_label`, how the tables and the JSON report name it.
* Its EMM classes (``HostOnlyCUDAMemoryManager``, ``MemoryPointer``, ``MemoryInfo``,
  ``GetIpcHandleMixin``), for the no-op floors and the CuPy anchor (under numba-cuda's CUDA
  simulator, :data:`SIMULATOR`, the simulator's stand-ins).
* :func:`check` (a driver call's result, or one-line error) and :func:`device_memory_info`
  (free and total bytes), for the no-op floors.
* :func:`parse_bool`, for ``NUMBA_POOL_NOOP_FINALIZER``.
* :func:`using_stream`, numba_pool's allocation stream scope, for the workers that allocate on
  a stream as a program would (:func:`numba_pool_tools.bench.timing.stream_scope`).
* What a worker reads of a numba_pool manager: :func:`pool_handle` and :func:`has_cache` (its
  pinned or managed cache).
* The allocation history, for its rows in the allocator part (:mod:`numba_pool_tools.bench.history_cost`):
  :func:`record_history` (the public switch), :class:`History` (a recording) and
  :data:`MAX_FRAMES` (the frames it keeps per allocation), and the one composition point of a
  device's allocation path, :func:`compose` with a :class:`Recording`.
"""

from __future__ import annotations

from numba_pool.config import parse_bool
from numba_pool.cuda import simulator
from numba_pool.cuda.driver import check
from numba_pool.cuda.frontend import DISTRIBUTIONS, NUMBA_CUDA, TITLES, VARIABLE, for_tools, version
from numba_pool.cuda.mempool import device_memory_info
from numba_pool import using_stream  # the public scope: it registers a capture under way (rule 13)
from numba_pool.observe.history import MAX_FRAMES, History
from numba_pool.plugin.api import record_history
from numba_pool.plugin.path import Recording, compose

__all__ = ["FRONTEND", "FRONTEND_VARIABLE", "GetIpcHandleMixin", "History", "HostOnlyCUDAMemoryManager", "MAX_FRAMES",
           "MemoryInfo", "MemoryPointer", "NUMBA_CUDA", "Recording", "SIMULATOR", "TITLES", "check", "compose", "cuda",
           "device_memory_info", "frontend_label", "has_cache", "parse_bool", "pool_handle", "record_history",
           "simulator", "using_stream", "worker_environment"]

#: The frontend of this bench process (:func:`numba_pool.cuda.frontend.for_tools`), and its
#: ``cuda`` module.
FRONTEND = for_tools()
cuda = FRONTEND.cuda
SIMULATOR = FRONTEND.simulator  # numba-cuda's CUDA simulator (NUMBA_ENABLE_CUDASIM=1)
HostOnlyCUDAMemoryManager = FRONTEND.HostOnlyCUDAMemoryManager
GetIpcHandleMixin = FRONTEND.GetIpcHandleMixin
MemoryPointer = FRONTEND.MemoryPointer
MemoryInfo = FRONTEND.MemoryInfo
#: The variable that names a process's frontend (``numba-cuda`` or ``mlir``).
FRONTEND_VARIABLE = VARIABLE


def frontend_label(name: str = FRONTEND.name) -> str:
    """The frontend ``name`` (``numba-cuda`` or ``mlir``) as the tables and the JSON report
    name it: its title and installed version, ``'Numba-CUDA-MLIR 0.6.0'``; ``'(version
    unknown)'`` where its distribution's metadata cannot be found."""
    return f"{TITLES[name]} {version(DISTRIBUTIONS[name]) or '(version unknown)'}"


def worker_environment() -> dict[str, str]:
    """What every process the bench starts gets on top of its own variables, so that it runs
    under this process's frontend (its memory manager's classes, its ``cuda``):
    ``{NUMBA_POOL_FRONTEND: name}``."""
    return {FRONTEND_VARIABLE: FRONTEND.name}


def pool_handle(manager):
    """The driver handle (``CUmemoryPool``) of ``manager``'s pool, or ``None`` where it has none
    (another plugin, or a numba_pool manager not initialized: its ``allocator`` is ``None``)."""
    pool = getattr(getattr(manager, "allocator", None), "pool", None)
    return getattr(pool, "handle", None)


def has_cache(manager, attribute: str = "host") -> bool:
    """Whether ``manager`` serves a kind of memory from numba_pool's cache of it: ``attribute``
    names the numba_pool manager's cache, ``"host"`` for pinned memory (``NUMBA_POOL_HOST``),
    ``"managed"`` for managed memory (``NUMBA_POOL_MANAGED``)."""
    return getattr(manager, attribute, None) is not None

