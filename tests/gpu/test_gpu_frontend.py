"""Numba-CUDA-MLIR as numba_pool's frontend on a real GPU, and both frontends in one process.

Each test runs its program in a fresh interpreter (a frontend binds its memory manager per
process), whatever the frontend under test, with the environment it needs: the acceptance test
of Numba-CUDA-MLIR support (1,000 allocations counted, numba never imported), ``install()`` and
an out-of-memory error under it, and numba-cuda and Numba-CUDA-MLIR side by side, each with its
own manager and statistics.  Skipped, with the reason, where a frontend they need is not
installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import FRONTENDS, MISSING_FRONTENDS, NUMBA_CUDA_CANNOT_COMPILE, PACKAGE_PARENT

pytestmark = pytest.mark.gpu

needs_mlir = pytest.mark.skipif("mlir" not in FRONTENDS, reason=MISSING_FRONTENDS.get("mlir", ""))
needs_both = pytest.mark.skipif(len(FRONTENDS) < 2, reason="needs both frontends installed: "
                                + "; ".join(MISSING_FRONTENDS.values()))

#: Variables of the test run's environment that would change what these programs test.
CHOOSERS = ("NUMBA_POOL_FRONTEND", "NUMBA_CUDA_MEMORY_MANAGER")

#: A line of Python: the numba modules the program has imported (numba_cuda_mlir's are not).
NUMBA_MODULES = ('sorted(m for m in sys.modules if m == "numba" or m.startswith(("numba.", "numba_cuda")) '
                 'and not m.startswith("numba_cuda_mlir"))')


def run_json_with(code: str, env: dict) -> dict:
    """Run ``code`` in a fresh interpreter with the test run's environment less
    :data:`CHOOSERS`, plus ``env``; return the JSON object it prints last.  (``helpers.run_json``
    cannot unset a variable, and an empty ``NUMBA_CUDA_MEMORY_MANAGER`` names a module.)"""
    full_env = {name: value for name, value in os.environ.items() if name not in CHOOSERS}
    full_env.update(env)
    proc = subprocess.run([sys.executable, "-c", code], env=full_env, cwd=PACKAGE_PARENT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


ACCEPTANCE = """
import json, sys
from numba_cuda_mlir import cuda
import numba_pool
for _ in range(1000):
    a = cuda.device_array(1024)
    del a
s = numba_pool.stats()
print(json.dumps({"total_allocations": s.total_allocations,
                  "manager": type(cuda.current_context().memory_manager).__name__,
                  "numba": "numba" in sys.modules, "numba.cuda": "numba.cuda" in sys.modules,
                  "numba_cuda": "numba_cuda" in sys.modules, "numba_modules": NUMBA_MODULES}))
""".replace("NUMBA_MODULES", NUMBA_MODULES)


@needs_mlir
def test_mlir_alone_counts_its_allocations_and_never_imports_numba():
    facts = run_json_with(ACCEPTANCE, {"NUMBA_POOL_FRONTEND": "mlir", "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    print(facts)
    assert facts["manager"] == "NumbaPoolManager", facts
    assert facts["total_allocations"] == 1000, facts
    assert not facts["numba"] and not facts["numba.cuda"] and not facts["numba_cuda"], facts
    assert facts["numba_modules"] == [], facts


BOTH = """
import json, sys
import numpy as np
from numba import cuda as nc
from numba_cuda_mlir import cuda as mc
import numba_pool

@nc.jit
def add_one(a):
    i = nc.grid(1)
    if i < a.size:
        a[i] += 1

@mc.jit
def add_two(a):
    i = mc.grid(1)
    if i < a.size:
        a[i] += 2

n = 1000
kept_nc = [nc.device_array(n, dtype=np.float32) for _ in range(10)]
kept_mc = [mc.device_array(n, dtype=np.float32) for _ in range(20)]
ctx_nc, ctx_mc = nc.current_context(), mc.current_context()
facts = {"numba_cuda": numba_pool.stats(frontend="numba-cuda").total_allocations,
         "mlir": numba_pool.stats(frontend="mlir").total_allocations,
         "mlir_by_context": numba_pool.stats(device=ctx_mc).total_allocations,
         "numba_cuda_by_context": numba_pool.stats(device=ctx_nc).total_allocations}
try:
    numba_pool.stats()
    facts["ambiguous"] = None
except RuntimeError as err:
    facts["ambiguous"] = str(err)
mm_nc, mm_mc = ctx_nc.memory_manager, ctx_mc.memory_manager
facts["distinct"] = mm_nc is not mm_mc
facts["ours"] = [isinstance(mm_nc, numba_pool.NumbaPoolManager), isinstance(mm_mc, numba_pool.NumbaPoolManager)]
facts["managers"] = [f"{c.__module__}.{c.__qualname__}" for m in (mm_nc, mm_mc) for c in type(m).__mro__[:2]]
stream = mc.stream()
host = np.arange(n, dtype=np.float32)
kept_nc[0].copy_to_device(host)
kept_mc[0].copy_to_device(host, stream=stream)
add_one[(n + 255) // 256, 256](kept_nc[0])
add_two[(n + 255) // 256, 256, stream](kept_mc[0])
numba_pool.record_stream(kept_mc[0], stream)  # used on stream: its release waits for the kernel
facts["recorded"] = True
nc.synchronize(); mc.synchronize()
facts["numba_cuda_kernel"] = bool((kept_nc[0].copy_to_host() == host + 1).all())
facts["mlir_kernel"] = bool((kept_mc[0].copy_to_host() == host + 2).all())
print(json.dumps(facts))
"""


@needs_both
@pytest.mark.skipif(NUMBA_CUDA_CANNOT_COMPILE is not None, reason=str(NUMBA_CUDA_CANNOT_COMPILE))
def test_both_frontends_in_one_process_have_their_own_managers_and_statistics():
    # NUMBA_POOL_FRONTEND unset: with both frontends serving, a call that names neither is ambiguous.
    facts = run_json_with(BOTH, {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    print(facts)
    assert facts["numba_cuda"] == 10 and facts["numba_cuda_by_context"] == 10, facts
    assert facts["mlir"] == 20 and facts["mlir_by_context"] == 20, facts
    message = facts["ambiguous"]
    assert message is not None and "ambiguous" in message and "\n" not in message.strip(), facts
    assert facts["distinct"] and facts["ours"] == [True, True], facts
    assert facts["recorded"] and facts["numba_cuda_kernel"] and facts["mlir_kernel"], facts


INSTALL = """
import json, sys
from numba_cuda_mlir import cuda
from numba_cuda_mlir.numba_cuda.cudadrv.driver import HostOnlyCUDAMemoryManager
import numba_pool
numba_pool.install()
a = cuda.device_array(10)
mm = cuda.current_context().memory_manager
print(json.dumps({"mlir_base": HostOnlyCUDAMemoryManager in type(mm).__mro__,
                  "ours": isinstance(mm, numba_pool.NumbaPoolManager),
                  "mro": [f"{c.__module__}.{c.__qualname__}" for c in type(mm).__mro__],
                  "total_allocations": numba_pool.stats().total_allocations, "numba_modules": NUMBA_MODULES}))
""".replace("NUMBA_MODULES", NUMBA_MODULES)


@needs_mlir
def test_install_under_mlir_makes_its_contexts_use_numba_pool():
    # Neither NUMBA_CUDA_MEMORY_MANAGER nor NUMBA_POOL_FRONTEND: install() finds the frontend imported.
    facts = run_json_with(INSTALL, {})
    print(facts)
    assert facts["mlir_base"] and facts["ours"], facts
    assert facts["total_allocations"] == 1, facts
    assert facts["numba_modules"] == [], facts


OUT_OF_MEMORY = """
import json
import numpy as np
from cuda.bindings import driver as cu
from numba_cuda_mlir import cuda
from numba_cuda_mlir.numba_cuda.cudadrv.driver import CudaAPIError
import numba_pool
numba_pool.install(max_size="64 MiB")

@cuda.jit
def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1

caught = None
try:
    cuda.device_array(128 << 20, dtype=np.uint8)
except CudaAPIError as err:
    caught = {"type": f"{type(err).__module__}.{type(err).__qualname__}", "message": str(err),
              "out_of_memory": bool(err.code == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY)}
after_oom = numba_pool.stats()
a = cuda.to_device(np.arange(1000, dtype=np.float32))
add_one[4, 256](a)
ok = bool((a.copy_to_host() == np.arange(1000, dtype=np.float32) + 1).all())
again = cuda.device_array(32 << 20, dtype=np.uint8)
print(json.dumps({"caught": caught, "ok": ok, "again": again.size, "oom_errors": after_oom.oom_errors,
                  "in_use_after_oom": after_oom.bytes_in_use}))
"""


@needs_mlir
def test_out_of_memory_under_mlir_raises_its_cuda_api_error_and_the_pool_keeps_working():
    facts = run_json_with(OUT_OF_MEMORY, {})
    print(facts)
    caught = facts["caught"]
    assert caught is not None, facts  # not raised, or not as numba_cuda_mlir's CudaAPIError
    assert caught["out_of_memory"] and "capped at 64 MiB" in caught["message"], facts
    assert facts["oom_errors"] >= 1 and facts["in_use_after_oom"] == 0, facts
    assert facts["ok"] and facts["again"] == 32 << 20, facts
