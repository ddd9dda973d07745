"""The pointers numba_pool hands to Numba, released from ``__del__``: device memory as a
``MemoryPointer`` (:class:`PoolPointer`), pinned host memory from the host cache as a
``PinnedMemory`` (:class:`PooledPinnedMemory`), managed memory as a ``ManagedMemory`` that is
also a buffer (:class:`PooledManagedMemory`).

Both are mixins: each frontend's ``MemoryPointer`` and ``PinnedMemory`` get their own subclass
(:meth:`numba_pool.cuda.frontend.Frontend.derive`: ``frontend.PoolPointer`` ...), which is what
the allocator hands out; ``isinstance(p, PoolPointer)`` holds for either frontend's.

Why not ``MemoryPointer(..., finalizer=f)``: Numba wraps every finalizer in ``weakref.finalize``,
which registers the object in a process-wide registry, creates a weak reference with a callback
and keeps an atexit record.  That costs 1.4 µs per allocation on a development machine and
1.7-1.9 µs on a lent H100's host (docs/perf-notes.md), more than numba_pool's whole allocation
path.  ``__del__`` runs at the same moment (when the last reference goes, or when the garbage
collector frees a reference cycle, PEP 442) for about a tenth of that.

What ``weakref.finalize`` gave that ``__del__`` does not, and how each is covered here:

* ``MemoryPointer.free()`` runs the finalizer early.  :meth:`PoolPointer.free` does the same:
  the block's release runs once, whichever of ``free()`` and ``__del__`` comes first.
* ``weakref.finalize`` runs the finalizers still alive at exit, before modules are torn down; a
  ``__del__`` may run during the teardown, when the driver bindings and our module globals may
  be gone.  :meth:`PoolPointer.__del__` therefore releases nothing once the interpreter is
  finalizing (``sys.is_finalizing()``, bound early): the memory goes with the CUDA context at
  exit.  The same remedy as cuda-python's and CuPy's (cuda-python #973, CuPy #2809).
* ``weakref.finalize`` belongs to one object: a copy of a Numba ``MemoryPointer`` shares it, and
  it runs once.  A plain copy of our pointer would share ``_block`` and release it twice, handing
  one block to two owners.  :meth:`PoolPointer.__copy__` (and ``__deepcopy__``) therefore return
  a non-owning view that keeps the original alive, as Numba's ``MemoryPointer.view`` does.
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable


class PoolPointer:
    """Mixin for a frontend's ``MemoryPointer``: the EMM door of the allocator's core
    (:mod:`numba_pool.allocator.block`).  It holds one :class:`~numba_pool.allocator.block.Block`
    and releases it exactly once, ``block.release(block)`` (which must not raise): on
    :meth:`free` or when the pointer is collected.

    :param context: the Numba context (Numba ignores it; kept for its interface).
    :param pointer: the device address (``CUdeviceptr``).
    :param size: bytes requested.
    :param block: the block (or an adaptor's wrapper of it, :meth:`wrap_release`); released at
        most once.
    """

    _block = None  # until __init__ ran: __del__ of an object made by __new__ alone releases nothing
    #: The id of the stream capture whose graph allocated this memory (an allocation node,
    #: rule 13 of numba_pool.allocator), 0 for memory allocated outside any capture.
    captured = 0

    def __init__(self, context, pointer, size: int, block):
        # MemoryPointer.__init__'s attributes, set here rather than through super().__init__(),
        # which costs 0.25 µs more per allocation (measured: docs/perf-notes.md).  A CI test
        # checks that this list stays the one each frontend's MemoryPointer sets.
        self.context = context
        self.device_pointer = self.handle = pointer
        self.size = self._cuda_memsize_ = size
        self.is_managed = True  # it owns its memory, as a MemoryPointer with a finalizer does
        self.refct = 1
        self._owner = None
        self._block = block

    @property
    def block(self):
        """The allocator's :class:`~numba_pool.allocator.block.Block` of this memory (None once
        released)."""
        block = self._block
        return block.block if type(block) is _Adapted else block

    def free(self) -> None:
        """Release the memory now (Numba's ``MemoryPointer.free``); arrays on it must not be
        used afterwards.

        :raises RuntimeError: when the memory was already released ("Freeing dead memory",
            Numba's message).
        """
        block = self._block
        if block is None:
            raise RuntimeError("Freeing dead memory")
        self._block = None
        block.release(block)

    def wrap_release(self, adaptor: Callable[..., None], *args) -> None:
        """Put an adaptor's part in front of this pointer's release: from now on, releasing
        calls ``adaptor(*args, release)``, where ``release`` is the release before, which the
        adaptor calls after its part (an allocation path's adaptor,
        :mod:`numba_pool.plugin.path`: a log row, the scopes' counts, the history's entry).
        The pointer stays the one Numba gets: one object, one owner, one release, and no
        second pointer to build and collect (0.4 µs per allocation and adaptor).

        :raises RuntimeError: when the memory was already released ("Freeing dead memory").
        """
        block = self._block
        if block is None:
            raise RuntimeError("Freeing dead memory")
        self._block = _Adapted(block, partial(adaptor, *args, partial(block.release, block)))

    def __copy__(self):
        """A view of the whole allocation that owns nothing and keeps this pointer alive: the
        memory is released once, when the last of them goes."""
        return self.view(0)

    def __deepcopy__(self, memo):
        """As :meth:`__copy__`: device memory is not duplicated by copying its pointer."""
        return self.view(0)

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        block = self._block
        if block is not None and not _finalizing():
            block.release(block)


class _Adapted:
    """A block whose release an adaptor wraps (:meth:`PoolPointer.wrap_release`): releasing it
    runs ``chain()``, the adaptors' parts and then the block's own release."""

    __slots__ = ("block", "chain")

    def __init__(self, block, chain: Callable[[], None]):
        self.block = block.block if type(block) is _Adapted else block
        self.chain = chain

    @staticmethod
    def release(adapted: "_Adapted") -> None:
        adapted.chain()


class PooledManagedMemory(PoolPointer):
    """Mixin for a frontend's ``ManagedMemory`` (with its ``mviewbuf.MemAlloc``, the buffer
    protocol NumPy reads): managed memory from numba_pool's managed cache, what
    ``cuda.managed_array`` wraps in a NumPy array and keeps as the array's ``gpu_data``.
    A :class:`PoolPointer` otherwise: released exactly once, on :meth:`free` or collection,
    never at exit.

    Numba's own ``memallocmanaged`` returns ``ManagedMemory(...).own()``: a
    ``ManagedOwnedPointer`` whose ``weakref.finalize`` calls the ``ManagedMemory``'s, which
    Numba keeps alive in the manager's ``allocations``; two ``weakref.finalize`` objects (1.7-1.9
    µs each on a lent H100's host).  This one object is both, as :class:`PoolPointer` is for
    device memory.
    """

    def __init__(self, context, pointer, size: int, block):
        # ManagedMemory.__init__'s attributes beyond MemoryPointer's (a CI test checks the list).
        PoolPointer.__init__(self, context, pointer, size, block)
        self.owned = None
        self._buflen_ = size
        self._bufptr_ = int(pointer)


class PooledPinnedMemory:
    """Mixin for a frontend's ``PinnedMemory`` (what ``cuda.pinned_array`` wraps in a NumPy
    array; ``mempin``, behind ``cuda.pinned()``, keeps Numba's own) for a block of numba_pool's
    host cache, calling ``release()`` (no arguments, must not raise) exactly once, when the
    object is collected; never while the interpreter exits (as :class:`PoolPointer`).

    ``PinnedMemory(..., finalizer=f)`` wraps ``f`` in ``weakref.finalize`` (1.7-1.9 µs on a lent
    H100's host, :class:`PoolPointer`'s reasons); Numba's ``PinnedMemory`` has no ``free()``, so
    collection is the only release.  A copy would share ``release`` and give the block back
    twice, so :meth:`__copy__` and :meth:`__deepcopy__` return the object itself: host memory
    is not duplicated by copying its pointer, as for Numba's own.

    :param context: the Numba context (a weak proxy, as Numba's ``memhostalloc`` passes).
    :param pointer: the host address (int).
    :param size: bytes requested.
    :param release: gives the block back to the host cache; called at most once.
    """

    _release = None  # until __init__ ran

    def __init__(self, context, pointer: int, size: int, release: Callable[[], None]):
        # PinnedMemory.__init__'s attributes, set here (a CI test checks the list stays the one
        # each frontend's PinnedMemory sets).  _buflen_/_bufptr_ serve the buffer protocol.
        self.context = context
        self.owned = None
        self.size = self._buflen_ = size
        self.host_pointer = self.handle = self._bufptr_ = pointer
        self.is_managed = True
        self._release = release

    def __copy__(self) -> PooledPinnedMemory:
        return self

    def __deepcopy__(self, memo) -> PooledPinnedMemory:
        return self

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        release = self._release
        if release is not None and not _finalizing():
            self._release = None
            release()


def data_address(array) -> int:
    """The device address of an array's first byte (CUDA Array Interface) or of a
    ``MemoryPointer``; for host memory (a pinned NumPy array, ``PinnedMemory``) its host
    address.

    :raises TypeError: for anything else, naming its type.
    """
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    pointer = getattr(array, "device_pointer_value", None)
    if pointer is not None:
        return int(pointer)
    interface = getattr(array, "__array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    pointer = getattr(array, "host_pointer", None)
    if pointer is not None:
        return int(pointer)
    raise TypeError(f"numba_pool: {type(array).__name__} is neither a device array, a pinned host array nor a MemoryPointer")
