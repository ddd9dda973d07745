"""The model's constants and helpers: result codes, the granule, stream handle constants, and
the call site of a model user (the first frame outside this package)."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from cuda.bindings import driver as _cu

_R = _cu.CUresult
SUCCESS = _R.CUDA_SUCCESS
_ATTR = _cu.CUmemPool_attribute
#: Ownership is tracked per granule of this many bytes (the pool's alignment).
GRANULE = 256
LEGACY_HANDLES = (0, int(_cu.CU_STREAM_LEGACY))
PER_THREAD_HANDLE = int(_cu.CU_STREAM_PER_THREAD)
_DRIVER_FUNCTION = re.compile(r"cu[A-Z]")
_HERE = os.path.dirname(os.path.abspath(__file__))
#: The model's own files: a call site is the nearest frame outside them (the harness and the
#: model's tests are users of the model).
_MODEL_FILES = frozenset(os.path.normcase(os.path.join(_HERE, name))
                         for name in ("__init__.py", "base.py", "ordering.py", "memory.py", "calls.py", "managed.py",
                                       "capture.py", "costs.py", "deadlock.py", "model.py"))


def _round_up(nbytes: int) -> int:
    return (nbytes + GRANULE - 1) // GRANULE * GRANULE


def _handle(x: Any) -> int:
    """A handle given as a cuda-python object or a plain int (None: 0)."""
    return 0 if x is None else int(x)


def _call_site() -> str:
    """``file:line function`` of the nearest frame outside the model's own files."""
    frame = sys._getframe(1)
    while frame is not None and os.path.normcase(os.path.abspath(frame.f_code.co_filename)) in _MODEL_FILES:
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    try:
        rel = os.path.relpath(name)
        name = rel if not rel.startswith("..") else name
    except ValueError:
        pass
    return f"{name}:{frame.f_lineno} {frame.f_code.co_name}"
