"""The PyTorch door: :func:`torch_allocator`, a PyTorch pluggable CUDA allocator on numba_pool, for
``torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())`` before the first CUDA tensor, as
``rmm.allocators.torch`` gives RMM's.  PyTorch's tensors then come from the pool Numba's arrays use.

PyTorch's ``CUDAPluggableAllocator`` takes two C function pointers (``torch._C._cuda_customAllocator``):
``malloc(size, device, stream)`` and ``free(ptr, size, device, stream)``.  Here they take the GIL and call into
Python: the compiled module's C functions (:mod:`numba_pool.cuda._native`, which serve the legacy stream's
tensors from a free list in C, Note [PyTorch's legacy-stream free list]), else ``ctypes`` callbacks.  PyTorch frees
a tensor's memory naming its allocation stream: the release of rule 14 of :mod:`numba_pool.allocator`, ordered
there; work of another stream needs ``numba_pool.record_stream(tensor, stream)`` (PyTorch's ``Tensor.record_stream``
calls no pluggable allocator).
torch is imported at the first call only; it is an optional extra."""

from __future__ import annotations

import ctypes
import sys
import weakref
from functools import partial
from threading import get_ident

from ..cuda.capture import NOT_CAPTURING
from ..cuda.driver import NOT_CAPTURING_ANSWER, SUCCESS
from ..cuda.streams import LEGACY, LEGACY_HANDLES, StreamRef, as_stream_ref
from ..cuda.errors import CudaAPIError
from .serving import DoorTable, failed, recorded, release, serving_manager
from .state import process

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class TorchDoor:
    """The callbacks and the live blocks (a :class:`~.serving.DoorTable`) of the process's PyTorch allocator.

    Note [PyTorch's legacy-stream free list]
        PyTorch's caching allocator gives a block freed on a stream to the next request of its size on that
        stream, in C.  Through Python callbacks each tensor would cost about 2 µs more (docs/perf-notes.md, "The
        PyTorch door's free list"), so the compiled callbacks (:class:`numba_pool.cuda._native.TorchCallbacks`)
        do the same for the legacy stream, the stream PyTorch's default stream is (handles 0 and
        ``CU_STREAM_LEGACY``), without Python:
        - A block is *live* there when ``_malloc`` made it on the legacy stream with nothing recorded (no history,
          no log).  Its free naming the legacy stream keeps it, by (device, size), at most 8 per size and
          ``MAX_CACHED_BYTES`` (64 MiB) per device; the next ``malloc`` of that size on the legacy stream takes
          it.  The previous owner's work was queued on the legacy stream before the free, and the new owner's
          comes after: that stream's order is the release's, as in PyTorch's own pool; no stream waits, no driver
          call is made.  Its uses on other streams, blocking ones too, are the program's to order before the free
          or to record, as PyTorch's pool requires (rule 14; rule 4's fence, which covers blocking streams for
          Numba's arrays, is not taken).  The block stays allocated in the pool meanwhile, like PyTorch's
          reserved bytes.
        - Anything else reaches Python: another stream's blocks (their ordering needs the driver), a per-thread
          default stream's (it may be captured), a free naming another stream, a block a wait was added to since
          (``record_stream``, an IPC hold: the allocator's ``on_wait`` takes it out of the live blocks first; on a
          kept block, whose tensor PyTorch freed, it releases it and the wait is refused, as on any freed memory),
          and every block while a history records (:meth:`ProcessState.set_recording` switches the doors off
          before it starts, giving the kept ones back).
        - What is kept goes back through :meth:`_free` (rule 14, as if PyTorch freed it then) before every
          figure (``stats()``, ``memory_summary()``, ``get_memory_info()``, ``reset_peak()``), before a trim,
          a snapshot and an out-of-memory retry, and when the door is collected.  A reset, in every door and in
          one C step at its start and again at its end, gives the device's kept blocks back, forgets its live
          ones (their late frees reach the door's table, Note [An address a reset gave again]) and moves the
          device's generation on; in between nothing is kept, taken or entered for the device.  So no block of
          the generation it drops (another thread's ``_malloc`` it overtook, read the generation before) is kept.
          A device served by another manager forgets the first one's blocks, kept and live, the same way.
        - Blocks are taken off the tables into a C array before any Python object is made (a collection may run
          a tensor's free), and released after.
        - The statistics count every tensor: a reuse appends the previous owner's free and its allocation to the
          manager's usage events.  A kept block counts as in use until it is reused or given back (every figure
          gives it back first), so a peak may include kept bytes, at most the bound above.
        - The tables are C arrays guarded by the GIL: the callbacks take it, and none of their C code calls Python
          while a table is half changed."""

    def __init__(self, find_manager=serving_manager, free_list: bool = True):
        self._find_manager = find_manager  # ``(device, door) -> manager``: the device's serving one (the model's)
        self._blocks = DoorTable()
        self._last: StreamRef | None = None  # Note [A raw handle's stream]; replaced whole (atomic)
        self.callbacks = None  # the ctypes callbacks, where used: kept, PyTorch holds the bare function pointers
        self.allocator = None  # the torch allocator object, made once
        #: The compiled callbacks with the free list (Note [PyTorch's legacy-stream free list]), or None (no
        #: compiled module: ``ctypes``, and no free list).
        self.native = _native_callbacks(self, free_list)
        if self.native is not None:
            process.add_torch_door(self)
            self.native.switch(process.recording is None)

    def __del__(self):
        # A door collected (the CUDA model's; the process's lives on) gives its kept blocks back: its managers may not
        if getattr(self, "native", None) is not None:
            self.native.drain(free=self._free)  # the releases never raise (rule 8)

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

    def give_back(self, device: int = -1, usage=None) -> int:
        """Release the blocks the free list keeps for ``device`` (-1: every device; with ``usage``, a device whose
        blocks count in that ``UsageTracker``), as PyTorch's ``empty_cache``; returns how many."""
        return 0 if self.native is None else self.native.drain(device, usage)

    def forget(self, address: int) -> bool:
        """The block at ``address`` (its start) must not be kept when freed: it waits for another stream or a
        hold (``record_stream``, an IPC export).  True when it was kept (PyTorch had freed it): released now."""
        return self.native is not None and self.native.forget(address)

    def forget_device(self, device: int, pause: int = 0) -> None:
        """A reset of ``device`` (``pause`` 1 at its start, -1 at its end): what is kept there goes back, the live
        blocks' frees reach the door's table (Note [An address a reset gave again]), nothing is kept meanwhile."""
        if self.native is not None:
            self.native.forget_device(device, pause)

    def _malloc(self, size: int, device: int, stream) -> int | None:
        if size == 0:
            return None
        try:
            manager = self._find_manager(device, "numba_pool.torch_allocator")
            ref = LEGACY if not stream else self._stream(stream, *manager.stream_queries)
        except Exception as err:  # noqa: BLE001 - nothing may cross the C callback; PyTorch gets NULL
            return _say(err)
        native = self.native if ref is LEGACY else None  # Note [PyTorch's legacy-stream free list]
        try:
            generation = 0 if native is None else native.generation(device)  # before: a reset may overtake it
            block = manager.allocate_block(size, ref, ref is self._last)  # _last: _stream just found it not capturing
            record = None if process.recording is None and manager.log is None else recorded(manager, block, "torch")
            address, entry = block.start, (block, manager.allocator, record)
            held = self._blocks.setdefault(address, entry)
            if held is not entry:  # Note [An address a reset gave again]
                address, entry = self._blocks.enter_again(address, entry, held, partial(_entry, manager, size, ref))
            if native is not None and entry[2] is None and native.live(address, size, device, manager.usage,
                                                                       generation):
                manager.torch_free_lists.add(self)
        except Exception as err:  # noqa: BLE001 - as above
            if isinstance(err, CudaAPIError):  # out of memory: logged too
                failed(manager, "torch", size, ref)
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


class TorchFreeLists:
    """The PyTorch doors whose free lists may keep one manager's blocks (Note [PyTorch's legacy-stream free list]),
    which its figures, trims, resets and out-of-memory retries give back from: a weak set (a door collected gives
    its own back).  The manager's and its allocator's (``on_wait``), neither holding the other."""

    __slots__ = ("_doors", "_usage")

    def __init__(self, usage):
        self._doors = weakref.WeakSet()
        self._usage = usage  # the manager's UsageTracker: a door's blocks counting in it are the manager's

    def add(self, door: TorchDoor) -> None:
        """``door`` keeps this manager's blocks from now on (its first live block for it)."""
        self._doors.add(door)

    def give_back(self) -> None:
        """Release every block the doors keep for this manager."""
        if self._doors:
            for door in list(self._doors):
                door.give_back(-1, self._usage)

    def forget(self, address: int) -> bool:
        """The allocator's ``on_wait``: the block starting at ``address`` waits for another stream or a hold from
        now on, so no door may keep it.  True when a door kept it (its tensor freed): released now."""
        released = False
        if self._doors:
            for door in list(self._doors):
                released = door.forget(address) or released
        return released


def _native_callbacks(door: TorchDoor, free_list: bool):
    # The compiled module's callbacks over the door's Python ends (a weak reference), or None without it
    try:
        from ..cuda._native import TorchCallbacks
    except ImportError:
        return None
    return TorchCallbacks(free_list=free_list, owner=door)


def _entry(manager, size: int, ref: StreamRef) -> tuple:
    # Another allocation for Note [An address a reset gave again]: (address, DoorTable entry).  The lines of
    # ``TorchDoor._malloc`` again, which keeps them inline (Note [No frame between Numba and the source]).
    block = manager.allocate_block(size, ref)
    record = None if process.recording is None and manager.log is None else recorded(manager, block, "torch", 5)
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
