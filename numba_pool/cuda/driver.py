"""The seam between numba_pool and the CUDA driver: every driver call goes through a *driver object*, cuda-python's
``cuda.bindings.driver`` on a GPU (:data:`cu`).  A manager takes the object in effect at initialization and hands it to
the pool and allocator, which bind hot-path functions once.  The tests put a model of CUDA's stream ordering in its
place (``cuda_model``, :func:`use`) so the real allocator runs without a GPU; ``numba-pool-tools replay`` passes its own
stand-in to the arena.  Types, enums and constants always come from cuda-python: a stand-in has only functions."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator

from cuda.bindings import driver as cuda_driver
from .errors import api_error

cu: Any = cuda_driver  #: The driver object new managers use: cuda-python's module unless :func:`use` swapped it.

SUCCESS = cuda_driver.CUresult.CUDA_SUCCESS
OUT_OF_MEMORY = cuda_driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY
NOT_READY = cuda_driver.CUresult.CUDA_ERROR_NOT_READY  #: cuEventQuery's answer for work not yet done.
#: Errors once the context (and its memory) or driver is gone (interpreter exit, ``cuda.close()``): not reported.
GONE = frozenset({cuda_driver.CUresult.CUDA_ERROR_DEINITIALIZED, cuda_driver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,
                  cuda_driver.CUresult.CUDA_ERROR_INVALID_CONTEXT})
EVENT_FLAGS = cuda_driver.CUevent_flags.CU_EVENT_DISABLE_TIMING


@contextlib.contextmanager
def use(driver: Any) -> Iterator[Any]:
    """Make ``driver`` the driver object of managers initialized inside the block (tests).
    :param driver: an object with the ``cu*`` functions numba_pool calls, returning cuda-python's tuples."""
    global cu
    previous, cu = cu, driver
    try:
        yield driver
    finally:
        cu = previous


TWINNED = ("cuStreamIsCapturing", "cuMemFreeAsync", "cuStreamGetId")  #: The calls with a compiled twin.
#: The capture query's twin's answer for a stream not capturing, this very tuple: one identity test on the hot paths.
NOT_CAPTURING_ANSWER = (SUCCESS, cuda_driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)
_twins: Any = None  # the compiled module once its entry points are bound; False: not available


def hot(driver: Any, name: str):
    """``driver.<name>`` for a hot path to bind once: its compiled twin where ``driver`` is cuda-python's module and
    the compiled module is built (Note [Compiled driver calls]), else the driver object's own function.

    Note [Compiled driver calls]
        cuda-python builds an enum object for each call's status; the twins (``_native.pyx``) return the same
        objects, prebuilt for success (the capture query: :data:`NOT_CAPTURING_ANSWER` itself).  They call the
        entry points ``cuGetProcAddress`` gives for CUDA 13.0, whose C signatures they declare (never a later
        version's), with the GIL released as cuda-python does; never with handle 0, whose meaning alone the
        per-thread default stream variants change.  Below the allocator:
        the CUDA model replaces the driver object, twins included.  Optional (no C compiler at install:
        cuda-python's functions); ``numba-pool info`` says which."""
    global _twins
    if driver is cuda_driver:
        if _twins is None:
            _twins = _bind_twins()
        if _twins:
            return getattr(_twins, name)
    return getattr(driver, name)


def twins_in_use() -> bool:
    """Whether the hot paths call the compiled twins (bound at the first manager's start)."""
    return bool(_twins)


def _bind_twins():
    try:
        from . import _native
        default = cuda_driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        found = [cuda_driver.cuGetProcAddress(name.encode(), 13000, default) for name in TWINNED]
    except Exception:  # noqa: BLE001 - not built, or no driver library: cuda-python's functions (which will say so)
        return False
    if any(err != SUCCESS or not address for err, address, _ in found):
        return False
    _native.bind(*(int(address) for _, address, _ in found), cuda_driver.CUresult, cuda_driver.CUstreamCaptureStatus,
                 NOT_CAPTURING_ANSWER)
    return _native


def check(result: tuple, call: str):
    """Unpack a cuda-python result tuple, raising ``CudaAPIError`` on failure.
    :returns: the single value the call returned (or a tuple of several, or None).
    :raises CudaAPIError: (:mod:`numba_pool.cuda.errors`) naming the ``CUresult`` and ``call``."""
    err, *values = result
    if err != SUCCESS:
        raise api_error(err, f"numba_pool: {call} failed with {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def warn(message: str) -> None:
    """Warn from a release or a finalizer: never raises, even under ``-W error``."""
    try:
        warnings.warn(f"numba_pool: {message}", RuntimeWarning, stacklevel=2)
    except Exception:  # noqa: BLE001 - a finalizer must not raise; the warning is all we had
        pass


def report_failure(result: tuple, call: str) -> bool:
    """Report, not raise, a call's failure (frees, resets): True on success; else warn unless the context is gone."""
    err = result[0]
    if err == SUCCESS:
        return True
    if err not in GONE:
        warn(f"{call} failed with {err.name}")
    return False
