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
