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
@pytest.mark.parametrize("on", ["a stream", "null"])
def test_a_cupy_block_used_on_another_stream_waits_for_it(on):
    # A CuPy array A on stream s1 is read on stream s2 by a slow kernel, dropped, and a new array of the
    # same size on s1 is written at once (POISON).  With numba_pool.record_stream(A, s2) the new owner waits
    # for s2 (the reader sees no POISON); without it (the planted bug: a use the allocator was not told of)
    # the reader sees the new owner's writes.
    facts = run_json(PRELUDE + """
import cupy
cupy.cuda.set_allocator(numba_pool.cupy_allocator)
s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
if "{on}" == "null":  # the legacy stream: the door's free list keeps what is dropped there
    s1 = cupy.cuda.Stream.null
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

out = {"recorded": trial(True), "planted": trial(False)}
cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)  # for comparison: CuPy's own pool, as CuPy documents it
out["cupy's MemoryPool"] = trial(False)
print(json.dumps(out))
""".replace("{on}", on), ENV)
    print(f"on {on}: (reused, corrupted) of 8: {facts}")
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


TORCH_RACE = PRELUDE + """
import torch
which = sys.argv[1] if len(sys.argv) > 1 else "{which}"
if which == "numba_pool":
    torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
if "{on}" == "default":  # the legacy stream: the door's free list keeps what is freed there
    s1 = torch.cuda.default_stream()
n = 1 << 16

def trial(record):
    wrong = cuda.to_device(np.zeros(1, dtype=np.int64))
    reused = 0
    for _ in range(8):
        with torch.cuda.stream(s1):
            a = torch.full((n,), 7.0, device="cuda")
        s2.wait_stream(s1)
        read_after_delay[32, THREADS, cuda.external_stream(s2.cuda_stream)](cuda.as_cuda_array(a), POISON, 2000, wrong)
        if record:  # the documented use: PyTorch's own, or numba_pool's (Tensor.record_stream calls no allocator)
            numba_pool.record_stream(a, s2.cuda_stream) if which == "numba_pool" else a.record_stream(s2)
        address = a.data_ptr()
        del a
        with torch.cuda.stream(s1):
            b = torch.full((n,), float(POISON), device="cuda")
        reused += b.data_ptr() == address
        del b
    torch.cuda.synchronize()
    return reused, int(wrong.copy_to_host()[0])

print(json.dumps({"recorded": trial(True), "planted": trial(False)}))
"""


@needs_torch
@pytest.mark.parametrize("on", ["a stream", "default"])
@pytest.mark.parametrize("which", ["numba_pool", "caching allocator"])
def test_a_torch_block_used_on_another_stream_waits_for_it(which, on):
    # As the CuPy test, with PyTorch's streams and tensors: with the documented record_stream the reader sees
    # no POISON; without it (planted) it does.  PyTorch's own caching allocator runs the same program.  On the
    # default stream the door's free list would give the block back at once: record_stream keeps it out.
    facts = run_json(TORCH_RACE.replace("{which}", which).replace("{on}", on), ENV)
    print(f"{which} on {on}: (reused, corrupted) of 8: {facts}")
    assert facts["recorded"][1] == 0, facts
    if which == "numba_pool":
        assert facts["planted"][0] > 0 and facts["planted"][1] > 0, facts


FREE_LIST = PRELUDE + """
from numba_pool.plugin.state import process
if "{library}" == "torch":
    import torch as lib
    lib.cuda.memory.change_current_allocator(numba_pool.torch_allocator())
    full, sync, address = (lambda i: lib.full((1 << 14,), float(i), device="cuda")), lib.cuda.synchronize, \
        (lambda t: t.data_ptr())
    device = lib.cuda.current_device()
else:
    import cupy as lib
    lib.cuda.set_allocator(numba_pool.cupy_allocator)
    full, sync, address = (lambda i: lib.full(1 << 14, float(i), dtype=lib.float32)), \
        lib.cuda.get_current_stream().synchronize, (lambda a: a.data.ptr)
    device = lib.cuda.runtime.getDevice()
x = full(0)
before = numba_pool.stats()
addresses = set()
for i in range(200):
    t = full(i)
    addresses.add(address(t))
    x += t
    del t
sync()
door = process.torch_door if "{library}" == "torch" else process.cupy_door
after = numba_pool.stats()
kept = door.native.cached(device)
ok = bool((x == sum(range(200))).all())
print(json.dumps({"ok": ok, "addresses": len(addresses), "reuses": door.native.reuses, "kept": kept,
                  "allocations": after.total_allocations - before.total_allocations,
                  "frees": after.total_frees - before.total_frees, "in_use": after.bytes_in_use - before.bytes_in_use}))
"""


@pytest.mark.parametrize("library", [pytest.param("torch", marks=needs_torch), pytest.param("cupy", marks=needs_cupy)])
def test_default_stream_allocations_come_from_the_free_list_and_are_counted(library):
    # Note [The doors' free lists]: a tensor or array freed on the default (null) stream serves the next
    # of its size there; the statistics count every one, and the kept blocks go back at stats().
    facts = run_json(FREE_LIST.replace("{library}", library), ENV)
    print(f"{library}: {facts}")
    assert facts["ok"] and facts["addresses"] == 1 and facts["reuses"] >= 199, facts
    assert facts["allocations"] == 200 and facts["frees"] == 200 and facts["in_use"] == 0, facts
    assert facts["kept"] == [0, 0], facts  # stats() gave the last one back


MIXED = PRELUDE + """
import pickle, subprocess
import cupy, torch
cupy.cuda.set_allocator(numba_pool.cupy_allocator)
torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())
cuda.current_context()
numba_pool.record_history()
before = numba_pool.stats()
n = 1 << 16
x = cuda.device_array(n, dtype=np.float32)  # site: numba
fill_kernel[blocks(n), THREADS](x, np.float32(2.0))
h = np.zeros(n, dtype=np.float32)
fill_kernel[blocks(n), THREADS](h, np.float32(3.0))  # site: cuda.core
c = cupy.arange(n, dtype=cupy.float32) * 2  # site: cupy
t = torch.ones(n, device="cuda") + torch.as_tensor(x, device="cuda")  # site: torch
cuda.synchronize()
ok = {"numba": bool((x.copy_to_host() == 2).all()), "host": bool((h == 3).all()),
      "cupy": bool((c == cupy.arange(n, dtype=cupy.float32) * 2).all()), "torch": bool((t == 3).all())}
after = numba_pool.stats()
snap = numba_pool.snapshot()
traces = snap["device_traces"][cuda.get_current_device().id]
allocs = [e for e in traces if e["action"] == "alloc"]
live = numba_pool.live_allocations(None)
by_kind = {}
for _site, nbytes, _dev, _addr, kind in live:
    by_kind[kind] = by_kind.get(kind, 0) + nbytes
sites = {}
for e in allocs:
    sites.setdefault(e["kind"], set()).update((f["filename"], f["line"]) for f in e["frames"])
numba_pool.dump_snapshot(sys.argv[1])
viz = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace", sys.argv[1]], capture_output=True, text=True)
print(json.dumps({
    "ok": ok, "allocations": after.total_allocations - before.total_allocations, "alloc_events": len(allocs),
    "in_use": after.bytes_in_use - before.bytes_in_use, "live_bytes": sum(by_kind.values()), "by_kind": by_kind,
    "cupy_bytes": c.data.mem.size, "torch_bytes": t.untyped_storage().nbytes(), "numba_bytes": x.nbytes,
    "sites": {k: sorted(v) for k, v in sites.items()}, "viz_rc": viz.returncode, "viz_err": viz.stderr[-500:],
    "viz_lines": len(viz.stdout.splitlines())}))
"""


@needs_cupy
@needs_torch
def test_one_program_with_every_door_counts_and_names_each_librarys_allocations(tmp_path):
    # Issue 35's mixed program: Numba kernels on Numba arrays and on host arrays (cuda.core's door), CuPy and
    # PyTorch operations, every door installed: the results are right, stats() counts every allocation the
    # history saw (and the bytes live), each library's live bytes are its objects', the snapshot names the
    # program's line of each library's allocation, and PyTorch's viewer reads it.
    program = tmp_path / "mixed.py"
    program.write_text(MIXED)
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, str(program), str(tmp_path / "mixed.pickle")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    print({k: v for k, v in facts.items() if k != "sites"})
    assert all(facts["ok"].values()), facts["ok"]
    assert facts["allocations"] == facts["alloc_events"] > 0, facts
    assert facts["in_use"] == facts["live_bytes"], facts
    assert facts["by_kind"].get("cupy") == facts["cupy_bytes"], facts
    assert facts["by_kind"].get("torch") == facts["torch_bytes"], facts
    assert facts["by_kind"].get("device", 0) >= facts["numba_bytes"], facts
    lines = MIXED.splitlines()
    # A host array's launch temporary: numba-cuda allocates it through cuda.core's door, Numba-CUDA-MLIR through
    # Numba's EMM door (kind "device"); each library's allocation names its line under its door.
    kinds = {"numba": ("device",), "cuda.core": ("cuda.core", "device"), "cupy": ("cupy",), "torch": ("torch",)}
    for site, doors in kinds.items():
        line = 1 + next(i for i, text in enumerate(lines) if text.endswith(f"# site: {site}"))
        seen = [kind for kind in doors if [str(program), line] in facts["sites"].get(kind, [])]
        assert seen, (site, line, {kind: facts["sites"].get(kind) for kind in doors})
    assert facts["viz_rc"] == 0 and facts["viz_lines"] > 0, facts["viz_err"]


CAPTURE = f"""
import json, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from cuda.bindings import driver as cu
from gpu_helpers import cuda
from numba_pool.cuda.streams import as_stream_ref
from numba_pool.plugin.torch_allocator import TorchDoor

class NoCaptureCheck(TorchDoor):  # planted: the stream's id asked whatever the stream
    def _stream(self, handle, capture_status, stream_id):
        ref = as_stream_ref(handle)
        ref.key = stream_id(ref.handle)[1]
        return ref

cuda.current_context()
out = {{}}
for name, door in (("door", TorchDoor()), ("planted", NoCaptureCheck())):
    err, stream = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    handle = int(stream)
    door._free(door._malloc(4096, 0, handle), 4096, 0, handle)  # the door has seen the stream
    cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    ptr = door._malloc(4096, 0, handle)
    status = cu.cuStreamIsCapturing(stream)[1].name
    if ptr:
        door._free(ptr, 4096, 0, handle)
    err, graph = cu.cuStreamEndCapture(stream)
    out[name] = [bool(ptr), status, err.name]
print(json.dumps(out))
"""


def test_a_pytorch_door_allocation_in_a_capture_leaves_it_valid():
    # Note [A raw handle's stream]: cuStreamGetId invalidates a capture; the door asks a capturing stream's id never.
    out = run_json(CAPTURE, env={"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    assert out["door"] == [True, "CU_STREAM_CAPTURE_STATUS_ACTIVE", "CUDA_SUCCESS"], out
    assert out["planted"][1] == "CU_STREAM_CAPTURE_STATUS_INVALIDATED", out  # the check matters on this driver


ACROSS_RESET = PRELUDE + """
import torch
from cuda.core import Device
from numba_pool.plugin.state import process

def as_array(buffer):
    return cuda.from_cuda_array_interface({"shape": (n,), "typestr": "<f4", "data": (int(buffer.handle), False),
                                           "version": 3, "strides": None, "stream": None}, owner=buffer, sync=False)

torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())
n = 1 << 16
torch.ones(1, device="cuda")
device = Device(cuda.get_current_device().id)
device.set_current()
resource = numba_pool.MemoryResource(device.device_id)
stream = device.create_stream()
old_tensor = torch.full((n,), 3.0, device="cuda")
old_buffer = resource.allocate(4 * n, stream=stream)
old_tensor_at, old_buffer_at = old_tensor.data_ptr(), int(old_buffer.handle)
cuda.current_context().reset()  # both dangle now
tensors = [torch.full((n,), 5.0, device="cuda") for _ in range(8)]
buffers = [resource.allocate(4 * n, stream=stream) for _ in range(8)]
for b in buffers:
    fill_kernel[blocks(n), THREADS, cuda.external_stream(int(stream.handle))](as_array(b), 5.0)
given = sum(t.data_ptr() == old_tensor_at for t in tensors) + sum(int(b.handle) == old_buffer_at for b in buffers)
set_aside = len(process.torch_door._blocks.aside) + len(resource._blocks.aside)
in_use = numba_pool.stats().bytes_in_use
del old_tensor
old_buffer.close(stream)
stream.sync()
torch.cuda.synchronize()
freed = in_use - numba_pool.stats().bytes_in_use
more = [torch.full((n,), 9.0, device="cuda") for _ in range(16)]  # would take a block a dangling free released
torch.cuda.synchronize()
print(json.dumps({"given_old_address": given, "set_aside": set_aside, "freed": freed,
                  "ok": all(bool((t == 5.0).all()) for t in tensors),
                  "ok_buffers": all(bool((as_array(b).copy_to_host() == 5.0).all()) for b in buffers),
                  "aside": len(process.torch_door._blocks.aside) + len(resource._blocks.aside)}))
"""


@needs_torch
def test_a_tensor_or_buffer_alive_across_a_reset_frees_nothing_else():
    # Note [An address a reset gave again]: after Numba's context reset, no new tensor or buffer gets the address
    # its door still holds for a dangling one (a block the pool gives there is set aside), and the dangling ones'
    # frees release only what was set aside: every new tensor and buffer keeps its values while later ones are
    # written, and nothing stays aside.  Whether the pool gives those addresses again is the driver's choice (the
    # H100 runs of 2026-11-27 never did); the CUDA model's tests, where the pool does, are the ones seen failing
    # on the table before this fix.
    facts = run_json(ACROSS_RESET, {**ENV, "NUMBA_POOL_USE_DEFAULT_POOL": "1"})
    print(f"across a reset: {facts}")
    assert facts["ok"] and facts["ok_buffers"] and facts["aside"] == 0, facts
    assert facts["given_old_address"] == 0 and facts["freed"] == 4 * (1 << 16) * facts["set_aside"], facts
