"""What the doors other than Numba's EMM plugin share (the cuda.core memory resources, the CuPy and PyTorch allocators):
the manager they allocate through (:func:`serving_manager`), a pinned or managed cache's block (:func:`cache_block`),
and their allocations in the history (:func:`recorded`, :func:`release`), tagged with the door's name as their kind
(``cuda.core``, ``cupy``, ``torch``), so that snapshots and the leak report show them beside Numba's."""

from __future__ import annotations

import weakref
from functools import partial
from typing import Callable

from ..allocator.waits import SeenHold
from ..cuda import frontend as frontends
from ..cuda.streams import LEGACY
from .state import process


def serving_manager(device_id: int, door: str):
    """The numba_pool manager serving device ``device_id`` (an ordinal): the one the doors used last while it
    lives (a weak reference: Numba dropping its context lets it go), else this process's, else that of
    Numba's context for it, made current for the device first; ``door`` names the caller in messages.
    :raises RuntimeError: Numba's memory manager on the device is not numba_pool's."""
    ref = process.door_managers.get(device_id)
    manager = ref() if ref is not None else None
    if manager is not None and manager.context is not None:
        return manager
    manager = _find(device_id, door)
    process.door_managers[device_id] = weakref.ref(manager)
    return manager


def _find(device_id: int, door: str):
    for manager in process.managers():
        if manager.context is not None and manager.device_id == device_id:
            return manager
    chosen = frontends.resolve(door)
    try:
        with chosen.cuda.gpus[device_id]:
            manager = chosen.cuda.current_context().memory_manager
    except chosen.CudaSupportError as err:
        raise frontends.no_gpu(err) from None
    if not hasattr(manager, "allocate_block"):
        raise RuntimeError(f"{door}: Numba's memory manager on device {device_id} is {type(manager).__name__}, not "
                           "numba_pool's: set NUMBA_CUDA_MEMORY_MANAGER=numba_pool or call numba_pool.install() before "
                           "Numba's first CUDA call")
    manager.initialize()
    return manager


def _log_kind(door: str) -> str | None:
    """Log Kind of ``door``'s rows (:data:`numba_pool.observe.alloclog.KINDS`), or None for pinned memory (unlogged)."""
    if door == "cuda.core managed":
        return "managed"
    return None if door == "cuda.core pinned" else door


def recorded(manager, block, door: str, skip: int = 3):
    """What the release of ``block``, allocated through ``door``, must observe: None when neither
    :func:`numba_pool.record_history` records nor ``NUMBA_POOL_LOG`` logs (two attribute loads), else ``((history,
    event) or None, log row or None)``, the allocation recorded (its stack from the door's caller: ``skip`` frames
    up, this one's and the door's included) and logged."""
    history, log = process.recording, manager.log  # the doors test both before calling: no frame when neither
    if history is None and log is None:
        return None
    event = None
    if history is not None:
        frames = history.capture(skip)  # above capture, recorded and the door's allocate: from its caller
        event = history, history.allocated(manager.device_id, block.address, block.size, block.stream.value, door,
                                           frames)
    kind = _log_kind(door)
    if log is None or kind is None:
        return event, None
    row = (block.address, block.size, block.stream.value, kind)
    log.allocate(*row)
    return event, (log, row)


def failed(manager, door: str, size: int, stream) -> None:
    """Log the ``allocate failure`` row of ``size`` bytes on ``stream`` (a ``StreamRef``) through ``door``, whose
    allocation raised an out-of-memory ``CudaAPIError`` (re-raised).  Never raises: a full disk must not hide it."""
    kind = _log_kind(door)
    if manager.log is not None and kind is not None:
        try:
            manager.log.failure(size, stream.value, kind)
        except Exception:  # noqa: BLE001 - the log's own error; the allocation's is the one to tell
            pass


def release(record, deallocate: Callable[..., None], *args) -> None:
    """Run ``deallocate(*args)`` (the block's release), logging its ``free`` row first and recording its ``free``
    event when its allocation was (``record``: :func:`recorded`'s).  Never raises (a finalizer)."""
    if record is None:
        deallocate(*args)
        return
    event, logged = record
    if logged is not None:
        log, row = logged
        log.free(*row)
    if event is None:
        deallocate(*args)
        return
    history, alloc = event
    history.release_recorded(None, alloc, partial(deallocate, *args))


class DoorTable(dict):
    """The live blocks of a door whose library frees by address alone (cuda.core's ``deallocate``, PyTorch's
    ``free``): address (int) -> ``(Block, what deallocates it, history record)``.  Single dict operations only
    (atomic under the GIL: the libraries free from any thread).  :attr:`aside`: address -> ``{id(entry): (entry,
    its SeenHold or None, the holder's stream)}``, an address's dict never removed (so a release never misses one
    being filled).

    Note [An address a reset gave again]
        A reset (rule 12) drops every block of its generation, a live tensor's or buffer's too; its library frees
        it later, by address, and the pool may meanwhile have given that address to a new block.  Found by
        address, that late free would release the new block under its new owner.  So a door never hands out an
        address its table still holds: finding it there (``setdefault``), it sets the block aside, never used, and
        allocates again (:meth:`enter_again`).  The holder's free releases what was set aside at its address after
        the stream that free names, else after the holder's allocation stream: the dangling holder's late work lands
        in it.  A block set aside on a stream A other than the legacy one is released at once, while A lives (the
        program may destroy A before the holder's free), and kept from reuse by a hold
        (:class:`~numba_pool.allocator.waits.SeenHold`, rule 2) until that free, then until the host sees that
        stream's work so far done after a fence; no stream waits for it
        (:meth:`~numba_pool.allocator.device.DeviceAllocator.let_go_after`).  The legacy stream's is released at
        the holder's free, after the stream it names (rule 14: the legacy stream's fence waits for it).  (A free
        racing the set-aside in another thread: after the holder's allocation stream.)  The dropped block's own
        release does nothing (rule 12).  A graph's block (rule 13) is not kept past its allocation call, whose
        capture must free it: it goes back when the call returns or fails.  Only device
        blocks are set aside: a host cache never gives a live block's address again (a reset leaves its live blocks
        allocated, rule 12).  The history and log record the set-aside block's free at the set-aside.  While a
        capture is under way the set-aside block's release, and the holder's let-go, are made beside it (Note
        [Released beside a capture] in :mod:`numba_pool.allocator.release`) where A is a created stream (the block
        a mempool one in both modes: an arena allocates none during a capture)."""

    __slots__ = ("aside",)

    def __init__(self):
        super().__init__()
        self.aside: dict[int, dict] = {}

    def enter_again(self, address: int, entry: tuple, held: tuple, allocate: Callable[[], tuple]) -> tuple:
        """For the door whose ``setdefault`` found ``address`` held by ``held`` (an entry from before a reset): set
        ``entry`` aside and ``allocate()`` (-> ``(address, entry)``) until an address is free, entered then;
        returns that ``(address, entry)``.
        :raises: what ``allocate`` raises (out of memory), the blocks set aside kept until their holders' frees."""
        in_capture = []
        try:
            while True:
                if getattr(entry[0], "capture", None) is not None:
                    in_capture.append(entry)
                else:
                    self._set_aside(address, entry, held[0].stream)
                address, entry = allocate()
                held = self.setdefault(address, entry)
                if held is entry:
                    return address, entry
        finally:
            for block, source, record in in_capture:  # their capture's free nodes
                release(record, source.deallocate, block, None)

    def _set_aside(self, address: int, entry: tuple, holders_stream) -> None:
        block, allocator, record = entry
        hold = None  # the legacy stream's block: released at the holder's free (that stream is never destroyed)
        if block.stream is not LEGACY and hasattr(allocator, "set_aside"):  # released now, while its stream lives
            hold = SeenHold(block.size)
            release(record, allocator.set_aside, block, hold)
        key = id(entry)  # unique while the entry is kept here
        self.aside.setdefault(address, {})[key] = (entry, hold, holders_stream)
        if address not in self:  # its holder freed it meanwhile (another thread): nothing else would release it
            self._release(address, key, None)

    def release_aside(self, address: int, stream) -> None:
        """Release the blocks set aside at ``address`` after ``stream``, the ``StreamRef`` the holder's free names
        (None: the holder's allocation stream).  Never raises."""
        for key in self.aside.get(address, {}).copy():  # dict.copy is atomic: other threads pop meanwhile
            self._release(address, key, stream)

    def _release(self, address: int, key: int, stream) -> None:
        taken = self.aside[address].pop(key, None)  # the one pop that wins releases
        if taken is not None:  # never used: after the stream named
            (block, allocator, record), hold, holders_stream = taken
            after = holders_stream if stream is None else stream
            if hold is not None:
                allocator.let_go_after(hold, after)
            else:
                release(record, allocator.deallocate, block, after)


def cache_block(cache, unavailable: str, size: int, stream, flags: int):
    """``(Block, cache)``: ``size`` bytes on ``stream`` (a ``StreamRef``) from a pinned or managed cache
    (``HostBlocks``), in the cache's owner context (``cuMemHostAlloc`` needs one; the caller may have none current).
    :raises RuntimeError: ``unavailable``, when the cache is off (None).
    :raises CudaAPIError: ``CUDA_ERROR_OUT_OF_MEMORY`` with the cache's sizes."""
    if cache is None:
        raise RuntimeError(unavailable)
    return cache.owner.call(cache.allocate_block, size, stream, flags), cache
