"""The CUDA context a release must run in: rule 10 of :mod:`numba_pool.allocator` (:class:`OwnerContext`)."""

from __future__ import annotations

from .driver import GONE, SUCCESS, check, warn


class OwnerContext:
    """The context a release must run in, pushed where not current.  A release runs in a finalizer, any thread.  With no
    current context every call fails (``CUDA_ERROR_INVALID_CONTEXT``); with another current (another device's, or
    PyCUDA's ``make_context``, ``cuCtxCreate``, a green context) it gets *that* context's legacy stream (handle 0),
    which orders nothing of the owner's streams, and creates events there.  So a release calling the driver checks
    ``cuCtxGetCurrent``, pushing the owner's (``cuCtxPushCurrent``) if needed.  :param cu: the driver object.
    :param handle: the owner's ``CUcontext`` (Numba's ``Context.handle``); None: never pushed."""

    def __init__(self, cu, handle):
        self._cu = cu
        self.handle = handle
        self._handle_value = None if handle is None else int(handle)
        self._get_current = getattr(cu, "cuCtxGetCurrent", None)  # bound once (releases); replay's stand-in has none
        if self._get_current is None:
            self._handle_value = None

    @classmethod
    def of(cls, cu, context) -> "OwnerContext":
        """The owner context of a Numba ``Context`` (its ``handle``; none for a stand-in)."""
        return cls(cu, getattr(context, "handle", None))

    def needed(self) -> bool:
        """Whether no context or another one is current (``cuCtxGetCurrent``): the owner's must be pushed."""
        if self._handle_value is None:
            return False
        err, current = self._get_current()
        return err == SUCCESS and int(current) != self._handle_value

    def enter(self, fn, *args) -> None:
        """Start a release ``fn(*args, retry)`` (not raising): in the owner's context (``retry`` False) unless current,
        else here (``retry`` True: ``fn`` may :meth:`retry` a failure, for a context gone meanwhile)."""
        if self.needed():
            self.run(fn, *args, False)
        else:
            fn(*args, True)

    def retry(self, fn, *args) -> bool:
        """After a failed ``fn(*args, True)``: True, running ``fn(*args, False)`` in the owner's context, if needed."""
        if not self.needed():
            return False
        self.run(fn, *args, False)
        return True

    def call(self, fn, *args):
        """``fn(*args)``'s result in the owner's context, pushed if not current (doors' libraries may call with none).
        :raises CudaAPIError: when the owner's context cannot be pushed; whatever ``fn`` raises."""
        if not self.needed():
            return fn(*args)
        check(self._cu.cuCtxPushCurrent(self.handle), "cuCtxPushCurrent (the owner's context)")
        try:
            return fn(*args)
        finally:
            self._cu.cuCtxPopCurrent()

    def run(self, fn, *args) -> None:
        """``fn(*args)`` (not raising) with the owner's context pushed (failing: context and memory gone)."""
        err, = self._cu.cuCtxPushCurrent(self.handle)
        if err != SUCCESS:
            if err not in GONE:
                warn(f"cuCtxPushCurrent failed with {err.name}: a release was not done")
            return
        try:
            fn(*args)
        finally:
            self._cu.cuCtxPopCurrent()
