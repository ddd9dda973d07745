"""SHIM (not part of commit 9059930): the new code's driver seam, for the OLD package.

The old modules do ``from cuda.bindings import driver as cu`` at import and manager.py binds
``_alloc_async = cu.cuMemAllocFromPoolAsync``, ``_free_async = cu.cuMemFreeAsync`` and
``_CUdeviceptr = cu.CUdeviceptr`` once.  :func:`use` swaps every one of those module globals for
the model (``model.CUdeviceptr`` and the other types/enums fall through ``CudaModel.__getattr__``
to cuda-python) and puts the originals back on exit.  No other old module binds from ``cu``
(streams.LEGACY is a real ``CUstream``; the model takes any handle through ``int()``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from cuda.bindings import driver as cuda_driver

import importlib

cu: Any = cuda_driver

# importlib, not ``from . import``: the package attribute ``scratch`` is the function, not the module.
manager, mempool, scratch, streams, noop = (importlib.import_module(f"{__package__}.{name}")
                                            for name in ("manager", "mempool", "scratch", "streams", "noop"))
_MODULES = (manager, mempool, scratch, streams, noop)
#: (module, global name, attribute of the driver object it is bound from)
_BOUND = ((manager, "_alloc_async", "cuMemAllocFromPoolAsync"),
          (manager, "_free_async", "cuMemFreeAsync"),
          (manager, "_CUdeviceptr", "CUdeviceptr"))


@contextlib.contextmanager
def use(driver: Any) -> Iterator[Any]:
    global cu
    saved = [(m, "cu", m.cu) for m in _MODULES] + [(m, name, getattr(m, name)) for m, name, _ in _BOUND]
    previous, cu = cu, driver
    for m in _MODULES:
        m.cu = driver
    for m, name, attr in _BOUND:
        setattr(m, name, getattr(driver, attr))
    try:
        yield driver
    finally:
        cu = previous
        for m, name, value in saved:
            setattr(m, name, value)
