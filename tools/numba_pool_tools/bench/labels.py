"""The names the benchmark gives its rows, figures and sizes: the lowest module of
:mod:`numba_pool_tools.bench`, imported by the others and importing none of them.

A row's label is its name in every table, the key of its figures in the JSON report and, for the
self-checks (:mod:`numba_pool_tools.bench.checks`), which floors it has.
"""

from __future__ import annotations

DEFAULT = "default"  # Numba's own memory manager
NUMBA_POOL = "numba_pool"  # numba_pool's mempool path
ARENA = "numba_pool arena"  # numba_pool with its sub-allocating arena
NOOP_FLOOR = "no-op floor"  # numba_pool_tools.bench.noop.NoopManager: Numba's cost plus weakref.finalize
REFERENCE = "Numba alone"  # numba_pool_tools.bench.noop.BareNoopManager: Numba's cost alone, the least any plugin costs
RMM_POOL = "rmm (pool)"
RMM_ASYNC = "rmm (cuda_async)"
CUPY = "cupy (pool)"
ANCHORS = (RMM_POOL, RMM_ASYNC, CUPY)  # the other plugins measured beside numba_pool (numba_pool_tools.bench.anchors)
WITH_FINALIZER = (DEFAULT, *ANCHORS)  # Numba wraps their finalizers in weakref.finalize
BASELINE_SUFFIX = " (baseline)"  # after a row of another installed numba_pool (--baseline)
PLAIN_SUFFIX = " (plain pool)"  # not exportable, no peer access: what IPC and peers cost
SEED_LOOP = "benchmark loop"  # the end-to-end figure of the tutorials' loop (seed_loop_ms in the JSON)
NEVER_RECORDED_SUFFIX = " (history never on)"  # a manager made after the history was switched on and off
HISTORY_DEPTHS = (5, 20, 50)  # the stack depths the allocation history's rows record (numba_pool_tools.bench.history_cost)
HISTORY_MARK = " + history"  # between a path's label and how its allocations are recorded


def history_label(path: str, depth: int | None) -> str:
    """The row of ``path`` (``numba_pool``, ``numba_pool arena``) through the allocation
    history's adaptor: with Python stacks at ``depth`` frames, ``'numba_pool arena + history,
    depth 20'``; without stacks (None), ``'numba_pool arena + history, no stacks'``."""
    return f"{path}{HISTORY_MARK}, " + ("no stacks" if depth is None else f"depth {depth}")


def is_history_row(label: str) -> bool:
    """Whether ``label`` is one of the allocation history's rows (a recorded path, or a path the
    history never touched), which the history's own table shows."""
    return HISTORY_MARK in label or label.endswith(NEVER_RECORDED_SUFFIX)


def size_label(nbytes: int) -> str:
    """A size in bytes as the tables show it: 256 -> ``'256 B'``, 65536 -> ``'64 KiB'``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def figure_label(figure: str) -> str:
    """``'65536'`` -> ``'64 KiB'``; other figures as they are."""
    return size_label(int(figure)) if figure.isdigit() else figure
