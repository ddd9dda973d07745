"""The driver error numba_pool raises: the ``CudaAPIError`` of every Numba CUDA frontend in the process.

Note [One error class for every frontend]
    A program catches its frontend's ``CudaAPIError`` (out of memory, say) and must catch it under numba_pool
    too; ``except`` matches by real subclassing only (no ``__subclasscheck__``).  But the allocator core knows no
    frontend, and a process may use both.  So numba_pool raises one class derived from every loaded frontend's
    ``CudaAPIError`` and :class:`CudaAPIError` below (:func:`bind`, rebuilt as each loads; with none, as in the
    tests' CUDA model and the replay tool, :class:`CudaAPIError` alone), taking ``(code, msg)``, setting both."""

from __future__ import annotations

import threading


class CudaAPIError(Exception):
    """A failed CUDA call: ``code`` (``CUresult``), ``msg`` (which, why); Note [One error class for every frontend]."""

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
    """Make errors raised from now on also derive from ``frontend_error`` (a frontend's ``CudaAPIError``)."""
    global _bases, _raised
    with _lock:
        if frontend_error in _bases or issubclass(CudaAPIError, frontend_error):
            return
        _bases += (frontend_error,)
        _raised = type("CudaAPIError", (*_bases, CudaAPIError),
                       {"__module__": __name__, "__doc__": CudaAPIError.__doc__})


def api_error(code, msg: str) -> CudaAPIError:
    """The error for a failed driver call, an instance of :class:`CudaAPIError` and every loaded frontend's."""
    return _raised(code, msg)


def raised_class() -> type:
    """The class :func:`api_error` builds now (tests)."""
    return _raised
