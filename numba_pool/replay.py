"""Offline replay of an allocation log through the arena's bookkeeping, with no GPU.

Reads a log in RMM's logging format (what ``NUMBA_POOL_LOG`` writes, and what RMM's
``logging_resource_adaptor`` writes: pointers and streams in hex with or without ``0x``),
validates it, and replays it through the arena that runs on the GPU
(:class:`numba_pool.ordering.ArenaBlocks`: one domain per stream, quarantine and fences) over
:class:`AddressSpace`, a driver stand-in whose slabs are address ranges in host bookkeeping.
Requests above the arena's largest block are counted as served by the mempool at their size
rounded to 256 bytes.

Reported: operations, peak requested bytes (each request rounded to 256 B), peak reserved bytes
(arena slabs plus large requests), their ratio (fragmentation), the largest slab count, and the
replay speed.
"""

from __future__ import annotations

import csv
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

from cuda.bindings import driver as cuda_driver

from .alloclog import ACTIONS, HEADER
from .arena import round_up
from .ordering import ArenaBlocks, StreamWaits
from .stats import UsageTracker
from .streams import LEGACY, StreamRef, as_stream_ref

#: The legacy default stream's handle; stream 0 in a log means it too.
LEGACY_KEY = 1
_OK = (cuda_driver.CUresult.CUDA_SUCCESS,)


class LogError(ValueError):
    """A log line that cannot be replayed; the message names the line number and content."""


@dataclass(frozen=True)
class Operation:
    """One replayable line: ``action`` is ``allocate`` or ``free``; sizes in bytes."""

    line: int
    action: str
    pointer: int
    size: int
    stream: int


@dataclass
class ParsedLog:
    operations: list[Operation]
    skipped: Counter = field(default_factory=Counter)  # reason -> lines skipped
    failures: int = 0  # "allocate failure" lines (nothing to replay)


def _hex(text: str, what: str) -> int:
    text = text.strip()
    try:
        value = int(text, 16)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not hexadecimal") from None
    if value < 0:
        raise ValueError(f"{what} {text!r} is negative")
    return value


def _parse_row(row: list[str]) -> tuple[str, int, int, int]:
    if len(row) != len(HEADER):
        raise ValueError(f"expected {len(HEADER)} fields ({','.join(HEADER)}), found {len(row)}")
    _thread, _time, action, pointer, size, stream = (f.strip() for f in row)
    if action not in ACTIONS:
        raise ValueError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    try:
        nbytes = int(size)
    except ValueError:
        raise ValueError(f"size {size!r} is not a whole number of bytes") from None
    if nbytes < 0:
        raise ValueError(f"size {size!r} is negative")
    stream_key = _hex(stream, "stream")
    return action, _hex(pointer, "pointer"), nbytes, LEGACY_KEY if stream_key == 0 else stream_key


def parse_log(lines: Iterable[str], skip_bad_lines: bool = False, source: str = "log") -> ParsedLog:
    """Parse and validate a log.

    :param lines: the file's lines (an open file).
    :param skip_bad_lines: count bad lines by reason instead of raising.
    :raises LogError: naming ``source``, the line number and its content, for a missing header,
        a line that does not parse, a free of a pointer never allocated or already freed, or
        an allocation of a pointer that is still live.
    """
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or tuple(f.strip() for f in header) != HEADER:
        raise LogError(f"{source}: line 1: {','.join(header or [])!r}: expected the header {','.join(HEADER)}")
    parsed = ParsedLog([])
    live: dict[int, int] = {}
    freed: set[int] = set()

    def bad(line: int, row: list[str], reason: str, kind: str) -> None:
        if not skip_bad_lines:
            raise LogError(f"{source}: line {line}: {','.join(row)!r}: {reason}")
        parsed.skipped[kind] += 1

    for row in reader:
        line = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        try:
            action, pointer, size, stream = _parse_row(row)
        except ValueError as err:
            bad(line, row, str(err), "unparsable")
            continue
        if action == "allocate failure":
            parsed.failures += 1
        elif action == "allocate":
            if pointer in live:
                bad(line, row, f"allocation of {pointer:#x}, which is still allocated", "allocation of a live pointer")
                continue
            live[pointer] = size
            freed.discard(pointer)
            parsed.operations.append(Operation(line, action, pointer, size, stream))
        else:
            if pointer not in live:
                reason = "double free" if pointer in freed else "free of a pointer never allocated"
                bad(line, row, f"{reason} ({pointer:#x})", reason)
                continue
            # The free's own size field is informational: the allocation's size is what counts.
            parsed.operations.append(Operation(line, action, pointer, live.pop(pointer), stream))
            freed.add(pointer)
    return parsed


class AddressSpace:
    """A driver stand-in for replay (:mod:`numba_pool.driver`): slabs are address ranges with no
    memory behind them; events, waits and synchronizes do nothing, since a replay measures bytes,
    not time.  Counts the slabs held and their most."""

    CUdeviceptr = cuda_driver.CUdeviceptr

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

    def _nothing(self, *args):
        return _OK

    cuEventRecord = cuEventDestroy = cuStreamWaitEvent = cuCtxSynchronize = _nothing


@dataclass
class ReplayReport:
    """What a replay measured (bytes; ``seconds`` of wall time)."""

    operations: int
    allocations: int
    peak_requested: int
    peak_reserved: int
    max_slabs: int
    seconds: float
    skipped: Counter
    failures: int
    series: list[tuple[int, int, int]]  # (operation index, requested, reserved), sampled

    @property
    def fragmentation(self) -> float:
        """Peak reserved over peak requested; 1.0 is none."""
        return self.peak_reserved / self.peak_requested if self.peak_requested else 1.0

    @property
    def ops_per_second(self) -> float:
        return self.operations / self.seconds if self.seconds > 0 else float("inf")


def replay(log: ParsedLog, *, slab_size: int, max_block: int, release_threshold: int | None = None,
           progress: Callable[[int], None] | None = None, samples: int = 2000) -> ReplayReport:
    """Replay ``log`` through a fresh arena; see the module docstring for what is measured.

    :param slab_size: largest slab (bytes), as ``NUMBA_POOL_ARENA_SLAB_SIZE``.
    :param max_block: largest block the arena serves (bytes), as ``NUMBA_POOL_ARENA_MAX_BLOCK``.
    :param release_threshold: bytes of empty slabs kept; None keeps them all.
    :param progress: called with the number of operations done, every 10,000.
    :raises numba_pool.arena.ArenaError: for sizes that are not multiples of 256 bytes, or a
        largest block above the slab size.
    """
    space = AddressSpace()
    usage = UsageTracker()
    arena = ArenaBlocks(space, None, None, StreamWaits(space), usage, _never_out_of_memory,
                        slab_size=slab_size, max_block=max_block, release_threshold=release_threshold)
    streams: dict[int, StreamRef] = {LEGACY_KEY: LEGACY}
    live: dict[int, object] = {}  # logged pointer -> the arena's pointer (None when served by the mempool)
    requested = large = peak_requested = peak_reserved = 0
    every = max(1, len(log.operations) // samples)
    series = []
    start = time.perf_counter()
    for i, op in enumerate(log.operations):
        rounded = round_up(op.size)
        if op.action == "allocate":
            requested += rounded
            if rounded > max_block:
                large += rounded
                live[op.pointer] = None
            else:
                stream = streams.get(op.stream) or streams.setdefault(op.stream, as_stream_ref(op.stream))
                live[op.pointer] = (arena.allocate(op.size) if stream is LEGACY
                                    else arena.allocate_scoped(op.size, stream))
        else:
            requested -= rounded
            pointer = live.pop(op.pointer)
            if pointer is None:
                large -= rounded
            else:
                pointer.free()
        reserved = arena.reserved_bytes + large
        peak_requested = max(peak_requested, requested)
        peak_reserved = max(peak_reserved, reserved)
        if i % every == 0:
            series.append((i, requested, reserved))
        if progress is not None and i % 10_000 == 0 and i:
            progress(i)
    seconds = time.perf_counter() - start
    return ReplayReport(
        operations=len(log.operations), allocations=sum(op.action == "allocate" for op in log.operations),
        peak_requested=peak_requested, peak_reserved=peak_reserved, max_slabs=space.max_slabs,
        seconds=seconds, skipped=log.skipped, failures=log.failures, series=series)


def _never_out_of_memory(size: int, retry):
    raise AssertionError("an address space does not run out of memory")


def plot(report: ReplayReport, path: str, title: str) -> None:
    """Draw requested and reserved bytes over the replay (matplotlib, written to ``path``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [s[0] for s in report.series]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(ops, [s[2] / 2**20 for s in report.series], label="reserved (slabs + large blocks)")
    ax.plot(ops, [s[1] / 2**20 for s in report.series], label="requested (rounded to 256 B)")
    ax.set_xlabel("operation")
    ax.set_ylabel("MiB")
    ax.set_title(f"{title}: peak reserved / peak requested = {report.fragmentation:.3f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
