"""Pointers handed to Numba, released from ``__del__``: :class:`PoolPointer` (device, a ``MemoryPointer``),
:class:`PooledPinnedMemory` (host cache, a ``PinnedMemory``), :class:`PooledManagedMemory` (a ``ManagedMemory``, also a
buffer): mixins, subclassed per frontend (``Frontend.derive``; ``isinstance(p, PoolPointer)`` holds for both).

Note [No weakref.finalize]
    Numba wraps a pointer's ``finalizer=`` in ``weakref.finalize`` (registry, weakref callback, atexit record), costlier
    than numba_pool's whole allocation path (docs/perf-notes.md); ``__del__`` runs at the same moment (last reference,
    or a collected cycle, PEP 442) for a fraction.  What finalize gave is covered: an early ``free()`` (one release,
    whichever comes first); running before module teardown at exit (``__del__`` releases nothing once the interpreter
    finalizes, ``sys.is_finalizing`` bound early; the memory goes with the context, as in cuda-python #973, CuPy #2809);
    one finalizer shared by copies (a plain copy would release ``_block`` twice: :meth:`PoolPointer.__copy__`,
    ``__deepcopy__`` return a non-owning view keeping the original alive, as ``MemoryPointer.view``)."""

from __future__ import annotations

import sys
from functools import partial
from typing import Callable


class PoolPointer:
    """Mixin for a frontend's ``MemoryPointer``: the EMM door of the core (:mod:`numba_pool.allocator.block`).
    Releases its block once, ``block.release(block)`` (must not raise), on :meth:`free` or collection.
    :param context: Numba's context (for its interface).  :param pointer: the device address (``CUdeviceptr``).
    :param size: bytes requested.  :param block: the block, or an adaptor's wrapper of it (:meth:`wrap_release`)."""

    _block = None  # until __init__ ran: __del__ of an object made by __new__ alone releases nothing
    captured = 0  #: Id of the capture whose graph allocated this memory (rule 13 of numba_pool.allocator), else 0.

    def __init__(self, context, pointer, size: int, block):
        self.context = context  # MemoryPointer's fields (Note [MemoryPointer's fields set directly]; CI-tested)
        self.device_pointer = self.handle = pointer
        self.size = self._cuda_memsize_ = size
        self.is_managed = True  # it owns its memory, as a MemoryPointer with a finalizer does
        self.refct = 1
        self._owner = None
        self._block = block

    @property
    def block(self):
        """The allocator's :class:`~numba_pool.allocator.block.Block` (None once released)."""
        block = self._block
        return block.block if type(block) is _Adapted else block

    def free(self) -> None:
        """Release now (``MemoryPointer.free``).  :raises RuntimeError: "Freeing dead memory" if already released."""
        block = self._block
        if block is None:
            raise RuntimeError("Freeing dead memory")
        self._block = None
        block.release(block)

    def wrap_release(self, adaptor: Callable[..., None], *args) -> None:
        """Releasing now calls ``adaptor(*args, release)``, which runs the former ``release`` after its part
        (:mod:`numba_pool.plugin.path`); Numba keeps the one pointer (Note [One pointer per allocation]).
        :raises RuntimeError: "Freeing dead memory" when already released."""
        block = self._block
        if block is None:
            raise RuntimeError("Freeing dead memory")
        self._block = _Adapted(block, partial(adaptor, *args, partial(block.release, block)))

    def __copy__(self):
        """A non-owning view of the whole allocation keeping this pointer alive (Note [No weakref.finalize])."""
        return self.view(0)

    def __deepcopy__(self, memo):
        """As :meth:`__copy__`: device memory is not duplicated by copying its pointer."""
        return self.view(0)

    def __del__(self, _finalizing=sys.is_finalizing) -> None:
        block = self._block
        if block is not None and not _finalizing():
            block.release(block)


class _Adapted:
    """A block an adaptor wraps (:meth:`PoolPointer.wrap_release`); releasing runs ``chain()``, adaptors first."""

    __slots__ = ("block", "chain")

    def __init__(self, block, chain: Callable[[], None]):
        self.block = block.block if type(block) is _Adapted else block
        self.chain = chain

    @staticmethod
    def release(adapted: "_Adapted") -> None:
        adapted.chain()


class PooledManagedMemory(PoolPointer):
    """A frontend's ``ManagedMemory`` mixin (a ``mviewbuf.MemAlloc`` buffer) for a managed cache block, else a
    :class:`PoolPointer`; one object, not Numba's two ``weakref.finalize`` (Note [No weakref.finalize])."""

    def __init__(self, context, pointer, size: int, block):
        PoolPointer.__init__(self, context, pointer, size, block)
        self.owned = None  # ManagedMemory.__init__'s attributes beyond MemoryPointer's (a CI test checks the list)
        self._buflen_ = size
        self._bufptr_ = int(pointer)


class PooledPinnedMemory:
    """A frontend's ``PinnedMemory`` mixin (``cuda.pinned_array``'s, not ``mempin``'s) for a host cache block: calls
    ``release()`` (must not raise) once at collection, not at exit (Note [No weakref.finalize]); no ``free()``.
    :param context: the Numba context (a weak proxy, as ``memhostalloc`` passes).  :param size: bytes requested.
    :param pointer: the host address (int).  :param release: gives the block back to the host cache."""

    _release = None  # until __init__ ran

    def __init__(self, context, pointer: int, size: int, release: Callable[[], None]):
        self.context = context  # PinnedMemory.__init__'s attributes (CI-checked); _buflen_/_bufptr_: buffer protocol
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
    """The address of an array's first byte (CUDA or NumPy array interface: pinned host memory) or of a
    ``MemoryPointer`` / ``PinnedMemory`` / cuda.core ``Buffer``.  :raises TypeError: otherwise, naming its type."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        data = interface.get("data") if isinstance(interface, dict) else None
        if not isinstance(data, tuple) or not data or not isinstance(data[0], int) or isinstance(data[0], bool):
            raise TypeError(f"numba_pool: {type(array).__name__}.__cuda_array_interface__ has data={data!r:.80}: "
                            "expected a (pointer, read_only) tuple")
        return data[0]
    pointer = getattr(array, "device_pointer_value", None)
    if pointer is not None:
        return int(pointer)
    if type(array).__module__.startswith("cuda.core") and hasattr(array, "memory_resource"):  # a cuda.core Buffer
        return int(array.handle)
    interface = getattr(array, "__array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    pointer = getattr(array, "host_pointer", None)
    if pointer is not None:
        return int(pointer)
    raise TypeError(f"numba_pool: {type(array).__name__} is neither a device array, a pinned host array, a MemoryPointer nor a cuda.core Buffer")
