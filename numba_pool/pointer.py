"""The device pointer numba_pool hands to Numba: a ``MemoryPointer`` released from ``__del__``.

Why not ``MemoryPointer(..., finalizer=f)``: Numba wraps every finalizer in ``weakref.finalize``,
which registers the object in a process-wide registry, creates a weak reference with a callback
and keeps an atexit record.  That costs 1.4 µs per allocation on a development machine and
1.7-1.9 µs on a lent H100's host (docs/perf-notes.md), more than numba_pool's whole allocation
path.  ``__del__`` runs at the same moment (when the last reference goes, or when the garbage
collector frees a reference cycle, PEP 442) for about a tenth of that.

What ``weakref.finalize`` gave that ``__del__`` does not, and how each is covered here:

* ``MemoryPointer.free()`` runs the finalizer early.  :meth:`PoolPointer.free` does the same:
  the release runs once, whichever of ``free()`` and ``__del__`` comes first.
* ``weakref.finalize`` runs the finalizers still alive at exit, before modules are torn down; a
  ``__del__`` may run during the teardown, when the driver bindings and our module globals may
  be gone.  :meth:`PoolPointer.__del__` therefore releases nothing once the interpreter is
  finalizing (``sys.is_finalizing()``, bound early): the memory goes with the CUDA context at
  exit.  The same remedy as cuda-python's and CuPy's (cuda-python #973, CuPy #2809).
* ``weakref.finalize`` belongs to one object: a copy of a Numba ``MemoryPointer`` shares it, and
  it runs once.  A plain copy of our pointer would share ``_release`` and release twice, handing
  one block to two owners.  :meth:`PoolPointer.__copy__` (and ``__deepcopy__``) therefore return
  a non-owning view that keeps the original alive, as Numba's ``MemoryPointer.view`` does.
"""

from __future__ import annotations

import sys
from typing import Callable

try:
    from numba.cuda import MemoryPointer
except ImportError:  # the CUDA simulator's numba.cuda has none: a stand-in base
    from . import _simulator

    if not _simulator.enabled():
        raise
    from ._simulator import MemoryPointer


class PoolPointer(MemoryPointer):
    """A Numba ``MemoryPointer`` that owns numba_pool memory and calls ``release()`` (no
    arguments, must not raise) exactly once: on :meth:`free` or when the pointer is collected.

    :param context: the Numba context (Numba ignores it; kept for its interface).
    :param pointer: the device address (``CUdeviceptr``).
    :param size: bytes requested.
    :param release: returns the memory to its pool; called at most once.
    """

    def __init__(self, context, pointer, size: int, release: Callable[[], None]):
        # MemoryPointer.__init__'s attributes, set here rather than through super().__init__(),
        # which costs 0.25 µs more per allocation (measured: docs/perf-notes.md).  A CI test
        # checks that this list stays the one numba-cuda's MemoryPointer sets.
        self.context = context
        self.device_pointer = self.handle = pointer
        self.size = self._cuda_memsize_ = size
        self.is_managed = True  # it owns its memory, as a MemoryPointer with a finalizer does
        self.refct = 1
        self._owner = None
        self._release = release

    def free(self) -> None:
        """Release the memory now (Numba's ``MemoryPointer.free``); arrays on it must not be
        used afterwards.

        :raises RuntimeError: when the memory was already released ("Freeing dead memory",
            Numba's message).
        """
        release = self._release
        if release is None:
            raise RuntimeError("Freeing dead memory")
        self._release = None
        release()

    def __copy__(self) -> MemoryPointer:
        """A view of the whole allocation that owns nothing and keeps this pointer alive: the
        memory is released once, when the last of them goes."""
        return self.view(0)

    def __deepcopy__(self, memo) -> MemoryPointer:
        """As :meth:`__copy__`: device memory is not duplicated by copying its pointer."""
        return self.view(0)

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        release = self._release
        if release is not None and not _finalizing():
            release()
