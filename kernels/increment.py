"""An increment kernel (from CUDA's memory-pool tutorials), ``a[i] = a[i] + 1.0``, as a script: each round copies a random
array in, increments it, copies it back and checks it; ``--keep K`` keeps the last K device
arrays alive, like a pipeline holding its recent results."""

from __future__ import annotations

import numpy as np

if not __package__:  # run as a file (python kernels/NAME.py): the checkout's top level holds the package
    import os
    import sys

    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import Kernel
from kernels._script import THREADS_PER_BLOCK, Window, blocks_for, parse_args, report, run

#: The frontend's ``cuda`` in each frontend's copy of the kernel (Note [A kernel for each
#: frontend] in :mod:`kernels`); none is imported here.
cuda = None


@Kernel
def increment_kernel(a):
    """``a[i] += 1`` for a 1-D float32/float64 device array ``a``."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = a[i] + 1.0


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    cuda, kernel = args.frontend.cuda, increment_kernel.for_frontend(args.frontend)
    rng = np.random.default_rng(0)
    window = Window(args.keep)
    ok = True
    for i in range(args.iterations):
        n = args.n[i % len(args.n)]
        host = rng.random(n, dtype=np.float32)
        d = cuda.to_device(host)  # a new device array each round: exercises allocate and free
        kernel[blocks_for(n), THREADS_PER_BLOCK](d)
        ok &= bool(np.array_equal(d.copy_to_host(), host + np.float32(1.0)))
        window.add(d)
        del d
    sizes = ",".join(map(str, args.n))
    detail = f"{sizes} elements x {args.iterations}, keeping {args.keep}"
    return report("increment", ok, detail, args.summary, args.frontend, args.snapshot)


if __name__ == "__main__":
    raise SystemExit(run(main))
