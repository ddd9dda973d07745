"""Managed (unified) memory from numba_pool's managed cache (``NUMBA_POOL_MANAGED``, on by
default) on a real GPU.

Each test runs in a fresh interpreter with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` (Numba binds
the memory manager per process), in whichever mode the run is in (``NUMBA_POOL_ARENA``).
Every size stays far below the card's memory: managed memory asked for beyond what the card
has free can hang the GPU.  Skipped without a GPU.
"""

from __future__ import annotations

import pytest

from helpers import CUDA_IMPORT, run_json

pytestmark = pytest.mark.gpu

ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"}

PRELUDE = f"""
import gc, json, time
import numpy as np
from cuda.bindings import driver as cu
{CUDA_IMPORT}
import numba_pool
from numba_pool.cuda.pointers import PooledManagedMemory
mm = cuda.current_context().memory_manager

@cuda.jit
def add_one(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1

@cuda.jit
def sleep_then_count(a, expected, delay_us, wrong):
    # Sleep, then count the elements that are not what the array's owner wrote: a new owner
    # that the host writes meanwhile would show here.  A small grid-stride grid.
    for _ in range(delay_us):
        cuda.nanosleep(1000)
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, a.size, stride):
        if a[i] != expected:
            cuda.atomic.add(wrong, 0, 1)

def grid(n):
    return (n + 255) // 256, 256

def pool_of(address):
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
    err, handle = cu.cuPointerGetAttribute(attr, address)
    return int(handle) if err == 0 else 0
"""

#: The host-rule experiment: a kernel spins on managed array A (on ``stream``), A is dropped
#: while it runs, and a new array B of the same size is written by the host at once.
EXPERIMENT = """
def experiment(trials, where, delay_us=500, n=1 << 16):
    # Returns (allocations of B at an address an earlier array had, B at the very address of the
    # A whose kernel still ran, elements the kernels saw wrong).
    wrong = cuda.to_device(np.zeros(1, dtype=np.int64))
    s = {"legacy": 0, "blocking": cuda.stream(), "scoped": cuda.external_stream(int(cu.cuStreamCreate(1)[1]))}[where]
    seen, reused, same = set(), 0, 0
    for trial in range(trials):
        value = np.float32(trial + 1)
        with numba_pool.using_stream(s) if where == "scoped" else _nothing():
            a = cuda.managed_array(n, dtype=np.float32)
            a[:] = value
            sleep_then_count[(32, 256) + ((s,) if s else ())](a, value, delay_us, wrong)
            address = a.ctypes.data
            seen.add(address)
            del a
            b = cuda.managed_array(n, dtype=np.float32)
            b[:] = -1.0  # the host writes the new owner's block at once
            reused += b.ctypes.data in seen
            same += b.ctypes.data == address
            seen.add(b.ctypes.data)
            del b
    cuda.synchronize()
    return reused, same, int(wrong.copy_to_host()[0])

import contextlib
_nothing = contextlib.nullcontext
"""


def test_managed_arrays_come_from_cu_mem_alloc_managed_and_move_data():
    facts = run_json(PRELUDE + """
n = 1 << 20
a = cuda.managed_array(n, dtype=np.float32)
a[:] = np.arange(n, dtype=np.float32)  # the host writes at once
add_one[grid(n)](a)
cuda.synchronize()
ok = bool(np.array_equal(a, np.arange(n, dtype=np.float32) + 1))
attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
managed = bool(cu.cuPointerGetAttribute(attr, a.ctypes.data)[1])
d = cuda.device_array(16)
host_attached = cuda.managed_array(16, attach_global=False)  # Numba's own path
st = numba_pool.stats()
summary = numba_pool.memory_summary()
# No preferred location, as cuMemAllocManaged's memory: a pool located on the device made the
# host's first touch of a 4 KiB array cost 1.2 ms instead of 0.07 ms.
preferred = cu.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION if hasattr(cu, "CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION") else cu.CUmem_range_attribute.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION
ours_pref = cu.cuMemRangeGetAttribute(4, preferred, a.ctypes.data, a.nbytes)[1]
theirs_pref = cu.cuMemRangeGetAttribute(4, preferred, host_attached.ctypes.data, host_attached.nbytes)[1]
print(json.dumps({"ok": ok, "managed": managed, "ours": isinstance(a.gpu_data, PooledManagedMemory),
                  "preferred": [int(ours_pref), int(theirs_pref)],
                  "theirs": not isinstance(host_attached.gpu_data, PooledManagedMemory),
                  "no_mempool": pool_of(a.ctypes.data) == 0 and pool_of(d.device_ctypes_pointer.value) != 0,
                  "on": st.managed_on, "in_use": st.managed_in_use_bytes, "summary": "managed in use" in summary}))
""", ENV)
    assert facts["ok"] and facts["managed"] and facts["ours"] and facts["theirs"], facts
    assert facts["no_mempool"] and facts["on"] and facts["summary"], facts
    assert facts["in_use"] == 4 << 20, facts
    assert facts["preferred"][0] == facts["preferred"][1] == -2, facts  # CU_DEVICE_INVALID: none


@pytest.mark.parametrize("where", ["legacy", "blocking", "scoped"])
def test_a_new_owner_written_by_the_host_never_sees_a_running_kernel(where):
    """The host rule on the GPU: 200 trials of spin-on-A, drop A, write B on the host at once.
    The kernel counts elements of A that are not what A's owner wrote: 0 expected, and the
    cache does reuse A's block (once the host saw its kernel finish)."""
    facts = run_json(PRELUDE + EXPERIMENT + f"""
reused, same, wrong = experiment(200, {where!r})
print(json.dumps({{"reused": reused, "same": same, "wrong": wrong}}))
""", ENV)
    print(f"managed host-rule experiment ({where}): 200 trials, {facts['reused']} address reuses, "
          f"{facts['wrong']} wrong elements")
    assert facts["wrong"] == 0, facts
    assert facts["reused"] > 0, facts  # the cache does reuse blocks: the experiment tests something
    assert facts["same"] == 0, facts  # never the block of the kernel still running


def test_the_experiment_sees_a_planted_reuse_without_the_hosts_observation():
    """The control: with the host rule broken (a cached block counts as complete at once), the
    same experiment sees the host's writes in the running kernel."""
    facts = run_json(PRELUDE + EXPERIMENT + """
from numba_pool.allocator.host_blocks import HostBlocks
HostBlocks._completed = lambda self, block: True  # the planted bug
reused, same, wrong = experiment(50, "legacy")
print(json.dumps({"reused": reused, "same": same, "wrong": wrong}))
""", ENV)
    assert facts["same"] > 0 and facts["wrong"] > 0, facts


def test_prefetch_to_the_device_and_the_host():
    facts = run_json(PRELUDE + """
n = 1 << 20
a = cuda.managed_array(n, dtype=np.float32)
a[:] = 2.0
numba_pool.prefetch(a)                   # to the current device, legacy stream
add_one[grid(n)](a)
s = cuda.stream()
numba_pool.prefetch(a, "cpu", stream=s)  # back to the host, on a stream
s.synchronize()
ok = bool((a == 3.0).all())
errors = []
for bad in (lambda: numba_pool.prefetch(cuda.device_array(16)), lambda: numba_pool.prefetch(a, "gpu")):
    try:
        bad()
    except ValueError as err:
        errors.append(str(err))
print(json.dumps({"ok": ok, "errors": errors}))
""", ENV)
    assert facts["ok"], facts
    assert len(facts["errors"]) == 2 and "is not managed memory" in facts["errors"][0], facts
    assert "neither a device nor 'cpu'" in facts["errors"][1] and all("\n" not in e for e in facts["errors"]), facts


def test_prefetch_at_allocation():
    facts = run_json(PRELUDE + """
n = 1 << 20
a = cuda.managed_array(n, dtype=np.float32)
attr = cu.CUmem_range_attribute.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION
err, where = cu.cuMemRangeGetAttribute(4, attr, a.ctypes.data, a.nbytes)
where = where if isinstance(where, int) else int.from_bytes(bytes(where), "little", signed=True)
a[:] = 1.0
add_one[grid(n)](a)
cuda.synchronize()
print(json.dumps({"err": int(err), "where": where if not err else None,
                  "ok": bool((a == 2.0).all()), "prefetch": mm.config.managed_prefetch}))
""", {**ENV, "NUMBA_POOL_MANAGED_PREFETCH": "1"})
    assert facts["prefetch"] and facts["ok"], facts
    assert facts["err"] == 0 and facts["where"] == 0, facts  # device 0


def test_the_cap_refuses_in_one_line_and_the_cache_stays_usable():
    facts = run_json(PRELUDE + """
n = (4 << 20) // 4
a = cuda.managed_array(n, dtype=np.float32)
b = cuda.managed_array(n, dtype=np.float32)
try:
    c = cuda.managed_array(n, dtype=np.float32)
    message = None
except Exception as err:
    message = str(err)
del a
cuda.synchronize()
c = cuda.managed_array(n, dtype=np.float32)
c[:] = 1
st = numba_pool.stats()
print(json.dumps({"message": message, "in_use": st.managed_in_use_bytes, "reserved": st.managed_reserved_bytes}))
""", {**ENV, "NUMBA_POOL_MANAGED_MAX_SIZE": "8 MiB"})
    assert facts["message"] and "NUMBA_POOL_MANAGED_MAX_SIZE" in facts["message"], facts
    assert "out of managed memory allocating 4194304 bytes" in facts["message"] and "\n" not in facts["message"], facts
    assert facts["in_use"] == 8 << 20 and facts["reserved"] == 8 << 20, facts


def test_switched_off_managed_arrays_are_numbas_own():
    facts = run_json(PRELUDE + """
a = cuda.managed_array(1000)
a[:] = 1
print(json.dumps({"ours": isinstance(a.gpu_data, PooledManagedMemory), "on": numba_pool.stats().managed_on,
                  "why": mm.managed_off_because}))
""", {**ENV, "NUMBA_POOL_MANAGED": "0"})
    assert not facts["ours"] and not facts["on"] and facts["why"] == "NUMBA_POOL_MANAGED is off", facts


def test_a_managed_array_outlives_a_reset_and_trim_gives_memory_back():
    facts = run_json(PRELUDE + """
n = 1 << 20
keep = cuda.managed_array(n, dtype=np.float32)
keep[:] = 5
for _ in range(4):
    tmp = cuda.managed_array(n, dtype=np.float32)
    tmp[:] = 1
    del tmp
cuda.current_context().reset()
keep += 1  # still valid host memory after the reset
ok = bool((keep == 6).all())
after_reset = numba_pool.stats()
del keep
numba_pool.trim()
after_trim = numba_pool.stats()
print(json.dumps({"ok": ok, "reset_in_use": after_reset.managed_in_use_bytes,
                  "reset_cached": after_reset.managed_cached_bytes, "trim_reserved": after_trim.managed_reserved_bytes}))
""", ENV)
    assert facts["ok"] and facts["reset_in_use"] == 4 << 20 and facts["reset_cached"] == 0, facts
    assert facts["trim_reserved"] == 0, facts


def test_a_trimmed_managed_block_gives_its_device_memory_back():
    # Note [Managed blocks are not from a mempool]: a managed mempool kept the device memory of a freed range
    # whose pages a kernel had touched and the host had read, even after cuMemPoolTrimTo(0) (4 GiB of 4, H200,
    # driver 580).  cuMemAllocManaged's cuMemFree gives it all back, as Numba's default does.
    # cuMemGetInfo is the device's: another process's allocations meanwhile count in one round, the least is ours
    # (the bug kept the GiB in every round).
    facts = run_json(PRELUDE + """
n, ok, kept = 1 << 30, True, []
for _ in range(3):
    before = cu.cuMemGetInfo()[1]
    a = cuda.managed_array(n, dtype=np.uint8)
    assert cu.cuMemsetD8(a.ctypes.data, 7, n)[0] == 0 and cu.cuCtxSynchronize()[0] == 0
    ok = ok and bool((a == 7).all())  # the host reads every page
    del a
    gc.collect()
    numba_pool.trim()
    kept.append(before - cu.cuMemGetInfo()[1])
print(json.dumps({"ok": ok, "kept": min(kept), "rounds": kept, "reserved": numba_pool.stats().managed_reserved_bytes}))
""", ENV)
    assert facts["ok"] and facts["reserved"] == 0, facts
    assert facts["kept"] < 128 << 20, facts  # the old managed mempool kept the whole GiB
