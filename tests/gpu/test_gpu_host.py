"""Pinned and mapped host memory from numba_pool's cache (``NUMBA_POOL_HOST=1``) on a real GPU.

Each test runs in a fresh interpreter with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool
NUMBA_POOL_HOST=1`` (Numba binds the memory manager per process), as tests/gpu/test_gpu_manager.py
does.  Skipped without a GPU.  ``pytest -m gpu -s tests/gpu/test_gpu_host.py`` also prints the
pinned_array allocate+free timings (informational).
"""

from __future__ import annotations

import pytest

from helpers import CUDA_IMPORT, run_json

pytestmark = pytest.mark.gpu

ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_POOL_HOST": "1"}

PRELUDE = f"""
import gc, json, time
import numpy as np
{CUDA_IMPORT}
import numba_pool
mm = cuda.current_context().memory_manager
assert type(mm).__name__ == "NumbaPoolManager" and mm.config.host, (type(mm), mm.config)

@cuda.jit
def add_one(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1

@cuda.jit
def spin_copy(src, dst, rounds):  # slow enough that a host-side reuse race would show
    i = cuda.grid(1)
    if i < src.size:
        v = src[i]
        for _ in range(rounds):
            v = (v * 3 + 1) % 1000003
        dst[i] = v * 0 + src[i]

def grid(n):
    return (n + 255) // 256, 256
"""


def test_pinned_and_mapped_arrays_hold_and_move_data():
    facts = run_json(PRELUDE + """
from numba_pool.cuda.frontend import for_tools
driver = for_tools().driver; MappedMemory, PinnedMemory = driver.MappedMemory, driver.PinnedMemory
s = cuda.stream()
n = 1 << 20
a = cuda.pinned_array(n, dtype=np.float32)
a[:] = np.arange(n, dtype=np.float32)
d = cuda.to_device(a, stream=s)
add_one[grid(n) + (s,)](d)
b = cuda.pinned_array(n, dtype=np.float32)
d.copy_to_host(b, stream=s)
s.synchronize()
ok_pinned = bool(np.array_equal(b, np.arange(n, dtype=np.float32) + 1))
m = cuda.mapped_array(n, dtype=np.int32)
m[:] = 5
add_one[grid(n)](m)
cuda.synchronize()
ok_mapped = bool((m == 6).all())
with cuda.pinned(np.zeros(16)):  # mempin keeps Numba's behaviour
    pass
st = numba_pool.stats()
print(json.dumps({"pinned": ok_pinned, "mapped": ok_mapped, "kinds": [type(a.base).__name__],
                  "host_in_use": st.host_in_use_bytes, "host_reserved": st.host_reserved_bytes}))
""", ENV)
    assert facts["pinned"] and facts["mapped"], facts
    assert facts["host_in_use"] >= 2 * 4 * (1 << 20) + 4 * (1 << 20), facts


def test_reuse_after_async_copy_never_corrupts():
    """Drop pinned buffer A while a slow copy into it is queued behind a kernel, allocate B of
    the same size and write it on the host at once: the copy's destination must hold the
    device data, B must hold what the host wrote (B is not A's block while the copy runs)."""
    facts = run_json(PRELUDE + """
n = 1 << 22
s = cuda.stream()
src = cuda.to_device(np.full(n, 7, dtype=np.int32))
dst = cuda.device_array(n, dtype=np.int32)
bad = 0
same = 0
for trial in range(20):
    a = cuda.pinned_array(n, dtype=np.int32)
    a_addr = a.ctypes.data
    spin_copy[grid(n) + (s,)](src, dst, 2000)
    dst.copy_to_host(a, stream=s)          # async into A, behind the slow kernel
    numba_pool.record_stream(a, s)
    del a; gc.collect()
    b = cuda.pinned_array(n, dtype=np.int32)
    same += b.ctypes.data == a_addr
    b[:] = -1                              # the host writes B at once
    s.synchronize()
    bad += int((b != -1).sum())            # the copy must not have landed in B
    del b; gc.collect()
print(json.dumps({"bad": bad, "reused_while_pending": same}))
""", ENV)
    assert facts["bad"] == 0, facts


def test_reuse_after_completion_hits_the_cache():
    # Released blocks are fenced by an allocation once 32 wait (Note [A release records nothing
    # on the legacy stream]); once the host has seen the fence complete they are reused.
    facts = run_json(PRELUDE + """
addresses = set()
for _ in range(40):
    a = cuda.pinned_array(4096, dtype=np.uint8); addresses.add(a.ctypes.data)
    del a; gc.collect()
cuda.synchronize()
b = cuda.pinned_array(4096, dtype=np.uint8)
print(json.dumps({"reused": b.ctypes.data in addresses, "blocks": len(addresses)}))
""", ENV)
    assert facts["reused"], facts
    assert facts["blocks"] < 40, facts  # blocks came back within the loop, after their fence


def test_host_out_of_memory_is_clear_and_pool_keeps_working():
    facts = run_json(PRELUDE + """
from numba_pool.cuda.frontend import for_tools; CudaAPIError = for_tools().CudaAPIError
a = cuda.pinned_array(1 << 20, dtype=np.uint8)
try:
    cuda.pinned_array(2 << 20, dtype=np.uint8)
    msg = None
except CudaAPIError as err:
    msg = str(err)
del a; gc.collect()
b = cuda.pinned_array(1 << 20, dtype=np.uint8); b[:] = 1
print(json.dumps({"msg": msg, "after": int(b.sum())}))
""", {**ENV, "NUMBA_POOL_HOST_MAX_SIZE": "2 MiB"})
    assert facts["msg"] and "out of pinned host memory allocating 2097152 bytes" in facts["msg"], facts
    assert "NUMBA_POOL_HOST_MAX_SIZE" in facts["msg"] and facts["after"] == 1 << 20, facts


def test_reset_releases_host_memory():
    facts = run_json(PRELUDE + """
for _ in range(4):
    x = cuda.pinned_array(1 << 20, dtype=np.uint8)
    del x
gc.collect()
before = numba_pool.stats().host_reserved_bytes
cuda.current_context().reset()
after = numba_pool.stats().host_reserved_bytes
y = cuda.pinned_array(1 << 20, dtype=np.uint8); y[:] = 2
print(json.dumps({"before": before, "after": after, "ok": int(y[0])}))
""", ENV)
    assert facts["before"] >= 1 << 20 and facts["after"] == 0 and facts["ok"] == 2, facts


def test_pinned_alloc_free_timing(capsys):
    facts = run_json(PRELUDE + """
out = {}
for label, n in (("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)):
    for _ in range(3):
        x = cuda.pinned_array(n, dtype=np.uint8); del x
    reps = 200 if n < (64 << 20) else 20
    t = time.perf_counter()
    for _ in range(reps):
        x = cuda.pinned_array(n, dtype=np.uint8); del x
    out[label] = (time.perf_counter() - t) / reps * 1e6
print(json.dumps(out))
""", ENV)
    with capsys.disabled():
        print("\npinned_array alloc+free with NUMBA_POOL_HOST=1 (µs): "
              + ", ".join(f"{k} {v:.1f}" for k, v in facts.items()))
