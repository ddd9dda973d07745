"""A stream-ordered allocation example (from CUDA's memory-pool tutorials),
``a[i] = sqrt(float(i))``, as a script: each round allocates a float32 array, fills it on the
device, copies it back, checks and frees it."""

from __future__ import annotations

import math

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
def sqrt_kernel(a):
    """``a[i] = sqrt(i)`` for a 1-D float32/float64 device array ``a``."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = math.sqrt(float(i))


def main(argv=None) -> int:
    args = parse_args(__doc__, argv)
    cuda, kernel = args.frontend.cuda, sqrt_kernel.for_frontend(args.frontend)
    ok = True
    window = Window(args.keep)
    for i in range(args.iterations):
        n = args.n[i % len(args.n)]
        expected = np.sqrt(np.arange(n, dtype=np.float64)).astype(np.float32)
        d = cuda.device_array(n, dtype=np.float32)
        kernel[blocks_for(n), THREADS_PER_BLOCK](d)
        ok &= bool(np.allclose(d.copy_to_host(), expected, rtol=1e-6))
        window.add(d)
        del d
    detail = f"{','.join(map(str, args.n))} elements x {args.iterations}"
    return report("sqrt", ok, detail, args.summary, args.frontend, args.snapshot)


if __name__ == "__main__":
    raise SystemExit(run(main))
