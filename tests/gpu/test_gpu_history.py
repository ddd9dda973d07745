"""Memory debugging on a real GPU: a kernel script's snapshot read by PyTorch's own viewer, an
out-of-memory error that names the culprit, and the leak report at exit.  Each program runs in
a fresh interpreter with ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool``, in the run's mode
(``NUMBA_POOL_ARENA``).  The viewer test needs torch (the GPU image has it).  Skipped without a GPU.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import pickle
import re
import subprocess
import sys

import pytest

from helpers import CUDA_IMPORT, PACKAGE_PARENT, run_json, run_python

pytestmark = pytest.mark.gpu

ENV = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"}


def _sqrt_allocation_line() -> tuple[str, int]:
    from kernels import sqrt

    source, first = inspect.getsourcelines(sqrt.main)
    line = next(first + i for i, text in enumerate(source) if "cuda.device_array(" in text)
    return os.path.abspath(sqrt.__file__), line


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed: PyTorch's viewer not run")
def test_pytorchs_viewer_reads_a_kernel_scripts_snapshot(tmp_path):
    dump = tmp_path / "dump.pickle"
    proc = run_python(f"import sys; from kernels.sqrt import main; sys.exit(main(['--iterations', '6', "
                      f"'--keep', '3', '--snapshot', {str(dump)!r}]))", ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(text for text in proc.stdout.splitlines() if text.startswith("snapshot:"))
    reserved, allocated, stats_reserved, in_use = map(int, re.findall(r"(\d+) bytes", line))
    assert reserved == stats_reserved and allocated == in_use == 3 * 4 * (1 << 20), line  # totals agree with stats()

    from torch.cuda._memory_viz import Bytes  # the viewer's own formatting
    viewer = [sys.executable, "-m", "torch.cuda._memory_viz"]
    stats = subprocess.run(viewer + ["stats", str(dump)], capture_output=True, text=True, timeout=300)
    assert stats.returncode == 0, stats.stderr
    assert f"total_reserved: {Bytes(reserved)}" in stats.stdout and f"total_allocated: {Bytes(in_use)}" in stats.stdout
    trace = subprocess.run(viewer + ["trace", str(dump)], capture_output=True, text=True, timeout=300)
    assert trace.returncode == 0 and trace.stdout.count("del ") == 3, trace.stderr  # 6 arrays, 3 kept
    html = tmp_path / "out.html"
    plot = subprocess.run(viewer + ["trace_plot", str(dump), "-o", str(html)], capture_output=True, text=True, timeout=300)
    assert plot.returncode == 0 and html.stat().st_size > 1000, plot.stderr
    if os.environ.get("OUT"):  # the dump travels back from a lent GPU for the README's picture
        arena = "arena" if os.environ.get("NUMBA_POOL_ARENA") == "1" else "mempool"
        (open(os.path.join(os.environ["OUT"], f"sqrt-{arena}.pickle"), "wb")).write(dump.read_bytes())

    snapshot = pickle.load(open(dump, "rb"))
    filename, lineno = _sqrt_allocation_line()
    sites = {(f["filename"], f["line"]) for seg in snapshot["segments"] for b in seg["blocks"] for f in b["frames"]}
    assert (filename, lineno) in sites, sorted(sites)[:10]  # the script's own allocation line


def test_out_of_memory_names_the_site_calls_the_observer_once_and_the_pool_works():
    facts = run_json(f"""
import json, numpy as np
{CUDA_IMPORT}
import numba_pool
seen = []
numba_pool.on_out_of_memory(lambda device, size, snapshot: seen.append((device, size, len(snapshot["segments"]))))

def hold(n):
    return cuda.device_array(n, dtype=np.uint8)  # the site that holds the memory

held = [hold(16 << 20) for _ in range(3)]
try:
    cuda.device_array(40 << 20, dtype=np.uint8)
    message = None
except Exception as err:  # the frontend's CudaAPIError
    message = str(err)
del held
ok = cuda.device_array(40 << 20, dtype=np.uint8) is not None
print(json.dumps({{"message": message, "seen": seen, "ok": ok, "line": hold.__code__.co_firstlineno + 1}}))
""", {**ENV, "NUMBA_POOL_MAX_SIZE": "64 MiB"})
    assert facts["message"] and "\n" not in facts["message"], facts
    assert re.search(rf"largest holders \(numba_pool.record_history\): \S+:{facts['line']} holds 48 MiB "
                     r"\(50331648 bytes\) in 3 arrays", facts["message"]), facts["message"]
    assert len(facts["seen"]) == 1 and facts["seen"][0][:2] == [0, 40 << 20] and facts["seen"][0][2] > 0, facts
    assert facts["ok"], facts


def test_the_leak_report_names_an_array_kept_alive():
    program = f"""
import numpy as np
{CUDA_IMPORT}
kept = cuda.device_array(1 << 20, dtype=np.uint8)  # kept alive on purpose
freed = cuda.device_array(1 << 20, dtype=np.uint8)
del freed
"""
    proc = run_python(program, {**ENV, "NUMBA_POOL_LEAK_REPORT": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = [line for line in proc.stderr.splitlines() if "numba_pool" in line or line.startswith("  ")]
    assert report[0].startswith("numba_pool: memory still held at exit (NUMBA_POOL_LEAK_REPORT): 1 MiB"), proc.stderr
    assert report[1] == "  <string>:4: 1 MiB (1048576 bytes) in 1 array", proc.stderr  # the line that keeps it
