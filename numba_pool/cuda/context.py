"""The CUDA context a release must run in: rule 10 of :mod:`numba_pool.allocator`.

A release runs where the last reference to an array went: a finalizer, in any thread.  That
thread may have no current context, or another device's, where handle 0 (the legacy stream) is
*that* device's stream and orders nothing on the owner's device.  :class:`OwnerContext` pushes
the owner's context around such a release.
"""

from __future__ import annotations

from .driver import GONE, SUCCESS, warn


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

    #: Set when the process sees two devices or more (:meth:`note_device`): a release then
    #: checks which context is current (``cuCtxGetCurrent``), not only whether one is.
    several = False
    #: Device ordinals with a numba_pool allocator in this process (:meth:`note_device`).
    devices_seen: set = set()

    def __init__(self, cu, handle):
        self._cu = cu
        self.handle = handle
        self._handle_value = None if handle is None else int(handle)
        # Bound once (on the release path with several devices); replay's stand-in has none.
        self._get_current = getattr(cu, "cuCtxGetCurrent", None)
        if self._get_current is None:
            self._handle_value = None

    @classmethod
    def of(cls, cu, context) -> "OwnerContext":
        """The owner context of a Numba ``Context`` (its ``handle``; none for a stand-in
        without one)."""
        return cls(cu, getattr(context, "handle", None))

    @classmethod
    def note_device(cls, cu, device: int) -> None:
        """Record that ``device`` has an allocator; where the process sees two devices (two
        allocators, or ``cuDeviceGetCount`` > 1), every release checks the current context."""
        cls.devices_seen.add(device)
        err, count = cu.cuDeviceGetCount()
        if len(cls.devices_seen) > 1 or (err == SUCCESS and count > 1):
            cls.several = True

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
