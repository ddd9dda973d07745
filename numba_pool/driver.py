"""The seam between numba_pool and the CUDA driver.

Every driver call numba_pool makes goes through a *driver object*: on a GPU, cuda-python's
``cuda.bindings.driver`` module (:data:`cu`).  Each memory manager takes the object in effect when
it initializes and hands it to the pool, the ordering and the arena, which bind the functions
they call on their hot paths once.  The tests put a model of CUDA's stream ordering in its place
(``tests/cuda_model.py``, through :func:`use`), so that the real allocator code runs unchanged,
and is checked, on a machine without a GPU; ``numba-pool replay`` passes its own address-space
stand-in (:mod:`numba_pool.replay`) to the arena the same way.

Types, enums and constants (``CUstream``, ``CUresult`` ...) always come from cuda-python: a
stand-in provides only functions.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

from cuda.bindings import driver as cuda_driver
from numba.cuda.cudadrv.driver import CudaAPIError

#: The driver object new managers use: cuda-python's driver module unless :func:`use` swapped it.
cu: Any = cuda_driver

SUCCESS = cuda_driver.CUresult.CUDA_SUCCESS
OUT_OF_MEMORY = cuda_driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
#: Errors a late call meets when the context or driver is already gone (interpreter exit,
#: ``cuda.close()``): the memory went with the context, so there is nothing to report.
GONE = frozenset({cuda_driver.CUresult.CUDA_ERROR_DEINITIALIZED, cuda_driver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,
                  cuda_driver.CUresult.CUDA_ERROR_INVALID_CONTEXT})
EVENT_FLAGS = cuda_driver.CUevent_flags.CU_EVENT_DISABLE_TIMING


@contextlib.contextmanager
def use(driver: Any) -> Iterator[Any]:
    """Make ``driver`` the driver object of managers initialized inside the block (tests).

    :param driver: an object with the ``cu*`` functions numba_pool calls, returning cuda-python's
        result tuples.
    """
    global cu
    previous, cu = cu, driver
    try:
        yield driver
    finally:
        cu = previous


def check(result: tuple, call: str):
    """Unpack a cuda-python result tuple, raising Numba's ``CudaAPIError`` on failure.

    :returns: the single value the call returned (or a tuple of several, or None).
    :raises numba.cuda.cudadrv.driver.CudaAPIError: with the ``CUresult`` and ``call`` named.
    """
    err, *values = result
    if err != SUCCESS:
        raise CudaAPIError(err, f"numba_pool: {call} failed with {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class OwnerContext:
    """The CUDA context a release must run in, for threads where it is not current.

    A release may run in any thread: a finalizer where the last reference went.  One that
    never used CUDA has no current context, so every driver call fails
    (``CUDA_ERROR_INVALID_CONTEXT``); one working on another device has that device's context
    current, where the legacy stream (handle 0) is *that* device's, which orders nothing on the
    owner's device.  Numba's default manager avoids both by queueing frees on the owning
    context.  Here the owner's context is pushed (``cuCtxPushCurrent``) around the release.

    :param cu: the driver object.
    :param handle: the owner's ``CUcontext`` (Numba's ``Context.handle``); None: never pushed.
    """

    #: Set when the process sees two devices or more (``cuDeviceGetCount``): a release then
    #: checks which context is current (``cuCtxGetCurrent``), not only whether one is.
    several = False

    def __init__(self, cu, handle):
        self._cu = cu
        self.handle = handle
        self._handle_value = None if handle is None else int(handle)
        # Bound once (on the release path with several devices); replay's stand-in has none.
        self._get_current = getattr(cu, "cuCtxGetCurrent", None)
        if self._get_current is None:
            self._handle_value = None

    def needed(self) -> bool:
        """Whether the calling thread must push the owner's context before a release."""
        if self._handle_value is None:
            return False
        err, current = self._get_current()
        if err != SUCCESS:
            return False
        current = int(current)
        return not current or (self.several and current != self._handle_value)

    def enter(self, fn, *args) -> None:
        """Start a release, ``fn(*args, retry)`` (which must not raise): in the owner's context
        (``retry`` False) where the process sees several devices and another context is
        current, else in this thread's (``retry`` True: ``fn`` may call :meth:`retry` after a
        failure)."""
        if self.several and self.needed():
            self.run(fn, *args, False)
        else:
            fn(*args, True)

    def retry(self, fn, *args) -> bool:
        """After ``fn(*args, True)`` failed: run ``fn(*args, False)`` in the owner's context if
        this thread needed it (it had no current context), and return True; else False."""
        if not self.needed():
            return False
        self.run(fn, *args, False)
        return True

    def run(self, fn, *args) -> None:
        """``fn(*args)`` (which must not raise) with the owner's context pushed, popped after.
        Where it cannot be pushed the context is gone, and the memory with it."""
        err, = self._cu.cuCtxPushCurrent(self.handle)
        if err != SUCCESS:
            if err not in GONE:
                warn(f"cuCtxPushCurrent failed with {err.name}: a release was not done")
            return
        try:
            fn(*args)
        finally:
            self._cu.cuCtxPopCurrent()


def warn(message: str) -> None:
    """Warn from a release or a finalizer: never raises, even under ``-W error``."""
    try:
        warnings.warn(f"numba_pool: {message}", RuntimeWarning, stacklevel=2)
    except Exception:  # noqa: BLE001 - a finalizer must not raise; the warning is all we had
        pass


def report_failure(result: tuple, call: str) -> bool:
    """For calls whose failure is reported, not raised (frees, resets): True on success; a
    warning for any error but those of a context that is already gone."""
    err = result[0]
    if err == SUCCESS:
        return True
    if err not in GONE:
        warn(f"{call} failed with {err.name}")
    return False
