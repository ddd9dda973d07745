"""The kernels the bench launches, as Python functions for the bench's frontend's ``cuda.jit``
(:func:`numba_pool_tools.bench.timing.example_kernel` compiles them, into Numba's on-disk cache).

The same three as the checkout's ``kernels/`` scripts (``a[i] = v``, ``a[i] += 1``,
``a[i] = sqrt(i)``), kept here so that the bench's workers find them wherever they start: a
worker runs in a folder of its own choosing (:func:`numba_pool_tools.bench.launch.command`), where
the checkout's ``kernels`` package may not be importable.  ``cuda`` is a global of this module,
the bench's frontend's (:data:`numba_pool_tools.bench.core.cuda`): numba-cuda's CUDA simulator
runs a kernel by swapping the ``numba.cuda`` it finds among the function's globals.
"""

from __future__ import annotations

import math

from .core import cuda


def fill_kernel(a, v):
    """``a[i] = v`` for a 1-D device array ``a``."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = v


def increment_kernel(a):
    """``a[i] += 1`` for a 1-D float32/float64 device array ``a``."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = a[i] + 1.0


def sqrt_kernel(a):
    """``a[i] = sqrt(i)`` for a 1-D float32/float64 device array ``a``."""
    i = cuda.grid(1)
    if i < a.size:
        a[i] = math.sqrt(float(i))
