"""A multi-stream example (from CUDA's memory-pool tutorials), ``a[i] = v``: four streams each allocate an array, fill it
with their own value, copy it back and free it, all queued before one synchronize."""

from __future__ import annotations

import numpy as np

if not __package__:  # run as a file (python kernels/NAME.py): the checkout's top level holds the package
    import os
    import sys

    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import Kernel
from kernels._script import THREADS_PER_BLOCK, blocks_for, parse_args, report, run

#: The frontend's ``cuda`` in each frontend's copy of the kernel (Note [A kernel for each
#: frontend] in :mod:`kernels`); none is imported here.
cuda = None


@Kernel
def fill_kernel(a, v):
    """``a[i] = v`` for a 1-D device array ``a``."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = v


def main(argv=None, n_streams: int = 4) -> int:
    args = parse_args(__doc__, argv)
    cuda, kernel = args.frontend.cuda, fill_kernel.for_frontend(args.frontend)
    ok = True
    for i in range(args.iterations):
        n = args.n[i % len(args.n)]
        streams = [cuda.stream() for _ in range(n_streams)]
        outputs = [cuda.pinned_array(n, dtype=np.float32) for _ in streams]
        for k, (stream, out) in enumerate(zip(streams, outputs)):
            d = cuda.device_array(n, dtype=np.float32, stream=stream)
            kernel[blocks_for(n), THREADS_PER_BLOCK, stream](d, np.float32(k + 1))
            d.copy_to_host(out, stream=stream)
            del d  # freed while the copy may still be running: must be safe
        cuda.synchronize()
        ok &= all(bool((out == k + 1).all()) for k, out in enumerate(outputs))
    detail = f"{n_streams} streams x {','.join(map(str, args.n))} elements x {args.iterations}"
    return report("fill", ok, detail, args.summary, args.frontend, args.snapshot)


if __name__ == "__main__":
    raise SystemExit(run(main))
