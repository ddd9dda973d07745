"""Example kernels (from CUDA's memory-pool tutorials) as Numba CUDA kernels, each also a
small script: ``python -m numba_pool.kernels.increment`` (from an install or a checkout alike).

Every script is plain Numba: run it with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` to use the
plugin, without it for Numba's default manager.
"""

import importlib

# kernel -> module; distinct names, so that a kernel is never shadowed by its module.
_KERNELS = {"fill_kernel": "fill", "increment_kernel": "increment", "sqrt_kernel": "sqrt"}
__all__ = list(_KERNELS)


def __getattr__(name):
    # Imported on first use, so that `python -m numba_pool.kernels.sqrt` does not find its own
    # module already imported by the package (runpy warns about that).
    if name in _KERNELS:
        return getattr(importlib.import_module(f".{_KERNELS[name]}", __name__), name)
    raise AttributeError(name)
