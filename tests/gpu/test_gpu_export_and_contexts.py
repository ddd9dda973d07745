"""Two stream-safety promises on a real GPU, with kernels that would see corruption
(``pytest -m gpu``, and ``NUMBA_POOL_ARENA=1``):

* **an IPC export is ordered before the importer**: the exporter's previous kernel sleeps, then
  writes its array; the array is dropped, its block reused by a new array that is exported at
  once, and a spawned importer writes the new array as soon as it opens it.  Without ordering,
  the old kernel's late write lands on the importer's data;
* **a release where another context of the device is current**: an array used by a sleeping
  kernel on a blocking stream is dropped in a thread where a context made with ``cuCtxCreate``
  is current, and that context is synchronized; a new array on a non-blocking stream is then
  written at once.  Freed on the other context's legacy stream, the block would be handed to
  the new array while the old kernel still sleeps, and its late write would land there.

Each test prints its figures (corrupted elements, whether the block was reused); each counted
every element corrupted on the code before the fix (a00ee0f)."""

from __future__ import annotations

import os

import pytest

from helpers import CUDA_IMPORT, run_json

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"}
KERNELS = f"""
import json, sys, threading, time
sys.path.insert(0, {os.path.join(TESTS, "ipc")!r}); sys.path.insert(0, {os.path.join(TESTS, "gpu")!r})
import numpy as np
{CUDA_IMPORT}
from cuda.bindings import driver as cu
import numba_pool
from gpu_helpers import blocks, non_blocking_stream
import faulthandler; faulthandler.dump_traceback_later(200, exit=True)
N = 8 << 20  # 32 MiB of float32: a mempool block in both modes
SLEEP_US = 300_000

@cuda.jit
def sleep_then_fill(a, sleep_us, value):
    for _ in range(sleep_us // 1000):
        cuda.nanosleep(1_000_000)
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, a.size, stride):
        a[i] = value

@cuda.jit
def fill(a, value):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, a.size, stride):
        a[i] = value

warm = cuda.device_array(1024, np.float32)
sleep_then_fill[4, 256](warm, 1000, 0.0); fill[4, 256](warm, 0.0); cuda.synchronize(); del warm
"""


def test_an_exported_reused_block_is_ordered_before_the_importer_writes():
    facts = run_json(KERNELS + """
import multiprocessing as mp, ipc_children
ctx = mp.get_context("spawn")
with ctx.Pool(1) as pool:
    pool.apply(ipc_children.warm_up)  # CUDA and the kernel compiled in the importer first
    a = cuda.device_array(N, np.float32)
    sleep_then_fill[64, 256](a, SLEEP_US, 1.0)  # the previous owner: sleeps, then writes 1
    old = a.device_ctypes_pointer.value
    del a  # legal: its kernel is on the legacy stream, where the block is freed
    b = cuda.device_array(N, np.float32)
    reused = b.device_ctypes_pointer.value == old
    t0 = time.perf_counter()
    handle = b.get_ipc_handle()
    export_ms = (time.perf_counter() - t0) * 1e3
    pool.apply(ipc_children.fill_at_once, (handle, 2.0))  # the producer fills what we exported
    cuda.synchronize()
    corrupted = int((b.copy_to_host() != 2.0).sum())
    del handle, b
print(json.dumps({"reused": reused, "corrupted": corrupted, "export_ms": export_ms}))
""", ENV)
    print(facts)
    assert facts["corrupted"] == 0, facts


@pytest.mark.parametrize("allocated_on", ["legacy", "stream"])
def test_a_release_where_another_context_of_the_device_is_current(allocated_on):
    # "legacy": the block is freed on the legacy stream, whose handle names the current
    # context's; "stream": inside using_stream(a non-blocking stream), freed on that stream's
    # own handle, which names it in any context.
    facts = run_json(KERNELS + f"ALLOCATED_ON = {allocated_on!r}\n" + """
dev = cu.CUdevice(0)
try:
    err, foreign = cu.cuCtxCreate(None, 0, dev)  # cuda-bindings 13: (params, flags, device)
except TypeError:
    err, foreign = cu.cuCtxCreate(0, dev)
assert not err, err
cu.cuCtxPopCurrent()  # made current here by cuCtxCreate; Numba's is current again
blocking = cuda.stream()  # ordered with the legacy stream, where the array's block is freed
own = cuda.external_stream(int(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]))
if ALLOCATED_ON == "legacy":
    a = cuda.device_array(N, np.float32)
    user = blocking
else:
    with numba_pool.using_stream(own):
        a = cuda.device_array(N, np.float32)
    user = own
sleep_then_fill[64, 256, user](a, SLEEP_US, 1.0)  # the previous owner: sleeps, then writes 1
old = a.device_ctypes_pointer.value
holder = [a]; del a

def drop_in_the_other_context():
    assert not cu.cuCtxPushCurrent(foreign)[0]
    holder.clear()  # the last reference goes here: legal, the kernel is on its allocation stream or a blocking one
    cu.cuCtxSynchronize()  # the other context's work only
    cu.cuCtxPopCurrent()

t = threading.Thread(target=drop_in_the_other_context); t.start(); t.join()
with non_blocking_stream() as s2:
    with numba_pool.using_stream(s2):
        b = cuda.device_array(N, np.float32)
    reused = b.device_ctypes_pointer.value == old
    fill[64, 256, s2](b, 2.0)
    cuda.synchronize()
    corrupted = int((b.copy_to_host() != 2.0).sum())
    del b
cu.cuCtxDestroy(foreign)
print(json.dumps({"reused": reused, "corrupted": corrupted}))
""", ENV)
    print(facts)
    assert facts["corrupted"] == 0, facts
