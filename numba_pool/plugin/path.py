"""The one place a device's allocation path is composed.

What Numba's ``memalloc(size)`` runs, inside out (RMM's resource adaptors, stacked)::

    counting adaptor      while a numba_pool.statistics() scope is open anywhere  (observe.scopes)
      logging adaptor     while NUMBA_POOL_LOG names a file                       (observe.alloclog)
        block source      the arena when it is on, else the mempool blocks        (allocator)

The block source allocates and gives each pointer its release.  An adaptor calls the layer below
and hands Numba a pointer of its own, which takes over the release of the pointer below
(``PoolPointer.take_release``: one owner, one release): its release does the adaptor's part (a
log row, the scopes' counts), then releases.  No module patches another's objects; the manager
binds the composed path as its own ``memalloc`` (Note [The path is the manager's memalloc] in
:mod:`numba_pool.plugin.manager`).

IPC leases are not in the path: an export registers a *hold* on its block with the device
allocator (:meth:`~numba_pool.allocator.device.DeviceAllocator.hold`), which the release
consults on its slow path only (rule 2), so allocations pay nothing for them.

The path is composed when a manager initializes, and composed again when an adaptor is switched
on or off: the first statistics scope opening or the last closing
(:func:`numba_pool.observe.scopes.on_counting_changed`).  With no adaptor on, the path is the
block source's own ``allocate``: every layer is a Python call, and one between Numba and the
source cost 0.25 µs per allocation (``numba-pool bench --part allocator``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..allocator.device import DeviceAllocator
from ..cuda.pointers import PoolPointer
from ..observe.alloclog import AllocationLog, LoggedAllocations
from ..observe.scopes import CountedAllocations


@dataclass(frozen=True)
class Path:
    """A composed allocation path: ``allocate(size)`` (bytes -> pointer) and the names of its
    layers, outermost first (``("counting", "log", "arena")``)."""

    allocate: Callable[[int], PoolPointer]
    layers: tuple[str, ...]


def compose(allocator: DeviceAllocator, *, log: AllocationLog | None = None, counting: bool = False) -> Path:
    """The allocation path of ``allocator``'s device: its block source, wrapped by the logging
    adaptor when ``log`` is given, then by the counting adaptor when ``counting``."""
    allocate = allocator.source.allocate
    layers = ["arena" if allocator.arena is not None else "mempool"]
    if log is not None:
        allocate = LoggedAllocations(allocate, log).allocate
        layers.append("log")
    if counting:
        allocate = CountedAllocations(allocate).allocate
        layers.append("counting")
    return Path(allocate, tuple(reversed(layers)))
