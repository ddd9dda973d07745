"""Replaying a parsed allocation log through the arena over an address space with no memory
behind it: peak requested and reserved bytes, their ratio, the slabs, the speed."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from cuda.bindings import driver as cuda_driver

from numba_pool.allocator.arena import ArenaBlocks
from numba_pool.allocator.free_list import round_up
from numba_pool.allocator.usage import UsageTracker
from numba_pool.allocator.waits import StreamWaits
from numba_pool.config import (ALIGNMENT, DEFAULT_ARENA_MAX_BLOCK, DEFAULT_ARENA_SLAB_SIZE, parse_release_threshold,
                      parse_size, release_limit)
from numba_pool.cuda.pointers import PoolPointer
from numba_pool.cuda.streams import LEGACY, StreamRef, as_stream_ref
from .log import ALLOCATE, LEGACY_KEY, PROGRESS_EVERY, LogError, ParsedLog, checked_path, read_log

_OK = (cuda_driver.CUresult.CUDA_SUCCESS,)


class AddressSpace:
    """A driver stand-in for replay (:mod:`numba_pool.cuda.driver`): slabs are address ranges with no
    memory behind them; events, waits and synchronizes do nothing, since a replay measures bytes,
    not time.  Counts the slabs held and their most."""

    CUdeviceptr = cuda_driver.CUdeviceptr
    CUstream_flags = cuda_driver.CUstream_flags

    def __init__(self):
        self.next_address = 1 << 40
        self.slabs = 0
        self.max_slabs = 0
        self._events = 0

    def cuMemAllocFromPoolAsync(self, nbytes: int, pool, stream):
        address = self.next_address
        self.next_address += round_up(nbytes)
        self.slabs += 1
        self.max_slabs = max(self.max_slabs, self.slabs)
        return _OK[0], cuda_driver.CUdeviceptr(address)

    def cuMemFreeAsync(self, ptr, stream):
        self.slabs -= 1
        return _OK

    def cuEventCreate(self, flags):
        self._events += 1
        return _OK[0], self._events

    def cuStreamGetId(self, stream):
        return _OK[0], int(stream)

    def cuStreamCreate(self, flags):
        return _OK[0], cuda_driver.CUstream(1)

    def cuThreadExchangeStreamCaptureMode(self, mode):
        return _OK[0], mode  # no capture in a replay: the mode (relaxed, for a slab's return) changes nothing

    def _nothing(self, *args):
        return _OK

    # Every event is complete at once: a fenced block is reused at the next allocation.
    cuEventRecord = cuEventDestroy = cuEventQuery = cuStreamQuery = cuStreamWaitEvent = cuCtxSynchronize = _nothing


@dataclass
class ReplayReport:
    """What a replay measured: bytes, and ``seconds`` of wall time for the replay alone
    (``read_seconds`` for reading the log)."""

    operations: int
    allocations: int
    peak_requested: int
    peak_reserved: int
    max_slabs: int
    seconds: float
    skipped: Counter
    failures: int
    series: list[tuple[int, int, int]]  # (operation index, requested, reserved), sampled
    source: str = "log"
    slab_size: int = DEFAULT_ARENA_SLAB_SIZE
    max_block: int = DEFAULT_ARENA_MAX_BLOCK
    release_threshold: int | None = None  # None: every empty slab kept
    read_seconds: float = 0.0

    @property
    def fragmentation(self) -> float:
        """Peak reserved over peak requested; 1.0 is none."""
        return self.peak_reserved / self.peak_requested if self.peak_requested else 1.0

    @property
    def ops_per_second(self) -> float:
        """Operations per second of the replay alone (inf for an instant one)."""
        return self.operations / self.seconds if self.seconds > 0 else float("inf")

    @property
    def end_to_end_ops_per_second(self) -> float:
        """Operations per second counting the reading and validation of the log too."""
        total = self.seconds + self.read_seconds
        return self.operations / total if total > 0 else float("inf")


def check_options(slab_size: int, max_block: int, release_threshold: int | None = None,
                  names: tuple[str, str, str] = ("slab_size", "max_block", "release_threshold")) -> None:
    """Check replay options before a long read.

    :param names: what to call the options in messages (the command line passes its flags).
    :raises ValueError: for a size that is not a whole number of bytes, a slab size or largest
        block that is not a positive multiple of 256 bytes, a largest block above the slab size,
        or a negative release threshold.
    """
    for name, value in zip(names, (slab_size, max_block)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}={value!r} is not a whole number of bytes")
        if value < ALIGNMENT or value % ALIGNMENT:
            down, up = value // ALIGNMENT * ALIGNMENT, (value // ALIGNMENT + 1) * ALIGNMENT
            nearest = f"{down} or {up}" if down > 0 else f"{ALIGNMENT}" if value < 0 else f"{up}"
            raise ValueError(f"{name}={value} bytes is not a positive multiple of {ALIGNMENT} bytes, the arena's "
                             f"block alignment: expected e.g. {nearest}")
    if max_block > slab_size:
        raise ValueError(f"{names[1]}={max_block} bytes ({_human(max_block)}) is above {names[0]}={slab_size} "
                         f"bytes ({_human(slab_size)}): a block must fit in a slab")
    if release_threshold is not None and (isinstance(release_threshold, bool) or not isinstance(release_threshold, int)
                                          or release_threshold < 0):
        raise ValueError(f"{names[2]}={release_threshold!r} is not a size in bytes (or None to keep every slab)")


def _size(value, name: str):
    """A size string parsed (the syntax of every entry point); anything else is left to
    :func:`check_options`, which names what is wrong with it."""
    return parse_size(value, name) if isinstance(value, str) else value


def _check_not_empty(log: ParsedLog) -> None:
    """:raises LogError: when ``log`` holds no operation, naming its source and why: a replay of
    nothing would report a ratio of 1.0 and 0 operations per second, as if all were well."""
    if len(log.operations):
        return
    why = [f"{count:,} skipped ({reason})" for reason, count in sorted(log.skipped.items())]
    if log.failures:
        why.append(f"{log.failures:,} allocate failure line{'s' * (log.failures != 1)}")
    if log.managed:
        why.append(f"{log.managed:,} managed memory line{'s' * (log.managed != 1)} (replay is of device memory)")
    if log.graph:
        why.append(f"{log.graph:,} graph memory line{'s' * (log.graph != 1)} (allocation nodes of CUDA graphs: "
                   "the graph's memory, not the pool's)")
    lines = "the header is its only line" if not why else "of its lines, " + ", ".join(why)
    raise LogError(f"{log.source}: nothing to replay: {lines}")


def _human(nbytes: int) -> str:
    import humanfriendly

    return humanfriendly.format_size(nbytes, binary=True)


def replay(log: ParsedLog | str | os.PathLike, *, slab_size: int | str = DEFAULT_ARENA_SLAB_SIZE,
           max_block: int | str = DEFAULT_ARENA_MAX_BLOCK, release_threshold: int | str | None = None,
           progress: Callable[[int], None] | None = None, samples: int = 2000) -> ReplayReport:
    """Replay a log through a fresh arena; see the module docstring for what is measured.

    :param log: a :class:`ParsedLog`, or a file path, read with :func:`read_log` first.
    :param slab_size: largest slab (bytes), as ``NUMBA_POOL_ARENA_SLAB_SIZE``: an int or a size
        string such as ``"4 MiB"``, in the syntax every entry point takes
        (:mod:`numba_pool.config.sizes`).
    :param max_block: largest block the arena serves (bytes), as ``NUMBA_POOL_ARENA_MAX_BLOCK``.
    :param release_threshold: bytes of empty slabs kept (a size, as above); None, ``"all"`` or
        :data:`numba_pool.config.KEEP_ALL` keeps them all.
    :param progress: called with the number of operations done, every 32,768 and at the end.
    :param samples: about how many (operation, requested, reserved) points :attr:`ReplayReport.series` keeps.
    :raises ValueError: as :func:`check_options`, naming the parameter (a size string that does
        not parse raises its subclass :class:`numba_pool.ConfigError`).
    :raises LogError: when the log has nothing to replay (no allocation or free left), naming
        its source and what was skipped; as :func:`read_log` when ``log`` is a path.
    :raises OSError: when ``log`` is a path, as :func:`read_log`.
    :raises TypeError: when ``log`` is neither a :class:`ParsedLog` nor a file path, naming it.
    """
    slab_size, max_block = (_size(value, name) for value, name in ((slab_size, "slab_size"), (max_block, "max_block")))
    release_threshold = release_limit(parse_release_threshold(release_threshold, "release_threshold"))
    check_options(slab_size, max_block, release_threshold)
    if not isinstance(log, ParsedLog):
        # Checked here, so that the message names replay's argument, not read_log's.
        log = read_log(checked_path(log, "replay: log", "a ParsedLog (read_log's) or a file path"))
    _check_not_empty(log)
    ops = log.operations
    space = AddressSpace()
    usage = UsageTracker()
    arena = ArenaBlocks(space, None, None, StreamWaits(space), usage, _never_out_of_memory,
                        slab_size=slab_size, max_block=max_block, release_threshold=release_threshold,
                        pointer=PoolPointer)  # the frontend-free mixin: nothing here reaches Numba
    allocate_legacy, allocate_scoped = arena.allocate, arena.allocate_scoped
    streams: dict[int, StreamRef] = {LEGACY_KEY: LEGACY}
    live: dict[int, object] = {}  # logged pointer -> the arena's pointer (None when served by the mempool)
    requested = large = peak_requested = peak_reserved = 0
    every = max(1, len(ops) // max(1, samples))
    series = []
    mask = PROGRESS_EVERY - 1
    start = time.perf_counter()
    for i, (action, pointer, size, stream) in enumerate(zip(ops.actions, ops.pointers, ops.sizes, ops.streams)):
        rounded = (size + 255) & -256 or 256  # arena.round_up, inline: this loop is the replay's cost
        if action == ALLOCATE:
            requested += rounded
            if rounded > max_block:
                large += rounded
                live[pointer] = None
            elif stream == LEGACY_KEY:
                live[pointer] = allocate_legacy(size)
            else:
                ref = streams.get(stream) or streams.setdefault(stream, as_stream_ref(stream))
                live[pointer] = allocate_scoped(size, ref)
            if requested > peak_requested:
                peak_requested = requested
        else:
            requested -= rounded
            block = live.pop(pointer)
            if block is None:
                large -= rounded
            else:
                block.free()
        reserved = arena.reserved_bytes + large
        if reserved > peak_reserved:
            peak_reserved = reserved
        if not i % every:
            series.append((i, requested, reserved))
        if progress is not None and not i & mask and i:
            progress(i)
    seconds = time.perf_counter() - start
    if progress is not None:
        progress(len(ops))
    return ReplayReport(
        operations=len(ops), allocations=log.allocations, peak_requested=peak_requested,
        peak_reserved=peak_reserved, max_slabs=space.max_slabs, seconds=seconds, skipped=log.skipped,
        failures=log.failures, series=series, source=log.source, slab_size=slab_size, max_block=max_block,
        release_threshold=release_threshold, read_seconds=log.seconds)


def _never_out_of_memory(size: int, retry):
    raise AssertionError("an address space does not run out of memory")
