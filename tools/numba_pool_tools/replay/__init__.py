"""Offline replay of an allocation log through the arena's bookkeeping, with no GPU.

Reads a log in RMM's logging format (what ``NUMBA_POOL_LOG`` writes, and what RMM's
``logging_resource_adaptor`` writes: pointers and streams in hex with or without ``0x``),
validates it, and replays it through the arena that runs on the GPU
(:class:`numba_pool.allocator.arena.ArenaBlocks`: one domain per stream, quarantine and fences) over
:class:`AddressSpace`, a driver stand-in whose slabs are address ranges in host bookkeeping.
Requests above the arena's largest block are counted as served by the mempool at their size
rounded to 256 bytes.

Reported: operations, peak requested bytes (each request rounded to 256 B), peak reserved bytes
(arena slabs plus large requests), their ratio (fragmentation), the largest slab count, and the
speed of the replay alone and end to end (reading included).

The Python API (``numba-pool-tools replay`` is a thin layer over it)::

    from numba_pool_tools.replay import read_log, replay
    log = read_log("alloc.csv")                        # LogError for a bad line, OSError for I/O
    for slab in (1 << 20, 4 << 20):                    # a parsed log can be replayed many times
        report = replay(log, slab_size=slab, max_block=64 << 10)
        print(slab, report.peak_reserved, report.fragmentation)

    from numba_pool_tools.replay import plot                 # needs matplotlib (numba-pool-tools[plot])
    plot(report, "alloc.png")                          # leaves pyplot and its backend alone

Files may be plain or gzip-compressed, UTF-8 with or without a byte-order mark, with ``\\n`` or
``\\r\\n`` line ends.  A parsed log holds its operations in compact columns (about 33 bytes per
operation, less than the text they come from), plus one dictionary entry per distinct pointer
seen, for the validation.

Modules: :mod:`.log` (reading and validating a log), :mod:`.run` (the replay), :mod:`.figure`
(the picture, matplotlib).
"""


from __future__ import annotations

from .log import LogError, Operation, Operations, ParsedLog, parse_log, read_log
from .run import AddressSpace, ReplayReport, check_options, replay

__all__ = ["LogError", "Operation", "Operations", "ParsedLog", "ReplayReport", "AddressSpace",
           "read_log", "parse_log", "replay", "check_options", "plot"]


def plot(report: ReplayReport, path: str, title: str | None = None) -> str:
    """Draw requested and reserved bytes over the replay; see :func:`numba_pool_tools.replay.figure.plot`."""
    from .figure import plot as _plot  # matplotlib, an extra: imported when a figure is asked for

    return _plot(report, path, title=title)
