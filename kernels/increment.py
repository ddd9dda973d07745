"""The seeds' increment kernel, ``a[i] = a[i] + 1.0``, as a script: copy an array in, increment
it ``--iterations`` times in fresh device arrays, copy back and check."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ._script import THREADS_PER_BLOCK, blocks_for, parse_args, report


@cuda.jit
def increment_kernel(a):
    """``a[i] += 1`` for a 1-D float32/float64 device array ``a``."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = a[i] + 1.0


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    host = np.random.default_rng(0).random(args.n, dtype=np.float32)
    expected = host.copy()
    for _ in range(args.iterations):
        d = cuda.to_device(host)  # a new device array each round: exercises allocate and free
        increment_kernel[blocks_for(args.n), THREADS_PER_BLOCK](d)
        host = d.copy_to_host()
        expected += np.float32(1.0)
    return report("increment", bool(np.array_equal(host, expected)), f"{args.n} elements x {args.iterations}")


if __name__ == "__main__":
    raise SystemExit(main())
