"""Offline replay of an allocation log through the arena's bookkeeping, with no GPU.

Reads a log in RMM's logging format (what ``NUMBA_POOL_LOG`` writes, and what RMM's
``logging_resource_adaptor`` writes: pointers and streams in hex with or without ``0x``),
validates it, and replays it through :class:`numba_pool.arena.Arena` over an upstream that hands
out address ranges in host bookkeeping.  Requests above the arena's largest block are counted
as served by the mempool at their size rounded to 256 bytes.

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

from .alloclog import ACTIONS, HEADER
from .arena import ALIGNMENT, Arena, round_up

#: The fenced (legacy default) stream's key; stream 0 in a log means it too.
LEGACY_KEY = 1


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
    """An arena upstream for replay: slabs are address ranges (no memory behind them)."""

    def __init__(self):
        self.next_address = 1 << 40
        self.slabs = 0
        self.max_slabs = 0

    def allocate_slab(self, nbytes: int, stream) -> int:
        address = self.next_address
        self.next_address += (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        self.slabs += 1
        self.max_slabs = max(self.max_slabs, self.slabs)
        return address

    def free_slab(self, address: int, nbytes: int, stream) -> None:
        self.slabs -= 1

    def fence(self, stream) -> None:
        pass

    def order(self, earlier, later) -> None:
        pass

    def forget(self, stream) -> None:
        pass


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

    :param progress: called with the number of operations done, every 10,000.
    """
    space = AddressSpace()
    arena = Arena(space, slab_size=slab_size, max_block=max_block, fenced_stream=LEGACY_KEY,
                  release_threshold=release_threshold)
    where: dict[int, int] = {}  # logged pointer -> arena address (0 when served by the mempool)
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
                where[op.pointer] = 0
            else:
                where[op.pointer] = arena.allocate(op.size, op.stream)
        else:
            requested -= rounded
            address = where.pop(op.pointer)
            if address:
                arena.free(address, op.stream)
            else:
                large -= rounded
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
