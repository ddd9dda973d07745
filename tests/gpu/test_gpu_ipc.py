"""IPC of pool memory on a real GPU: spawned processes open arrays the parent exported, in
both modes (``pytest -m gpu`` and ``NUMBA_POOL_ARENA=1 pytest -m gpu``)."""

from __future__ import annotations

import os

import pytest

from helpers import CUDA_IMPORT, run_json

pytestmark = pytest.mark.gpu

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ipc")  # ipc_children
ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"}
PRELUDE = f"""
import json, multiprocessing as mp, pickle, sys, time
sys.path.insert(0, {TESTS!r})
import numpy as np
{CUDA_IMPORT}
import numba_pool, ipc_children
from numba_pool import ipc
from numba_pool.plugin.state import process
ctx = mp.get_context("spawn")
import faulthandler; faulthandler.dump_traceback_later(100, exit=True)
def recv(conn):
    assert conn.poll(60), "the child sent nothing in 60 s"
    return conn.recv()
"""


def test_spawned_process_reads_and_writes_exported_arrays():
    facts = run_json(PRELUDE + """
results = {}
base_used = None
with ctx.Pool(1) as pool:
    cuda.synchronize(); base_used = numba_pool.stats().pool_used_bytes
    for label, n, part in [("small", 1000, None), ("large", 2 << 20, None), ("slice", 1000, slice(100, 900))]:
        host = np.arange(n, dtype=np.float32)
        d = cuda.to_device(host)
        view = d[part] if part is not None else d
        h = view.get_ipc_handle()
        again = pickle.loads(pickle.dumps(h))
        got = pool.apply_async(ipc_children.open_double_close, (h,)).get(60)
        expect = host[part] if part is not None else host
        results[label] = {"read_ok": got["seen"] == expect.tolist(),
                          "writes_seen": bool((view.copy_to_host() == expect * 2).all()),
                          "child_manager": got["manager"], "child_pool_used": got["own_pool_used"],
                          "pickle_ok": again._ipc_handle.handle.reserved == h._ipc_handle.handle.reserved and again._ipc_handle.base is None,
                          "offset": h._ipc_handle.offset}
        del d, view, h, again
    import gc; gc.collect(); cuda.synchronize(); time.sleep(0.3)
    numba_pool.trim()  # the arena keeps an empty slab otherwise
    results["parent_used_back"] = numba_pool.stats().pool_used_bytes - base_used
print(json.dumps(results))
""", ENV)
    print(facts)
    for label in ("small", "large", "slice"):
        r = facts[label]
        assert r["read_ok"] and r["writes_seen"] and r["pickle_ok"], (label, r)
        assert r["child_manager"] == "NumbaPoolManager" and r["child_pool_used"] == 0
    assert facts["slice"]["offset"] > 0
    assert facts["parent_used_back"] <= 0  # every exported block went back to the pool


def test_the_exporters_release_waits_until_the_importer_closes():
    facts = run_json(PRELUDE + """
parent, child = ctx.Pipe()
d = cuda.to_device(np.full(1 << 20, 3.0, dtype=np.float32))
cuda.synchronize(); before = numba_pool.stats().pool_used_bytes
p = ctx.Process(target=ipc_children.hold_until_told, args=(d.get_ipc_handle(), child)); p.start()
seen = recv(parent)
del d
import gc; gc.collect(); time.sleep(0.3); cuda.synchronize()
held = {"pending": process.leases.pending(), "used": numba_pool.stats().pool_used_bytes}
parent.send("close"); closed = recv(parent); p.join(60)
time.sleep(0.5); cuda.synchronize()
numba_pool.trim()  # the arena keeps an empty slab otherwise
after = {"pending": process.leases.pending(), "used": numba_pool.stats().pool_used_bytes}
print(json.dumps({"seen": seen, "before": before, "held": held, "closed": closed, "after": after}))
""", ENV)
    print(facts)
    assert facts["seen"] == 3.0 and facts["closed"] == "closed"
    assert facts["held"]["pending"] == 1 and facts["held"]["used"] == facts["before"]  # not reused meanwhile
    assert facts["after"]["pending"] == 0 and facts["after"]["used"] < facts["before"]


def test_an_exporter_that_exits_first_leaves_the_importer_running():
    facts = run_json(PRELUDE + """
parent, child = ctx.Pipe()
p = ctx.Process(target=ipc_children.export_then_exit, args=(child,)); p.start()
h = recv(parent)
arr = h.open()
first = float(arr.copy_to_host()[0])
parent.send("opened"); p.join(60)
time.sleep(0.5)
try:
    after = float(arr.copy_to_host()[0]); outcome = "readable"
except Exception as err:
    after, outcome = None, f"{type(err).__name__}: {err}"[:300]
try:
    h.close(); closed = "closed"
except Exception as err:
    closed = f"{type(err).__name__}: {err}"[:300]
print(json.dumps({"first": first, "after": after, "outcome": outcome, "closed": closed, "exit": p.exitcode}))
""", ENV)
    print(facts)  # the README's IPC section reports what this prints
    assert facts["first"] == 7.0 and facts["exit"] == 0
    assert facts["outcome"] == "readable" and facts["after"] == 7.0 or "Error" in facts["outcome"]


def test_get_ipc_handle_refuses_a_pool_that_cannot_be_exported():
    facts = run_json(f"""
import json
import numpy as np
{CUDA_IMPORT}
d = cuda.to_device(np.arange(10, dtype=np.float32))
try:
    d.get_ipc_handle(); message = None
except RuntimeError as err:
    message = str(err)
print(json.dumps({{"message": message}}))
""", {**ENV, "NUMBA_POOL_IPC": "0"})
    assert "cannot be shared with other processes" in facts["message"] and "NUMBA_POOL_IPC" in facts["message"]
