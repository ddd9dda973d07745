"""A snapshot made without a GPU: a small program run by numba-pool's real allocator on the CUDA model the tests
use (this folder: CUDA's stream ordering and memory simulated, no driver), written in PyTorch's snapshot format for
``numba-pool-tools snapshot summarize``/``plot`` and PyTorch's viewer.  From the checkout, numba-pool
installed (no GPU, driver or test extra needed)::

    python tests/cuda_model/snapshot_demo.py snap.pickle

The program: four 1 MiB weights kept, eight 64 KiB temporaries of which half are dropped, and a scratch scope's
arrays (``numba_pool.scratch``); the pinned cache holds one staging buffer.  Exit status 2 for a bad path."""

from __future__ import annotations

import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the model's package

import numba_pool  # noqa: E402
from cuda_model.harness import Program  # noqa: E402
from numba_pool.config import ConfigError, parse_path  # noqa: E402
from numba_pool.observe import snapshot as snapshots  # noqa: E402
from numba_pool.plugin.debugging import snapshot_of  # noqa: E402


def load_weights(program) -> list:
    return [program.mm.memalloc(1 << 20) for _ in range(4)]


def run_step(program) -> list:
    temporaries = [program.mm.memalloc(64 << 10) for _ in range(8)]
    with numba_pool.scratch(16 << 10, manager=program.mm):
        temporaries += [program.mm.memalloc(4096), program.mm.memalloc(2048)]
    return temporaries[::2]  # the rest dropped


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/cuda_model/snapshot_demo.py SNAPSHOT.pickle", file=sys.stderr)
        return 2
    try:
        path = parse_path(argv[0], "snapshot_demo.py: SNAPSHOT", what="a snapshot (pickle)")
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    numba_pool.record_history()
    program = Program(arena=False, host=True)
    try:
        kept = load_weights(program) + run_step(program) + [program.mm.memhostalloc(256 << 10)]
        gc.collect()
        snapshot = snapshot_of([program.mm])
        del kept
    finally:
        program.close()
        numba_pool.record_history(False)
    snapshots.dump(snapshot, path)
    print(f"wrote {path}: a snapshot of a small program on the CUDA model")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
