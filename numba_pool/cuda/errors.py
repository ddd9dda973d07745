"""The driver error numba_pool raises: the ``CudaAPIError`` of every Numba CUDA frontend in the
process at once.

Note [One error class for every frontend]
    A program that runs under Numba's default manager catches its frontend's ``CudaAPIError``
    (``numba.cuda.cudadrv.driver.CudaAPIError``, or Numba-CUDA-MLIR's in
    ``numba_cuda_mlir.numba_cuda.cudadrv.driver``), typically to handle
    ``CUDA_ERROR_OUT_OF_MEMORY``; under numba_pool it must catch the same.  Python's ``except``
    matches by real subclassing only (no ``__subclasscheck__``), so the error has to derive from
    that frontend's class.  But the allocator core raises errors without knowing any frontend,
    and a process may use both frontends at once.  So numba_pool raises one class built from the
    ``CudaAPIError`` of every frontend loaded in the process and :class:`CudaAPIError` below
    (:func:`bind`, called when a frontend loads), rebuilt when a second frontend loads: each
    frontend's ``except`` catches it, and numba_pool's own code catches :class:`CudaAPIError`.
    With no frontend loaded (the CUDA model of the tests, ``numba-pool-tools replay``) it is
    :class:`CudaAPIError` alone.  Every frontend's class takes ``(code, msg)`` and sets ``code``
    and ``msg``, as this one does.
"""

from __future__ import annotations

import threading


class CudaAPIError(Exception):
    """A CUDA driver call failed: ``code`` is the ``CUresult``, ``msg`` says which call and why.
    The base of every error numba_pool raises for a driver result; what it raises also derives
    from each loaded frontend's ``CudaAPIError`` (Note [One error class for every frontend])."""

    def __init__(self, code, msg):
        self.code = code
        self.msg = msg
        super().__init__(code, msg)

    def __str__(self) -> str:
        return f"[{self.code}] {self.msg}"  # Numba's format


_lock = threading.Lock()  # guards _bases and _raised
_bases: tuple = ()  # the loaded frontends' CudaAPIError classes, in load order
_raised: type = CudaAPIError  # the class api_error() builds


def bind(frontend_error: type) -> None:
    """Make the errors raised from now on derive from ``frontend_error`` too (a frontend's
    ``CudaAPIError``), beside those of the frontends bound before."""
    global _bases, _raised
    with _lock:
        if frontend_error in _bases or issubclass(CudaAPIError, frontend_error):
            return
        _bases += (frontend_error,)
        _raised = type("CudaAPIError", (*_bases, CudaAPIError),
                       {"__module__": __name__, "__doc__": CudaAPIError.__doc__})


def api_error(code, msg: str) -> CudaAPIError:
    """The error to raise for a failed driver call: an instance of every loaded frontend's
    ``CudaAPIError`` and of :class:`CudaAPIError`."""
    return _raised(code, msg)


def raised_class() -> type:
    """The class :func:`api_error` builds now (tests)."""
    return _raised
