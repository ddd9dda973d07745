"""The compiled module's driver calls (Note [Compiled driver calls]) on a real GPU: once a manager starts, the hot
paths call them, and they answer as cuda-python's functions do, a capturing stream's status included (the
allocator's rule 13 and rule 7a turn on it).  Runs in a fresh interpreter under numba_pool.  Skipped without a GPU
or where the module is not built."""

from __future__ import annotations

import importlib.util
import os

import pytest

from helpers import run_json

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(importlib.util.find_spec("numba_pool.cuda._native") is None,
                                                   reason="the compiled module is not built here")]

PROGRAM = f"""
import json, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from cuda.bindings import driver as cu
from gpu_helpers import cuda
from numba_pool.cuda import driver, _native

cuda.current_context()
out = {{"in_use": driver.twins_in_use()}}
err, stream = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
err, side = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
out["idle"] = [_native.cuStreamIsCapturing(stream) == cu.cuStreamIsCapturing(stream),
               _native.cuStreamIsCapturing(stream)[1].name]
out["id"] = _native.cuStreamGetId(stream) == cu.cuStreamGetId(stream)
mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
assert cu.cuStreamBeginCapture(stream, mode)[0] == cu.CUresult.CUDA_SUCCESS
out["capturing"] = [_native.cuStreamIsCapturing(stream)[1].name, cu.cuStreamIsCapturing(stream)[1].name,
                    _native.cuStreamIsCapturing(side)[1].name]
err, graph = cu.cuStreamEndCapture(stream)
cu.cuGraphDestroy(graph)
err, pool = cu.cuDeviceGetDefaultMemPool(0)
err, pointer = cu.cuMemAllocFromPoolAsync(1 << 20, pool, side)
used = lambda: int(cu.cuMemPoolGetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)[1])
before = used()
out["free"] = [_native.cuMemFreeAsync(pointer, side)[0].name, before - (cu.cuStreamSynchronize(side), used())[1]]
print(json.dumps(out))
"""


def test_the_compiled_driver_calls_answer_as_cuda_python_capturing_or_not():
    out = run_json(PROGRAM, env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    assert out["in_use"] is True
    assert out["idle"] == [True, "CU_STREAM_CAPTURE_STATUS_NONE"] and out["id"] is True
    assert out["capturing"] == ["CU_STREAM_CAPTURE_STATUS_ACTIVE"] * 2 + ["CU_STREAM_CAPTURE_STATUS_NONE"]
    assert out["free"] == ["CUDA_SUCCESS", 1 << 20]

