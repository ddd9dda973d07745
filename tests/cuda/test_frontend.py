"""Which Numba CUDA frontend numba_pool uses: found, never assumed (numba_pool.cuda.frontend).

Both frontends import without a GPU, so CI checks the real classes: the error that both
frontends' ``except`` catch, a manager built for the frontend whose context it is given, the
resolution of a public call, and a process that uses Numba-CUDA-MLIR and never imports numba.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from cuda.bindings import driver as cu

import numba_pool
from helpers import FRONTENDS, MISSING_FRONTENDS, run_python
from numba_pool.allocator.block import make_block
from numba_pool.cuda import errors
from numba_pool.cuda import frontend as frontends
from numba_pool.plugin import api
from numba_pool.plugin.manager import NumbaPoolManager, manager_class

BOTH = pytest.mark.skipif(len(FRONTENDS) < 2, reason="; ".join(MISSING_FRONTENDS.values()) or "both installed")
MLIR = pytest.mark.skipif("mlir" not in FRONTENDS, reason=MISSING_FRONTENDS.get("mlir", ""))


def last_json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling, name", [("numba-cuda", "numba-cuda"), ("NUMBA_CUDA", "numba-cuda"),
                                            (" numba.cuda ", "numba-cuda"), ("mlir", "mlir"), ("MLIR", "mlir"),
                                            ("numba-cuda-mlir", "mlir"), ("numba_cuda_mlir", "mlir")])
def test_frontend_names_are_read_as_users_write_them(spelling, name):
    assert frontends.parse_name(spelling, "x") == name


@pytest.mark.parametrize("value", ["numba", "cuda", "mlir2", "", "numba-cuda,mlir"])
def test_a_bad_frontend_name_is_one_line_naming_the_culprit(value):
    with pytest.raises(frontends.FrontendError) as caught:
        frontends.parse_name(value, "NUMBA_POOL_FRONTEND")
    message = str(caught.value)
    assert "\n" not in message and f"NUMBA_POOL_FRONTEND={value!r}" in message and "'mlir'" in message


def test_the_environment_chooses_the_tools_frontend(frontend_name):
    assert frontends.for_tools({"NUMBA_POOL_FRONTEND": frontend_name}).name == frontend_name
    assert frontends.from_environment({"NUMBA_POOL_FRONTEND": " "}) is None  # empty means unset
    with pytest.raises(frontends.FrontendError, match="NUMBA_POOL_FRONTEND='cupy'"):
        frontends.for_tools({"NUMBA_POOL_FRONTEND": "cupy"})


def test_the_tools_prefer_numba_cuda_when_both_are_imported_and_none_is_chosen():
    assert frontends.for_tools({}).name == FRONTENDS[0]


@pytest.mark.parametrize("module, name", [("numba.cuda", "numba-cuda"), ("numba.cuda.cudadrv.driver", "numba-cuda"),
                                          ("numba_cuda.numba.cuda.api", "numba-cuda"),
                                          ("numba_cuda_mlir.numba_cuda.cudadrv.devicearray", "mlir"),
                                          ("numba", None), ("numba.core.types", None), ("numpy", None),
                                          ("numba_pool.plugin.manager", None), (None, None)])
def test_modules_belong_to_their_frontend(module, name):
    assert frontends.name_of_module(module) == name


def test_objects_belong_to_their_frontend(frontend_name):
    frontend = frontends.load(frontend_name)
    assert frontends.name_of(frontend.MemoryPointer(None, cu.CUdeviceptr(256), 8)) == frontend_name
    assert frontends.name_of(frontend.PoolPointer(None, cu.CUdeviceptr(256), 8, make_block(cu.CUdeviceptr(256), 8, None, lambda _: None))) == frontend_name
    stream = frontend.driver.Stream(cu.CUstream(0))
    assert frontends.name_of(stream) == frontend_name
    context = frontend.driver.Context.__new__(frontend.driver.Context)
    assert frontends.name_of(context) == frontend_name
    for other in (3, cu.CUstream(0), "numba.cuda", object()):
        assert frontends.name_of(other) is None


# -- the error both frontends catch -------------------------------------------------------


@BOTH
def test_the_driver_error_is_every_loaded_frontends_cuda_api_error():
    classes = [frontends.load(name).CudaAPIError for name in FRONTENDS]
    err = errors.api_error(cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, "numba_pool: out of memory")
    for cls in classes + [errors.CudaAPIError]:
        with pytest.raises(cls) as caught:  # except matches real subclasses only
            raise err
        assert caught.value.code == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        assert caught.value.msg == "numba_pool: out of memory"
    assert str(err) == f"[{cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY}] numba_pool: out of memory"  # Numba's format


def test_the_driver_error_grows_with_each_frontend_loaded():
    code = """
import json
from numba_pool.cuda import errors, frontend
before = errors.raised_class() is errors.CudaAPIError
mlir = frontend.load("mlir")
one = isinstance(errors.api_error(1, "x"), mlir.CudaAPIError)
out = {"before": before, "one": one}
try:
    nc = frontend.load("numba-cuda")
    e = errors.api_error(1, "x")
    out["both"] = isinstance(e, nc.CudaAPIError) and isinstance(e, mlir.CudaAPIError)
except frontend.FrontendError:
    out["both"] = "numba-cuda missing"
print(json.dumps(out))
"""
    if "mlir" not in FRONTENDS:
        pytest.skip(MISSING_FRONTENDS["mlir"])
    out = last_json(run_python(code))
    assert out["before"] and out["one"] and out["both"] in (True, "numba-cuda missing")
    assert out["both"] is True or "numba-cuda" not in FRONTENDS


# -- the manager Numba instantiates ------------------------------------------------------


def test_the_neutral_manager_becomes_the_frontend_of_its_context(frontend_name):
    frontend = frontends.load(frontend_name)
    context = frontend.driver.Context.__new__(frontend.driver.Context)
    manager = NumbaPoolManager(context=context)
    assert type(manager) is manager_class(frontend)
    assert isinstance(manager, frontend.HostOnlyCUDAMemoryManager) and isinstance(manager, NumbaPoolManager)
    assert manager.frontend is frontend and manager.interface_version == 1


def test_set_memory_manager_accepts_the_neutral_class_in_either_frontend(frontend_name):
    # set_memory_manager makes a context-less instance to read the interface version: the
    # frontend calling is the one meant.  In a fresh process: it changes the frontend's state.
    code = f"""
import json
import numba_pool
from numba_pool.cuda import frontend
from numba_pool.plugin.manager import manager_class
fe = frontend.load({frontend_name!r})
fe.cuda.set_memory_manager(numba_pool.NumbaPoolManager)
dummy = numba_pool.NumbaPoolManager.__new__(numba_pool.NumbaPoolManager, context=None)
print(json.dumps({{"set": fe.driver._memory_manager is numba_pool.NumbaPoolManager}}))
"""
    out = last_json(run_python(code, env={"NUMBA_POOL_FRONTEND": frontend_name}))
    assert out == {"set": True}


def test_install_sets_the_frontends_own_manager_class(frontend_name):
    code = f"""
import json
import numba_pool
from numba_pool.cuda import frontend
from numba_pool.plugin.manager import manager_class
fe = frontend.load({frontend_name!r})
config = numba_pool.install(arena=True)
print(json.dumps({{"class": fe.driver._memory_manager is manager_class(fe), "arena": config.arena,
                   "imported": frontend.imported()}}))
"""
    out = last_json(run_python(code, env={"NUMBA_POOL_FRONTEND": ""}))
    assert out == {"class": True, "arena": True, "imported": [frontend_name]}


# -- which frontend a public call acts on ---------------------------------------------------


@BOTH
def test_a_call_with_both_frontends_imported_is_ambiguous_in_one_line(monkeypatch):
    monkeypatch.delenv("NUMBA_POOL_FRONTEND", raising=False)
    monkeypatch.setattr(frontends, "_serving", set())
    for call in (numba_pool.stats, numba_pool.memory_summary, numba_pool.trim):
        with pytest.raises(frontends.FrontendError) as caught:
            call()
        message = str(caught.value)
        assert "\n" not in message and "ambiguous" in message and "frontend='mlir'" in message
        assert message.startswith(f"numba_pool.{call.__name__}()")


@BOTH
def test_the_frontend_serving_numba_pool_breaks_the_tie(monkeypatch):
    monkeypatch.delenv("NUMBA_POOL_FRONTEND", raising=False)
    monkeypatch.setattr(frontends, "_serving", {"mlir"})
    assert frontends.resolve("numba_pool.stats()").name == "mlir"
    monkeypatch.setattr(frontends, "_serving", {"mlir", "numba-cuda"})
    with pytest.raises(frontends.FrontendError, match="have numba_pool managers"):
        frontends.resolve("numba_pool.stats()")
    monkeypatch.setenv("NUMBA_POOL_FRONTEND", "numba-cuda")
    assert frontends.resolve("numba_pool.stats()").name == "numba-cuda"


@BOTH
def test_a_named_frontend_or_an_object_of_one_decides(monkeypatch):
    monkeypatch.setenv("NUMBA_POOL_FRONTEND", "numba-cuda")
    assert frontends.resolve("c", name="mlir").name == "mlir"
    mlir = frontends.load("mlir")
    stream = mlir.driver.Stream(cu.CUstream(0))
    assert frontends.resolve("c", None, 0, stream).name == "mlir"  # None and an int are skipped
    with pytest.raises(frontends.FrontendError, match="numba_pool.stats\\(\\): frontend='cupy'"):
        numba_pool.stats(frontend="cupy")


def test_a_device_must_be_an_ordinal_or_a_numba_context_or_device():
    assert api._ordinal(None, "c") is None and api._ordinal(2, "c") == 2
    with pytest.raises(TypeError, match="numba_pool.stats\\(\\): device='0' is not a device"):
        api._ordinal("0", "numba_pool.stats()")


# -- a Numba-CUDA-MLIR process never imports numba ----------------------------------------

# numba and numba_cuda made unimportable: any import of them fails loudly.
NO_NUMBA = """
import sys
for blocked in ("numba", "numba_cuda"):
    sys.modules[blocked] = None
"""


@MLIR
def test_numba_pool_under_mlir_runs_without_numba():
    code = NO_NUMBA + """
import json, warnings
import numba_pool
from numba_cuda_mlir import cuda
from numba_pool.cuda import driver, frontend
from numba_pool.plugin.manager import manager_class
import numba_pool_tools.replay, numba_pool.ipc, numba_pool.observe.alloclog
config = numba_pool.install(arena=True)
fe = frontend.load("mlir")
sys.path.insert(0, "TESTS")
from cuda_model.harness import Program
p = Program(arena=True, frontend="mlir")
a = p.mm.memalloc(1000); b = p.mm.memalloc(1 << 20)
kinds = [type(x).__mro__[2].__module__ for x in (a, b)]
del a, b
stats = p.mm.statistics()
p.close()
print(json.dumps({"installed": fe.driver._memory_manager is manager_class(fe), "kinds": kinds,
                  "allocations": stats.total_allocations,
                  "numba": [m for m in sys.modules if (m == "numba" or m.startswith(("numba.", "numba_cuda.")))
                            and sys.modules[m] is not None]}))
"""
    from helpers import TESTS

    out = last_json(run_python(code.replace("TESTS", TESTS), env={"NUMBA_POOL_FRONTEND": "mlir"}))
    assert out == {"installed": True, "kinds": ["numba_cuda_mlir.numba_cuda.cudadrv.driver"] * 2,
                   "allocations": 2, "numba": []}


@MLIR
def test_a_frontend_that_is_not_installed_is_named_with_its_extra():
    code = """
import sys
sys.modules["numba_cuda_mlir"] = None
from numba_pool.cuda import frontend
try:
    frontend.load("mlir")
except frontend.FrontendError as err:
    print(err)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("numba_pool: the Numba-CUDA-MLIR frontend (numba_cuda_mlir.cuda) is not installed: "
                                   "pip install '.[mlir]' in a numba-pool checkout")


def test_importing_numba_pool_imports_no_frontend():
    code = """
import json, sys
import numba_pool, numba_pool.config, numba_pool_tools.replay
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "numba_cuda", "numba_cuda_mlir"))))
"""
    assert last_json(run_python(code)) == []


def test_the_installed_frontends_are_found_without_importing_them():
    found = frontends.installed()
    assert found == [name for name in frontends.NAMES
                     if importlib.util.find_spec({"numba-cuda": "numba_cuda", "mlir": "numba_cuda_mlir"}[name])]
    assert set(found) == set(FRONTENDS)
    assert sys.modules.get("numba_pool") is numba_pool
