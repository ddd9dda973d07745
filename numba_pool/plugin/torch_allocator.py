"""The PyTorch door: :func:`torch_allocator`, a PyTorch pluggable CUDA allocator on numba_pool, for
``torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())`` before the first CUDA tensor, as
``rmm.allocators.torch`` gives RMM's.  PyTorch's tensors then come from the pool Numba's arrays use.

PyTorch's ``CUDAPluggableAllocator`` takes two C function pointers (``torch._C._cuda_customAllocator``):
``malloc(size, device, stream)`` and ``free(ptr, size, device, stream)``.  Here they take the GIL and call into
Python: the compiled module's C functions (:mod:`numba_pool.cuda._native`, which serve the legacy stream's
tensors from a free list in C, Note [The doors' free lists]), else ``ctypes`` callbacks.  PyTorch frees
a tensor's memory naming its allocation stream: the release of rule 14 of :mod:`numba_pool.allocator`, ordered
there; work of another stream needs ``numba_pool.record_stream(tensor, stream)`` (PyTorch's ``Tensor.record_stream``
calls no pluggable allocator).
torch is imported at the first call only; it is an optional extra."""

from __future__ import annotations

import ctypes
import sys
from functools import partial
from threading import get_ident

from ..cuda.capture import NOT_CAPTURING
from ..cuda.driver import NOT_CAPTURING_ANSWER, SUCCESS
from ..cuda.driver import OUT_OF_MEMORY as _OUT_OF_MEMORY
from ..cuda.streams import LEGACY, LEGACY_HANDLES, StreamRef, as_stream_ref
from ..cuda.errors import CudaAPIError
from .free_lists import KeepsFreedBlocks, may_keep
from .serving import DoorTable, failed, recorded, release, serving_manager
from .state import process

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class TorchDoor(KeepsFreedBlocks):
    """The callbacks and the live blocks (a :class:`~.serving.DoorTable`) of the process's PyTorch allocator.

    Its legacy-stream tensors go through the compiled free list of Note [The doors' free lists]
    (:mod:`.free_lists`), the C ends PyTorch's C functions call."""

    def __init__(self, find_manager=serving_manager, free_list: bool = True):
        self._find_manager = find_manager  # ``(device, door) -> manager``: the device's serving one (the model's)
        self._blocks = DoorTable()
        self._last: StreamRef | None = None  # Note [A raw handle's stream]; replaced whole (atomic)
        self.callbacks = None  # the ctypes callbacks, where used: kept, PyTorch holds the bare function pointers
        self.allocator = None  # the torch allocator object, made once
        self._keep_freed_blocks(free_list)  # ``native``: None without the compiled module (``ctypes``, no free list)

    _name = "numba_pool.torch_allocator"  # the door's name in its errors
    _kind = "torch"  # the history's kind for its allocations
    _skip = 3  # frames from ``recorded`` to the door's caller: ``_malloc``'s and its own (and the history's)

    _raises = False  # whether ``_malloc`` raises where it fails (else one line on standard error, and None)

    def malloc(self, size: int, device: int, stream: int) -> int | None:
        """PyTorch's ``malloc`` callback as PyTorch calls it (through the free list where there is one): an address,
        or None (a null pointer) when out of memory."""
        return self._malloc(size, device, stream) if self.native is None else self.native.malloc(size, device, stream)

    def free(self, ptr: int, size: int, device: int, stream: int) -> None:
        """PyTorch's ``free`` callback as PyTorch calls it (through the free list where there is one)."""
        if self.native is None:
            self._free(ptr, size, device, stream)
        else:
            self.native.free(ptr, size, device, stream)

    def _malloc(self, size: int, device: int, stream) -> int | None:
        if size == 0:
            return None
        try:
            manager = self._find_manager(device, self._name)
            queries = manager.stream_queries
            ref = LEGACY if not stream else self._stream(stream, queries[0], queries[1])
        except Exception as err:  # noqa: BLE001 - nothing may cross the C callback; PyTorch gets NULL
            if self._raises:
                raise  # (in this frame: a callee's would keep the error, its frames and their locals, in a cycle)
            return _say(err)
        native = self.native if ref.thread is None else None  # Note [The doors' free lists]
        try:
            generation = 0 if native is None else native.generation(device)  # before: a reset may overtake it
            block = manager.allocate_block(size, ref, ref is self._last)  # _last: _stream just found it not capturing
            record = None if process.recording is None and manager.log is None else recorded(manager, block, self._kind,
                                                                                              self._skip)
            address, entry = block.start, (block, manager.allocator, record)
            held = self._blocks.setdefault(address, entry)
            if held is not entry:  # Note [An address a reset gave again]
                again = partial(_entry, manager, size, ref, self._kind, self._skip + 2)
                address, entry = self._blocks.enter_again(address, entry, held, again)
            if native is not None and entry[2] is None and may_keep(entry, ref is not LEGACY):
                # among the free lists first: record_stream must find it
                manager.free_lists.add(self)
                native.live(address, size, device, manager.usage, generation, manager.deferral,
                            0 if ref is LEGACY else ref.value, queries)
        except Exception as err:  # noqa: BLE001 - as above
            if isinstance(err, CudaAPIError) and err.code == _OUT_OF_MEMORY:  # logged too
                failed(manager, self._kind, size, ref)
            if self._raises:
                raise
            return _say(err)
        return address

    def addresses(self) -> tuple[int, int]:
        """The callbacks' C addresses for ``torch._C._cuda_customAllocator``: the compiled module's, else ctypes'."""
        if self.native is not None:
            return self.native.install()
        if self.callbacks is None:  # made once: PyTorch may hold the first ones
            self.callbacks = _MALLOC(self._malloc), _FREE(self._free)
        return tuple(ctypes.cast(callback, ctypes.c_void_p).value for callback in self.callbacks)

    def _stream(self, handle: int, capture_status, stream_id) -> StreamRef:
        """Note [A raw handle's stream]
            PyTorch names a stream by its handle alone, which the driver gives again to a stream made after this
            one is destroyed.  The door keeps the last non-legacy stream's StreamRef with its driver id
            (``cuStreamGetId``, unique for the process's life) and takes it again only for the same handle and id:
            a capture query and an id query an allocation instead of a StreamRef and rule 7a's flags and id
            queries.  Never the id of a capturing stream (the query invalidates its capture, :mod:`.capture`): such
            a stream gets a StreamRef of its own.  So ``_last`` is only ever a StreamRef the capture query just
            found not capturing (never LEGACY), and the allocation passes that answer on (``not_capturing``) rather
            than ask again.  Another thread's per-thread default stream has another id; at a free, handle
            ``CU_STREAM_PER_THREAD`` names the allocation's stream in the allocating thread only, and another
            thread's stream elsewhere: the release waits for it (a release held back by a capture may run in the
            allocating thread, where the allocation's stream alone would order nothing of the freeing thread's)."""
        answer = capture_status(handle)
        if answer is not NOT_CAPTURING_ANSWER and (answer[0] != SUCCESS or answer[1] != NOT_CAPTURING):
            return as_stream_ref(handle)  # capturing (rule 13 routes it), or the driver won't say
        last = self._last
        if last is not None and handle == last.value:
            err, same = stream_id(last.handle)
            if err == SUCCESS and same == last.key:
                return last
        ref = as_stream_ref(handle)
        if ref is not LEGACY:
            err, ref.key = stream_id(ref.handle)
            if err == SUCCESS:
                self._last = ref
        return ref

    def _free(self, ptr, size: int, device: int, stream) -> None:
        blocks = self._blocks
        held = blocks.pop(ptr or 0, None)
        if held is not None:  # never raises
            block, allocator, record = held
            handle, ref = stream or 0, block.stream  # the same stream? per thread too (Note [A raw handle's stream])
            named = (None if (handle == ref.value and (ref.thread is None or ref.thread == get_ident()))
                     or (ref is LEGACY and handle in LEGACY_HANDLES) else as_stream_ref(handle))
            if record is None and named is None:  # the common case without a frame
                block.release(block)
            else:
                release(record, allocator.deallocate, block, named)
            aside = blocks.aside
            if aside and ptr in aside:  # Note [An address a reset gave again]
                blocks.release_aside(ptr, named)


def _entry(manager, size: int, ref: StreamRef, kind: str, skip: int) -> tuple:
    # Another allocation for Note [An address a reset gave again]: (address, DoorTable entry).  The lines of
    # ``TorchDoor._malloc`` again, which keeps them inline (Note [No frame between Numba and the source]).
    block = manager.allocate_block(size, ref)
    record = None if process.recording is None and manager.log is None else recorded(manager, block, kind, skip)
    return block.start, (block, manager.allocator, record)


def _say(err: Exception) -> None:
    # A failed allocation's one line on standard error; PyTorch gets NULL (None).
    print(f"numba_pool.torch_allocator: {err}", file=sys.stderr)


def torch_allocator():
    """The process's PyTorch allocator on numba_pool (one per process; PyTorch accepts it before its first CUDA
    allocation only): ``torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())``.
    :returns: a ``torch.cuda.memory._CUDAAllocator`` over ``torch._C._cuda_customAllocator``.
    :raises ImportError: torch is not installed (``pip install torch``).
    A failed allocation (out of memory: one line on standard error, with the pool's sizes) returns a null
    pointer to PyTorch, which its pluggable allocator does not check."""
    try:
        import torch
    except ImportError as err:
        raise ImportError(f"numba_pool.torch_allocator needs PyTorch, which is not importable here ({err})") from None
    door = process.torch_door
    if door is None:
        door = process.torch_door = TorchDoor()
    if door.allocator is None:
        made = torch._C._cuda_customAllocator(*door.addresses())
        door.allocator = torch.cuda.memory._CUDAAllocator(made)
    return door.allocator
