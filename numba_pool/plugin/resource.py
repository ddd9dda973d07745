"""The cuda.core door: :class:`MemoryResource`, a cuda.core ``MemoryResource`` on a device's numba_pool
allocator (rule 14 of :mod:`numba_pool.allocator`), and :class:`PinnedMemoryResource` and
:class:`ManagedMemoryResource` on its pinned and managed caches (rule 9).  :func:`install` puts the first on
the ``cuda.core.Device`` that Numba's context keeps, through which Numba's launches copy host arrays
(docs/architecture.md, "The doors").  cuda.core is imported with this module, first used on demand."""

from __future__ import annotations

import threading
import warnings
from functools import partial

from cuda.bindings import driver as _cu
from cuda.core import LEGACY_DEFAULT_STREAM, Buffer, Stream
from cuda.core import MemoryResource as _CoreResource

from ..allocator.host_blocks import PORTABLE
from ..cuda.streams import LEGACY, as_stream_ref
from ..config.values import byte_count, device_ordinal
from ..cuda.driver import OUT_OF_MEMORY
from ..cuda.errors import CudaAPIError
from .free_lists import KeepsFreedBlocks, may_keep
from .serving import DoorTable, cache_block, failed, recorded, release, serving_manager
from .state import process

_OFF = "numba_pool: no cache serves this memory resource: "  # the pinned and managed resources' errors


class MemoryResource(KeepsFreedBlocks, _CoreResource):
    """cuda.core's ``MemoryResource`` on numba_pool's pool (and arena) of a device: ``Buffer``s counted
    in ``numba_pool.stats()``, under ``NUMBA_POOL_MAX_SIZE`` and its out-of-memory retry.
    :param device_id: the device (None: the current context's, else 0).
    :param manager: the numba_pool manager (None: the one serving ``device_id``, at the first allocation).
    :raises TypeError: ``device_id`` not an int, or ``manager`` not a numba_pool manager.
    :raises ValueError: ``device_id`` not a device ordinal (0 <= ordinal < 2**31)."""

    def __init__(self, device_id: int | None = None, *, manager=None):
        call = f"numba_pool.{type(self).__name__}"
        if device_id is not None:
            device_id = device_ordinal(device_id, call, "device_id")
        if manager is not None and not hasattr(manager, "allocate_block"):
            raise TypeError(f"{call}: manager={manager!r:.80} is not a numba_pool manager (None: the device's)")
        self._device_id = manager.device_id if manager is not None else device_id
        self._manager = manager
        self._lock = threading.Lock()  # guards finding the manager
        self._blocks = DoorTable()  # the live Buffers' blocks, by address
        self._last = (None, LEGACY, LEGACY_DEFAULT_STREAM)  # Note [The last stream named]; replaced whole (atomic)
        if self._take is None:  # device memory: its legacy-stream buffers through a free list (native)
            self._keep_freed_blocks()

    def allocate(self, size: int, stream=None) -> Buffer:
        """A ``Buffer`` of ``size`` bytes for work on ``stream`` (cuda.core's, Numba's, any ``__cuda_stream__``
        object or handle; None: the legacy stream), stream-ordered (``cuMemAllocFromPoolAsync``).
        :raises ValueError: ``size`` not a positive int (bytes).  :raises RuntimeError: no GPU, or another manager.
        :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` after numba_pool's retry, with the pool's sizes."""
        if type(size) is not int or not 0 < size < 1 << 64:  # the common case checked inline: no frame
            size = byte_count(size, f"numba_pool.{type(self).__name__}.allocate", "size", positive=True)
        last = self._last
        if last[0] is not stream:
            last = _named(stream)
            if type(stream) is Stream and last[1].thread is None:
                self._last = last
        ref = last[1]
        manager = self._manager or self._manager_now()
        native = self.native
        if native is not None:  # Note [The doors' free lists]
            if ref is LEGACY:
                return self._buffer.from_handle(native.malloc(size, manager.device_id, 1), size, mr=self,
                                                stream=last[2])
            address = native.take(size, manager.device_id, ref.value) if ref.thread is None else 0
            if address:
                return self._buffer.from_handle(address, size, mr=self, stream=last[2])
            generation = native.generation(manager.device_id)  # before: a reset may overtake it
        take = self._take
        try:
            if take is None:  # device memory: the core's contract (DeviceAllocator.allocate's line), no frame between
                source = manager.allocator
                if source is None:  # before the manager's first allocation, or after a reset
                    block, source = manager.allocate_block(size, ref), manager.allocator
                else:
                    block = source.source.allocate_block(size, ref)
            else:
                block, source = take(size, ref, manager)
            address = block.start
            entry = (block, source, None if process.recording is None and manager.log is None
                     else recorded(manager, block, self._door))
            held = self._blocks.setdefault(address, entry)
            if held is not entry:  # Note [An address a reset gave again]
                address, entry = self._blocks.enter_again(address, entry, held,
                                                          partial(self._entry, manager, size, ref))
        except CudaAPIError as err:
            if err.code == OUT_OF_MEMORY:  # (the log's allocate failure rows)
                failed(manager, self._door, size, ref)
            raise
        if native is not None and entry[2] is None and ref.thread is None and may_keep(entry, True):
            manager.free_lists.add(self)  # among the free lists first
            native.live(address, size, manager.device_id, manager.usage, generation, manager.deferral, ref.value,
                        manager.stream_queries)
        return self._buffer.from_handle(address, size, mr=self, stream=last[2])

    def _malloc(self, size: int, device: int, stream: int) -> int:
        # The free list's Python end (a legacy-stream allocation it could not serve): the lines of ``allocate``
        # again, with the block entered live (Note [No frame between Numba and the source]).
        manager, native = self._manager, self.native
        try:
            generation = native.generation(device)  # before: a reset may overtake it
            block, source = manager.allocate_block(size, LEGACY), manager.allocator
            address = block.start
            entry = (block, source, None if process.recording is None and manager.log is None
                     else recorded(manager, block, self._door, 4))
            held = self._blocks.setdefault(address, entry)
            if held is not entry:  # Note [An address a reset gave again]
                address, entry = self._blocks.enter_again(address, entry, held,
                                                          partial(self._entry, manager, size, LEGACY, 6))
        except CudaAPIError as err:
            if err.code == OUT_OF_MEMORY:
                failed(manager, self._door, size, LEGACY)
            raise
        if entry[2] is None and may_keep(entry, False):  # (not graph memory)
            # among the manager's free lists first: a record_stream must find its entry
            manager.free_lists.add(self)
            native.live(address, size, device, manager.usage, generation, manager.deferral, 0,
                        manager.stream_queries)
        return address

    def _free(self, ptr: int, size: int, device: int, stream: int) -> None:
        # The free list's Python end: ``deallocate`` naming the legacy stream (1), or none (0: the allocation's), or
        # a kept block given back naming its own stream's handle.
        if stream > 1:
            self._deallocate(ptr, stream, stream, None)
        else:
            self._deallocate(ptr, LEGACY_DEFAULT_STREAM if stream else None, stream, None)

    def _entry(self, manager, size: int, ref, skip: int = 5) -> tuple:
        # Another allocation for Note [An address a reset gave again]: (address, DoorTable entry).  The lines of
        # ``allocate`` again, which keeps them inline (Note [No frame between Numba and the source]).
        take = self._take
        if take is None:
            block, source = manager.allocate_block(size, ref), manager.allocator
        else:
            block, source = take(size, ref, manager)
        record = (None if process.recording is None and manager.log is None
                  else recorded(manager, block, self._door, skip))
        return block.start, (block, source, record)

    _door = "cuda.core"  # the history's kind for this door's allocations
    #: ``(size, StreamRef, manager) -> (Block, what deallocates it)`` for the other caches; None: the device's pool.
    _take = None
    #: The ``Buffer`` type handed out: cuda.core's (the CUDA model's resource gives a stand-in: cuda.core's needs a driver).
    _buffer = Buffer

    def deallocate(self, ptr, size: int, stream=None) -> None:
        """Give back the buffer at ``ptr`` (``size`` bytes), ordered on ``stream`` (None: its allocation
        stream; rule 14).  Nothing for a buffer it does not hold (a zero-byte one)."""
        if type(ptr) is not int:
            ptr = _address(ptr, type(self).__name__)
        # cuda.core passes a new Stream per close: its hash is its handle (an int < 2**61, in C; a closed one's 0).
        # Anything but an open one is made a StreamRef first: one that is no stream, or closed, raises with the
        # table untouched.
        handle = hash(stream) if type(stream) is Stream else 0
        named = None if stream is None or handle else as_stream_ref(stream)
        native, manager = self.native, self._manager
        if native is not None and manager is not None and (stream is None or handle == 1 or named is LEGACY):
            # The legacy stream (cuda.core's, or Numba's default stream: its launches close their copies naming it),
            # or none (the allocation's): through the free list, Note [The doors' free lists]
            native.free(ptr, size, manager.device_id, 0 if stream is None else 1)
            return
        if native is not None and manager is not None:  # another stream's handle: kept if it is the buffer's own
            on = handle or (named.value if named.thread is None else 0)
            if on > 2 and native.give(ptr, size, manager.device_id, on):
                return
        self._deallocate(ptr, stream, handle, named)

    def _deallocate(self, ptr: int, stream, handle: int, named) -> None:
        # ``named``: ``stream``'s StreamRef where ``deallocate`` made it, else None.
        blocks = self._blocks
        held = blocks.pop(ptr, None)
        if held is None:
            return
        block, source, record = held  # source: the allocator, or the pinned or managed cache
        if self.native is not None:  # freed through Python: live no more (before the release, after which the
            self.native.forget(ptr)  # address may be another allocation's)
        ref = block.stream
        if stream is None or ref.thread is None and (stream is ref.owner or handle == ref.value):  # never 0
            named = None
        else:
            named = _named_at_free(stream, ref, named)
        if named is None and record is None:  # the common case without a frame: deallocate(block) on its stream
            block.release(block)
        elif record is None:
            source.deallocate(block, named)
        else:
            release(record, source.deallocate, block, named)
        aside = blocks.aside
        if aside and ptr in aside:  # Note [An address a reset gave again]
            blocks.release_aside(ptr, named)

    is_device_accessible, is_host_accessible = True, False  # cuda.core's properties: device memory

    @property
    def device_id(self) -> int:
        """The device ordinal (the current context's until the first allocation names it, else 0)."""
        return self._device_id if self._device_id is not None else _current_device()

    def _manager_now(self):
        manager = self._manager
        if manager is None:
            with self._lock:
                if self._manager is None:
                    self._manager = serving_manager(self.device_id, f"numba_pool.{type(self).__name__}")
                manager = self._manager
        return manager

    def __repr__(self) -> str:
        return f"numba_pool.{type(self).__name__}(device {self.device_id}, {len(self._blocks)} live buffers)"


class PinnedMemoryResource(MemoryResource):
    """cuda.core's ``MemoryResource`` on numba_pool's pinned cache of a device (``NUMBA_POOL_HOST=1``): page-locked
    host memory (``cuMemHostAlloc``, portable), reachable from the device through unified addressing, handed out
    again only once the host saw its last use finish (rule 9).  Parameters and errors: :class:`MemoryResource`'s;
    ``allocate`` raises ``RuntimeError`` when the pinned cache is off."""

    _door = "cuda.core pinned"
    is_host_accessible = True  # page-locked host memory

    def _take(self, size: int, ref, manager):
        return cache_block(manager.host, f"{_OFF}NUMBA_POOL_HOST is off", size, ref, PORTABLE)


class ManagedMemoryResource(PinnedMemoryResource):
    """cuda.core's ``MemoryResource`` on numba_pool's managed cache of a device (``cuMemAllocManaged`` blocks, rule 9):
    host and device reach it at one address.  ``allocate`` raises ``RuntimeError`` when numba_pool does not serve
    managed memory on the device (``NUMBA_POOL_MANAGED=0``, no concurrent managed access)."""

    _door = "cuda.core managed"

    def _take(self, size: int, ref, manager):
        return cache_block(manager.managed, f"{_OFF}{manager.managed_off_because}", size, ref, 0)


def _named(stream) -> tuple:
    """``(stream, its StreamRef, the stream the Buffer records)`` for ``allocate``'s ``stream``.

    Note [The last stream named]
        The resource keeps the last cuda.core ``Stream`` it was given (alive) with its ``StreamRef``, whose idle
        key (rule 7a) the allocator asks once: a program allocates on few streams.  Only such an object: an int or
        another library's object may name another stream after a destroy; a per-thread stream is one per thread.
        (One passed again after its ``close()``, or a ``from_handle`` one after its stream went: not diagnosed.)"""
    ref = LEGACY if stream is None else as_stream_ref(stream)
    return stream, ref, stream if isinstance(stream, Stream) else _core_stream(stream, ref)


def _core_stream(stream, ref):
    # The Buffer's deallocation stream for a stream not cuda.core's: a GraphBuilder as it is; for the legacy stream
    # cuda.core's shared LEGACY_DEFAULT_STREAM (not None: that records cuda.core's default stream, per-thread under
    # CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1; nor a Stream made per Buffer: 7-11 us); else one for the handle.
    if type(stream).__name__ == "GraphBuilder":
        return stream
    return LEGACY_DEFAULT_STREAM if ref is LEGACY else Stream.from_handle(ref.value)


def _named_at_free(stream, ref, named):
    # The StreamRef of ``deallocate``'s ``stream`` (``named``: made already, else None), or None where it names the
    # allocation's stream ``ref`` (a per-thread default stream: in the allocating thread only, Note [A raw handle's
    # stream] in .torch_allocator).
    if named is None:
        named = as_stream_ref(stream)  # an open cuda.core Stream: never raises
    return None if named.same_stream(ref) else named


def _current_device() -> int:
    try:  # no driver: cuda-pathfinder raises (a repr must not)
        err, device = _cu.cuCtxGetDevice()
    except Exception:  # noqa: BLE001 - the documented 0
        return 0
    return int(device) if err == _cu.CUresult.CUDA_SUCCESS else 0


def _address(ptr, name: str) -> int:
    # A pointer cuda.core passes (an int-like object); anything else is told in one line.
    try:
        return int(ptr)
    except (TypeError, ValueError):
        raise TypeError(f"numba_pool.{name}.deallocate: ptr={ptr!r:.80} is not a device address (an int)") from None


def install(manager) -> None:
    """A :class:`MemoryResource` on ``manager`` for the ``cuda.core.Device`` its Numba context keeps (none in
    the CUDA model or simulator); a failure warns: the EMM plugin works without this door."""
    device = getattr(getattr(manager.context, "device", None), "_dev", None)
    if device is None or not hasattr(type(device), "memory_resource"):
        return
    try:
        device.memory_resource = MemoryResource(manager=manager)
    except Exception as err:  # noqa: BLE001 - the EMM plugin works without this door
        warnings.warn(f"numba_pool: could not install its cuda.core memory resource on device "
                      f"{manager.device_id} ({err}); Numba's launches allocate from cuda.core's pool", stacklevel=2)
