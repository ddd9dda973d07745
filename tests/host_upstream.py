"""An arena upstream that hands out real host memory, so CI can test the arena for real."""

from __future__ import annotations

import ctypes

from numba_pool.arena import ALIGNMENT


class HostUpstream:
    """Slabs are ctypes buffers (aligned to 256 B); fences and orderings are recorded."""

    def __init__(self, limit_bytes: int | None = None):
        self.buffers: dict[int, ctypes.Array] = {}
        self.sizes: dict[int, int] = {}
        self.fences = 0
        self.orders: list[tuple] = []
        self.freed: list[tuple] = []
        self.forgotten: list = []
        self.limit_bytes = limit_bytes

    def allocate_slab(self, nbytes, stream):
        if self.limit_bytes is not None and sum(self.sizes.values()) + nbytes > self.limit_bytes:
            raise MemoryError(f"host upstream: {nbytes} bytes over the {self.limit_bytes}-byte limit")
        buf = ctypes.create_string_buffer(nbytes + ALIGNMENT)
        address = (ctypes.addressof(buf) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        self.buffers[address] = buf
        self.sizes[address] = nbytes
        return address

    def free_slab(self, address, nbytes, stream):
        assert self.sizes.pop(address) == nbytes
        del self.buffers[address]
        self.freed.append((address, nbytes, stream))

    def fence(self, stream):
        self.fences += 1

    def order(self, earlier, later):
        self.orders.append((earlier, later))

    def forget(self, stream):
        self.forgotten.append(stream)


def fill(address: int, nbytes: int, byte: int) -> None:
    ctypes.memset(address, byte, nbytes)


def holds(address: int, nbytes: int, byte: int) -> bool:
    return ctypes.string_at(address, nbytes) == bytes([byte]) * nbytes
