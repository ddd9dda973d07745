"""The CUDA context a release must run in: rule 10 of :mod:`numba_pool.allocator` (:class:`OwnerContext`)."""

from __future__ import annotations

from .driver import GONE, SUCCESS, check, warn


class OwnerContext:
    """The CUDA context a release must run in, pushed where it is not current.  A release runs in a finalizer, in
    any thread.  With no current context every call fails (``CUDA_ERROR_INVALID_CONTEXT``); with another current
    (another device's, or PyCUDA's ``make_context``, ``cuCtxCreate``, a green context) it gets *that* context's
    legacy stream (handle 0), which orders nothing of the owner's streams, and creates events there.  (Numba's
    default manager is safe only because ``cuMemFree`` synchronizes.)  So a release calling the driver checks
    ``cuCtxGetCurrent`` and pushes the owner's (``cuCtxPushCurrent``) if needed.

    :param cu: the driver object.
    :param handle: the owner's ``CUcontext`` (Numba's ``Context.handle``); None: never pushed."""

    def __init__(self, cu, handle):
        self._cu = cu
        self.handle = handle
        self._handle_value = None if handle is None else int(handle)
        # Bound once (on every release path that makes a driver call); replay's stand-in has none.
        self._get_current = getattr(cu, "cuCtxGetCurrent", None)
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
        """Start a release, ``fn(*args, retry)`` (which must not raise): in the owner's context (``retry``
        False) where another context or none is current, else in this thread's (``retry`` True: ``fn`` may
        call :meth:`retry` after a failure, for a context that went away meanwhile)."""
        if self.needed():
            self.run(fn, *args, False)
        else:
            fn(*args, True)

    def retry(self, fn, *args) -> bool:
        """After ``fn(*args, True)`` failed: run ``fn(*args, False)`` in the owner's context if
        this thread needs it, and return True; else False."""
        if not self.needed():
            return False
        self.run(fn, *args, False)
        return True

    def call(self, fn, *args):
        """``fn(*args)``'s result, in the owner's context (pushed where another or none is current): for an
        allocation through a door whose library may call with no context current.

        :raises CudaAPIError: when the owner's context cannot be pushed; whatever ``fn`` raises."""
        if not self.needed():
            return fn(*args)
        check(self._cu.cuCtxPushCurrent(self.handle), "cuCtxPushCurrent (the owner's context)")
        try:
            return fn(*args)
        finally:
            self._cu.cuCtxPopCurrent()

    def run(self, fn, *args) -> None:
        """``fn(*args)`` (must not raise) with the owner's context pushed; where it cannot be, the context
        is gone, and the memory with it."""
        err, = self._cu.cuCtxPushCurrent(self.handle)
        if err != SUCCESS:
            if err not in GONE:
                warn(f"cuCtxPushCurrent failed with {err.name}: a release was not done")
            return
        try:
            fn(*args)
        finally:
            self._cu.cuCtxPopCurrent()
