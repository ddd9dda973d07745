"""The CuPy and PyTorch doors (issue 35, items 3 and 4) on a real GPU: ``numba_pool.cupy_allocator``,
``numba_pool.cupy_pinned_allocator`` and ``numba_pool.torch_allocator`` give those libraries' arrays memory
of the pool Numba's arrays use, counted in ``numba_pool.stats()``, and a block another stream used is not
handed to a new owner before that stream's work finished, seen by a kernel that would count the corruption.

Each test runs in a fresh interpreter with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` (and the run's mode);
CuPy's and PyTorch's tests are skipped where the library is not installed.  Skipped without a GPU."""

from __future__ import annotations

import importlib.util
import os

import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu
ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"}
needs_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy is not installed")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")

PRELUDE = f"""
import gc, json, sys
import numpy as np
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from gpu_helpers import POISON, THREADS, blocks, cuda, read_after_delay
from kernels import fill_kernel
import numba_pool
"""


@needs_cupy
def test_cupy_arrays_come_from_the_pool_on_cupys_stream():
    facts = run_json(PRELUDE + """
import cupy
cupy.cuda.set_allocator(numba_pool.cupy_allocator)
before = numba_pool.stats().bytes_in_use
a = cupy.arange(1 << 20, dtype=cupy.float32)
during = numba_pool.stats().bytes_in_use - before
fill_kernel[blocks(1 << 20), THREADS](a, np.float32(5.0))  # a Numba kernel on the CuPy array
cuda.synchronize()
ok = bool((a == 5.0).all())
s = cupy.cuda.Stream(non_blocking=True)
with s:
    c = cupy.ones(1000, dtype=cupy.float64)
on_stream = c.data.mem._owner.block.stream.value == s.ptr
empty = cupy.empty(0).size == 0
del a, c
gc.collect()
s.synchronize()
print(json.dumps({"during": during, "ok": ok, "on_stream": on_stream, "empty": empty,
                  "after": numba_pool.stats().bytes_in_use - before}))
""", ENV)
    assert facts["during"] >= 4 << 20 and facts["ok"] and facts["on_stream"] and facts["empty"], facts
    assert facts["after"] == 0, facts


@needs_cupy
def test_a_cupy_block_used_on_another_stream_waits_for_it():
    # A CuPy array A on stream s1 is read on stream s2 by a slow kernel, dropped, and a new array of the
    # same size on s1 is written at once (POISON).  With numba_pool.record_stream(A, s2) the new owner waits
    # for s2 (the reader sees no POISON); without it (the planted bug: a use the allocator was not told of)
    # the reader sees the new owner's writes.
    facts = run_json(PRELUDE + """
import cupy
cupy.cuda.set_allocator(numba_pool.cupy_allocator)
s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
n = 1 << 16

def trial(record):
    wrong = cuda.to_device(np.zeros(1, dtype=np.int64))
    reused = 0
    for _ in range(8):
        with s1:
            a = cupy.full(n, 7.0, dtype=cupy.float32)
        s2.wait_event(s1.record())
        read_after_delay[32, THREADS, cuda.external_stream(s2.ptr)](a, POISON, 2000, wrong)
        if record:
            numba_pool.record_stream(a, s2)
        address = a.data.ptr
        del a
        with s1:
            b = cupy.full(n, POISON, dtype=cupy.float32)
        reused += b.data.ptr == address
        del b
    s1.synchronize(); s2.synchronize()
    return reused, int(wrong.copy_to_host()[0])

print(json.dumps({"recorded": trial(True), "planted": trial(False)}))
""", ENV)
    assert facts["recorded"][1] == 0, facts
    assert facts["planted"][0] > 0 and facts["planted"][1] > 0, facts  # the experiment sees a missed wait


@needs_cupy
def test_cupy_pinned_memory_comes_from_the_pinned_cache():
    facts = run_json(PRELUDE + """
import cupy
cupy.cuda.set_pinned_memory_allocator(numba_pool.cupy_pinned_allocator)
p = cupy.cuda.alloc_pinned_memory(1 << 20)
view = np.frombuffer(p, dtype=np.uint8, count=1 << 20)
view[:] = 3
in_use = numba_pool.stats().host_in_use_bytes
ok = int(view.sum()) == 3 << 20
del view, p  # (a CuPy copy from it would keep it on CuPy's watch list until CuPy's next pinned allocation)
gc.collect()
print(json.dumps({"in_use": in_use, "ok": ok, "after": numba_pool.stats().host_in_use_bytes}))
""", {**ENV, "NUMBA_POOL_HOST": "1"})
    assert facts["in_use"] == 1 << 20 and facts["ok"] and facts["after"] == 0, facts
    off = run_json(PRELUDE + """
import cupy
try:
    numba_pool.cupy_pinned_allocator(100)
    print(json.dumps({"error": None}))
except RuntimeError as err:
    print(json.dumps({"error": str(err)}))
""", {**ENV, "NUMBA_POOL_HOST": "0"})
    assert off["error"] and "pinned cache is off" in off["error"] and "\\n" not in off["error"], off


@needs_torch
def test_torch_tensors_come_from_the_pool():
    facts = run_json(PRELUDE + """
import torch
torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())
before = numba_pool.stats().bytes_in_use
t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
during = numba_pool.stats().bytes_in_use - before
fill_kernel[blocks(1 << 20), THREADS](cuda.as_cuda_array(t), np.float32(5.0))  # a Numba kernel on the tensor
cuda.synchronize()
ok = bool((t == 5.0).all())
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    u = torch.ones(1000, device="cuda")
    v = (u * 2).sum().item()
numba_pool.record_stream(t, s.cuda_stream)
del t, u
gc.collect()
torch.cuda.synchronize()
print(json.dumps({"during": during, "ok": ok, "v": v, "after": numba_pool.stats().bytes_in_use - before}))
""", ENV)
    assert facts["during"] >= 4 << 20 and facts["ok"] and facts["v"] == 2000.0, facts
    assert facts["after"] == 0, facts
