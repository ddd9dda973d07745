"""The Numba CUDA frontends numba_pool serves (docs/architecture.md, "Two frontends"), found, never assumed; the only
module importing one.  Both keep Numba's EMM plugin interface, version 1: ``numba-cuda`` (``numba.cuda``) and its
successor ``mlir``, Numba-CUDA-MLIR (``numba_cuda_mlir.cuda``, without numba or numba-cuda).  A :class:`Frontend` holds
what numba_pool takes from one, imported only in use (:func:`load`); the simulator's EMM stand-ins: :mod:`.simulator`.

Note [Which frontend a call acts on]
    Each frontend has its own contexts, hence managers.  A public function (:func:`resolve`) acts on the one named by
    ``frontend=``, else its object's, else the only one imported; both imported: the only one with numba_pool managers,
    else ``NUMBA_POOL_FRONTEND``'s, else a one-line error: ambiguous.  None imported: :func:`for_tools`'s choice."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
from typing import Any

from ..config import FRONTEND_VARIABLE
from . import errors, pointers, simulator

NUMBA_CUDA = "numba-cuda"
MLIR = "mlir"
NAMES = (NUMBA_CUDA, MLIR)  #: The frontends, the tools' preferred first when both are installed and none is chosen.
TITLES = {NUMBA_CUDA: "numba-cuda", MLIR: "Numba-CUDA-MLIR"}  #: Each frontend's name in messages.
PACKAGES = {NUMBA_CUDA: "numba.cuda", MLIR: "numba_cuda_mlir.cuda"}  #: The module a program imports ``cuda`` from.
_DRIVERS = {NUMBA_CUDA: "numba.cuda.cudadrv", MLIR: "numba_cuda_mlir.numba_cuda.cudadrv"}
_TOP_LEVEL = {NUMBA_CUDA: "numba_cuda", MLIR: "numba_cuda_mlir"}  # what find_spec looks for
DISTRIBUTIONS = {NUMBA_CUDA: "numba-cuda", MLIR: "numba-cuda-mlir"}  #: Each one's distribution, for :func:`version`.
EXTRAS = {NUMBA_CUDA: "pip install '.[numba-cuda]' in a numba-pool checkout",  #: How each is installed.
          MLIR: "pip install '.[mlir]' in a numba-pool checkout"}
VARIABLE = FRONTEND_VARIABLE  #: Names the tools' frontend and breaks ties (Note [Which frontend ...]).
_SPELLINGS = {"numba-cuda": NUMBA_CUDA, "numba_cuda": NUMBA_CUDA, "numba.cuda": NUMBA_CUDA,
              "mlir": MLIR, "numba-cuda-mlir": MLIR, "numba_cuda_mlir": MLIR}


class FrontendError(ValueError, RuntimeError):
    """No frontend named (a ``ValueError``), none usable, or an ambiguous choice: one line saying why and what to do."""


class Frontend:
    """One frontend and numba_pool's classes on it: ``name``, ``title``, ``cuda`` (the module programs use), ``driver``
    (``cudadrv.driver``), ``simulator``; its EMM, pointer, IPC and error classes (``HostOnlyCUDAMemoryManager`` ...
    ``CudaSupportError``, ``MemAlloc``); ``PoolPointer``, ``PooledPinnedMemory``, ``PooledManagedMemory`` on them."""

    def __init__(self, name: str):
        self.name = name
        self.title = TITLES[name]
        self.cuda = importlib.import_module(PACKAGES[name])
        self.simulator = name == NUMBA_CUDA and bool(self.cuda.config.ENABLE_CUDASIM)
        self.driver = importlib.import_module(_DRIVERS[name] + ".driver")
        self.CudaAPIError = self.driver.CudaAPIError  # the simulator's driver module has it too
        self.CudaSupportError = importlib.import_module(_DRIVERS[name] + ".error").CudaSupportError
        if self.simulator:
            self.HostOnlyCUDAMemoryManager = simulator.HostOnlyCUDAMemoryManager
            self.GetIpcHandleMixin = simulator.StandInMixin
            self.MemoryPointer = self.PinnedMemory = self.ManagedMemory = simulator.MemoryPointer
            self.MemAlloc = object
            self.IpcHandle, self.MemoryInfo = simulator.IpcHandle, simulator.MemoryInfo
            simulator.note_environment()
        else:
            for cls in ("HostOnlyCUDAMemoryManager", "GetIpcHandleMixin", "MemoryPointer", "PinnedMemory",
                        "ManagedMemory", "IpcHandle", "MemoryInfo"):
                setattr(self, cls, getattr(self.driver, cls))
            self.MemAlloc = self.driver.mviewbuf.MemAlloc
        self.PoolPointer = self.derive(pointers.PoolPointer, self.MemoryPointer)
        self.PooledPinnedMemory = self.derive(pointers.PooledPinnedMemory, self.PinnedMemory)
        managed_bases = (self.ManagedMemory,) if self.MemAlloc is object else (self.ManagedMemory, self.MemAlloc)
        self.PooledManagedMemory = self.derive(pointers.PooledManagedMemory, *managed_bases)

    def derive(self, ours: type, *bases: type, **namespace: Any) -> type:
        """Mixin ``ours`` first on this frontend's ``bases`` (its methods win), with class attribute ``frontend``."""
        namespace.update(__module__=ours.__module__, __qualname__=ours.__qualname__, __doc__=ours.__doc__,
                         frontend=self)
        return type(ours.__name__, (ours, *bases), namespace)

    def current_context(self, device: int | None = None):
        """This frontend's context of ``device`` (None: current), made if needed (``cuda.current_context``).
        :raises CudaSupportError: (the frontend's) where there is no CUDA GPU."""
        return self.cuda.current_context() if device is None else self.cuda.current_context(device)

    def devices_with_context(self) -> list[int]:
        """Ordinals of the devices where this frontend has a context (none under the simulator)."""
        if self.simulator:
            return []
        return [dev.id for dev in self.driver.driver.devices.values()
                if getattr(dev, "primary_context", None) is not None]

    def __repr__(self) -> str:
        return f"<numba_pool frontend {self.title}{' (CUDA simulator)' if self.simulator else ''}>"


_lock = threading.RLock()  # guards _loaded and _serving (reentrant: loading imports modules)
_loaded: dict[str, Frontend] = {}
_serving: set[str] = set()  # frontends that made a numba_pool manager for a context


def load(name: str) -> Frontend:
    """The frontend ``name`` (``"numba-cuda"`` or ``"mlir"``), imported at the first call.
    :raises FrontendError: when it is not installed, naming the command that installs it."""
    with _lock:
        found = _loaded.get(name)
        if found is not None:
            return found
        try:
            found = Frontend(name)
        except ImportError as err:
            if err.name is None or not (err.name.startswith(_TOP_LEVEL[name]) or err.name.startswith(
                    PACKAGES[name].split(".")[0])):
                raise
            raise FrontendError(f"numba_pool: the {TITLES[name]} frontend ({PACKAGES[name]}) is not installed: "
                                f"{EXTRAS[name]}") from None
        _loaded[name] = found
        errors.bind(found.CudaAPIError)
        return found


def loaded() -> list[Frontend]:
    """The frontends loaded so far, in load order."""
    with _lock:
        return list(_loaded.values())


def name_of_module(module: str | None) -> str | None:
    """The frontend a module belongs to, by its name, or None."""
    if not module:
        return None
    if module.startswith("numba_cuda_mlir"):
        return MLIR
    if module == "numba.cuda" or module.startswith(("numba.cuda.", "numba_cuda")):
        return NUMBA_CUDA
    return None


def name_of(obj: Any) -> str | None:
    """The frontend whose class ``obj`` is an instance of, or None (an int, a ``CUstream``, CuPy's...)."""
    for cls in type(obj).__mro__:
        ours = cls.__dict__.get("frontend")
        if isinstance(ours, Frontend):
            return ours.name
        name = name_of_module(cls.__module__)
        if name is not None:
            return name
    return None


def imported() -> list[str]:
    """The frontends a program has imported (their ``cuda`` module is in ``sys.modules``)."""
    return [name for name in NAMES if PACKAGES[name] in sys.modules]


def installed() -> list[str]:
    """The frontends installed in this environment (found, not imported)."""
    return [name for name in NAMES if importlib.util.find_spec(_TOP_LEVEL[name]) is not None]


def parse_name(value: str, culprit: str) -> str:
    """A frontend's name from a user's spelling (``numba-cuda``, ``mlir``, ``numba-cuda-mlir`` ...; any case).
    :raises FrontendError: naming ``culprit`` and the value, for anything else."""
    name = _SPELLINGS.get(str(value).strip().lower())
    if name is None:
        prefix = "" if culprit.startswith("numba_pool") else "numba_pool: "
        raise FrontendError(f"{prefix}{culprit}={value!r} is not a frontend: expected 'numba-cuda' (numba.cuda) or "
                            "'mlir' (numba_cuda_mlir.cuda)")
    return name


def from_environment(environ=os.environ) -> str | None:
    """``NUMBA_POOL_FRONTEND``'s frontend, or None when it is unset or empty.
    :raises FrontendError: for a value that names no frontend."""
    value = environ.get(VARIABLE, "").strip()
    return parse_name(value, VARIABLE) if value else None


def version(distribution: str) -> str | None:
    """``distribution``'s installed version from its metadata, not imported; None when not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def tools_choice(environ=os.environ) -> tuple[str | None, str]:
    """Which frontend the tools use and why, importing nothing: ``NUMBA_POOL_FRONTEND``'s, else the one imported, else
    the one installed (numba-cuda first); ``(None, why)`` when none is.  :raises FrontendError: for a bad variable."""
    name = from_environment(environ)
    if name is not None:
        return name, f"{VARIABLE}={environ[VARIABLE].strip()}"
    in_use = imported()
    if in_use:
        return in_use[0], f"imported by this process ({VARIABLE} is not set)"
    found = installed()
    if not found:
        return None, "no Numba CUDA frontend is installed: " + " or ".join(EXTRAS.values())
    why = "numba-cuda first when both are" if len(found) > 1 else "the only one installed"
    return found[0], f"the default ({VARIABLE} is not set; {why})"


def for_tools(environ=os.environ) -> Frontend:
    """The frontend of the command line, kernels, benchmark and Dask workers (:func:`tools_choice`), imported.
    :raises FrontendError: when none is installed, or the variable is bad."""
    name, why = tools_choice(environ)
    if name is None:
        raise FrontendError(f"numba_pool: {why}")
    return load(name)


def named(frontend: "str | Frontend | None" = None, culprit: str = "frontend") -> Frontend:
    """The frontend a tool was told to use: a :class:`Frontend`, a name in any spelling
    :func:`parse_name` reads, or None for :func:`for_tools`'s choice; imported now.
    :raises FrontendError: for a bad name (naming ``culprit``), one not installed, or a bad ``NUMBA_POOL_FRONTEND``."""
    if frontend is None:
        return for_tools()
    if isinstance(frontend, Frontend):
        return frontend
    return load(parse_name(frontend, culprit))


def no_gpu(err: Exception) -> RuntimeError:
    """numba_pool's one line for a frontend's ``CudaSupportError`` ``err`` (several lines, some bare ``:``)."""
    cause = " ".join(part.strip(" :") for part in str(err).splitlines() if part.strip(" :"))
    return RuntimeError(f"numba_pool: no CUDA GPU is available here ({cause or type(err).__name__})")


def note_serving(frontend: Frontend) -> None:
    """Record that ``frontend`` made a numba_pool manager for a context (the plugin calls it)."""
    with _lock:
        _serving.add(frontend.name)


def resolve(call: str, *objects: Any, name: str | None = None) -> Frontend:
    """The frontend a public function acts on (Note [Which frontend a call acts on]).  :param call: the function, as the
    user wrote it (``"numba_pool.stats()"``), for messages.  :param objects: what the call was given (arrays, streams,
    contexts, pointers; None skipped).  :param name: the frontend the caller named (``frontend=``), if any.
    :raises FrontendError: when it is ambiguous, or the named frontend is not installed."""
    if name is not None:
        return load(parse_name(name, f"{call}: frontend"))
    for obj in objects:
        found = None if obj is None else name_of(obj)
        if found is not None:
            return load(found)
    in_use = imported()
    if len(in_use) == 1:
        return load(in_use[0])
    if not in_use:
        return for_tools()
    with _lock:
        serving = [n for n in in_use if n in _serving]
    if len(serving) == 1:
        return load(serving[0])
    chosen = from_environment()
    if chosen is not None:
        return load(chosen)
    using = "have numba_pool managers" if serving else "are imported"
    raise FrontendError(
        f"{call}: both numba-cuda and Numba-CUDA-MLIR {using} in this process, so which one is meant is ambiguous: "
        f"pass frontend='numba-cuda' or frontend='mlir', or one of its arrays or streams, or set {VARIABLE}")


def of_caller(depth: int) -> str | None:
    """The frontend of the module ``depth`` frames above the caller, or None; for classes made context-less."""
    frame = sys._getframe(depth + 1)
    return name_of_module(frame.f_globals.get("__name__"))
