"""The one place a device's allocation path is composed: Numba's ``memalloc(size)``, inside out (RMM-style adaptors)::

    recording adaptor     while numba_pool.record_history() is on                 (observe.history)
    counting adaptor      while a numba_pool.statistics() scope is open anywhere  (observe.scopes)
      logging adaptor     while NUMBA_POOL_LOG names a file                       (observe.alloclog)
        block source      the arena when it is on, else the mempool blocks        (allocator)

Numba's ``memallocmanaged(size, attach_global=True)`` runs them on the managed cache's source
(:class:`~.managed_memory.ManagedSource`; ``NUMBA_POOL_MANAGED``, concurrent managed access), logged as ``managed``.

The block source gives each pointer its release; an adaptor calls the layer below and prepends its part to that
pointer's release (Note [One pointer per allocation]).  No module patches another's objects; the manager binds the path
as its ``memalloc`` (Note [The path is the manager's memalloc] in :mod:`.manager`).  IPC leases are not in the path: an
export's *hold* is consulted only on the release's slow path (rule 2).  The path is recomposed as adaptors switch (first
statistics scope opened, last closed, history started or stopped: :meth:`.state.ProcessState.recompose`).  With none on,
it is the block source's own ``allocate`` (Note [No frame between Numba and the source])."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..allocator.device import DeviceAllocator
from ..cuda.pointers import PoolPointer
from ..observe.alloclog import AllocationLog, LoggedAllocations
from ..observe.history import History, RecordedAllocations
from ..observe.scopes import CountedAllocations


@dataclass(frozen=True)
class Path:
    """A composed path: ``allocate(size)`` (bytes -> pointer), the names of its layers, outermost first
    (``("counting", "log", "arena")``); ``allocate_managed(size)``: managed path, same adaptors (None: Numba's)."""

    allocate: Callable[[int], PoolPointer]
    layers: tuple[str, ...]
    allocate_managed: Callable[[int], PoolPointer] | None = None


@dataclass(frozen=True)
class Recording:
    """The recording adaptor's inputs: ``history``, ``device`` (ordinal), the manager's ``deferral``
    (``defer_cleanup``), ``device_free()`` (free bytes, for ``oom`` entries), ``on_oom(device, size, error)``."""

    history: History
    device: int
    deferral: object
    device_free: Callable[[], int]
    on_oom: Callable


def compose(allocator: DeviceAllocator, *, managed: Callable[[int], PoolPointer] | None = None,
            log: AllocationLog | None = None, counting: bool = False, recording: Recording | None = None) -> Path:
    """The allocation paths of ``allocator``'s device: its block source (and managed source ``managed``, if given),
    each in the logging, counting and recording adaptors, inside out, per ``log``, ``counting``, ``recording``."""
    layers = ["arena" if allocator.arenas else "mempool"]
    layers += ["log"] * (log is not None) + ["counting"] * counting + ["history"] * (recording is not None)
    arena_limit = max((arena.max_block for arena in allocator.arenas), default=-1)
    device = _adapt(allocator.source.allocate, "device", log, counting, recording, arena_limit)
    return Path(device, tuple(reversed(layers)),
                None if managed is None else _adapt(managed, "managed", log, counting, recording, -1))


def _adapt(allocate: Callable[[int], PoolPointer], kind: str, log: AllocationLog | None, counting: bool,
           recording: Recording | None, arena_limit: int):
    if log is not None:
        allocate = LoggedAllocations(allocate, log, kind).allocate
    if counting:
        allocate = CountedAllocations(allocate).allocate
    if recording is not None:
        allocate = RecordedAllocations(allocate, recording.history, recording.device, kind, arena_limit=arena_limit,
                                       deferral=recording.deferral, device_free=recording.device_free,
                                       on_oom=recording.on_oom, skip=1 if kind == "device" else 2).allocate
    return allocate
