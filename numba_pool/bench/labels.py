"""The names the benchmark gives its rows, figures and sizes: the lowest module of
:mod:`numba_pool.bench`, imported by the others and importing none of them.

A row's label is its name in every table, the key of its figures in the JSON report and, for the
self-checks (:mod:`numba_pool.bench.checks`), which floors it has.
"""

from __future__ import annotations

DEFAULT = "default"  # Numba's own memory manager
NUMBA_POOL = "numba_pool"  # numba_pool's mempool path
ARENA = "numba_pool arena"  # numba_pool with its sub-allocating arena
NOOP_FLOOR = "no-op floor"  # numba_pool.bench.noop.NoopManager: Numba's cost plus weakref.finalize
REFERENCE = "Numba alone"  # numba_pool.bench.noop.BareNoopManager: Numba's cost alone, the least any plugin costs
RMM_POOL = "rmm (pool)"
RMM_ASYNC = "rmm (cuda_async)"
CUPY = "cupy (pool)"
ANCHORS = (RMM_POOL, RMM_ASYNC, CUPY)  # the other plugins measured beside numba_pool (numba_pool.bench.anchors)
WITH_FINALIZER = (DEFAULT, *ANCHORS)  # Numba wraps their finalizers in weakref.finalize
BASELINE_SUFFIX = " (baseline)"  # after a row of another installed numba_pool (--baseline)
PLAIN_SUFFIX = " (plain pool)"  # not exportable, no peer access: what IPC and peers cost
SEED_LOOP = "benchmark loop"  # the end-to-end figure of the tutorials' loop (seed_loop_ms in the JSON)


def size_label(nbytes: int) -> str:
    """A size in bytes as the tables show it: 256 -> ``'256 B'``, 65536 -> ``'64 KiB'``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def figure_label(figure: str) -> str:
    """``'65536'`` -> ``'64 KiB'``; other figures as they are."""
    return size_label(int(figure)) if figure.isdigit() else figure
