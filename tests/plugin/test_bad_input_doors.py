"""Bad input to the doors and the options (issue 36, second probe): the cuda.core resources, stream handles, the
frontend's name, the simulator's switch and the optional files' ``off``.  One line naming the culprit and its
value, told before a GPU is needed (these run on machines without one)."""

from __future__ import annotations

import numpy as np
import pytest

import numba_pool
from numba_pool import config
from numba_pool.cuda import frontend as frontends
from numba_pool.cuda import simulator
from numba_pool.cuda.streams import LEGACY, as_stream_ref
from numba_pool.plugin import resource

RESOURCES = [numba_pool.MemoryResource, numba_pool.PinnedMemoryResource, numba_pool.ManagedMemoryResource]


@pytest.mark.parametrize("cls", RESOURCES, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("device_id, error, words", [
    ("0", TypeError, "device_id='0' is not a device ordinal (an int)"),
    (1.5, TypeError, "device_id=1.5 is not a device ordinal (an int)"),
    (-1, ValueError, "device_id=-1 is not a device ordinal (0 <= ordinal < 2**31)"),
    (2 ** 70, ValueError, f"device_id={2 ** 70} is not a device ordinal"),
])
def test_a_resource_names_itself_and_a_bad_device_id(cls, device_id, error, words):
    with pytest.raises(error) as caught:
        cls(device_id)
    line = str(caught.value)
    assert line.startswith(f"numba_pool.{cls.__name__}: ") and words in line and "\n" not in line


@pytest.mark.parametrize("manager", ["x", 5, object()])
def test_a_resource_refuses_what_is_not_a_manager(manager):
    with pytest.raises(TypeError, match=r"^numba_pool.MemoryResource: manager=.* is not a numba_pool manager"):
        numba_pool.MemoryResource(manager=manager)


def test_a_resources_size_error_names_the_resource():
    with pytest.raises(ValueError, match=r"^numba_pool.PinnedMemoryResource.allocate: size=-5 must be a positive"):
        numba_pool.PinnedMemoryResource(0).allocate(-5)


@pytest.mark.parametrize("ptr", ["x", None, [1]])
def test_deallocate_of_a_non_address_says_so(ptr):
    with pytest.raises(TypeError, match=r"^numba_pool.MemoryResource.deallocate: ptr=.* is not a device address"):
        numba_pool.MemoryResource(0).deallocate(ptr, 64)


def test_a_resource_without_a_gpu_has_a_repr_and_says_no_gpu_in_one_line(monkeypatch):
    monkeypatch.setattr(resource._cu, "cuCtxGetDevice", _no_driver)
    unnamed = numba_pool.MemoryResource()
    assert repr(unnamed) == "numba_pool.MemoryResource(device 0, 0 live buffers)" and unnamed.device_id == 0
    if _has_gpu():
        pytest.skip("a GPU is here")
    from helpers import run_json  # a fresh process: no manager another test left registered
    out = run_json("import json, numba_pool\ntry:\n    numba_pool.MemoryResource(0).allocate(64)\n"
                   "except Exception as err:\n    print(json.dumps([type(err).__name__, str(err)]))")
    assert out[0] == "RuntimeError" and out[1].startswith("numba_pool: no CUDA GPU is available here (") and \
        "\n" not in out[1], out


def _no_driver():
    raise RuntimeError('"cuda" is an NVIDIA driver library, not found')


def _has_gpu() -> bool:
    from numba import cuda
    return cuda.is_available()


@pytest.mark.parametrize("handle", [np.int64(0), np.uint64(0), np.int32(5), 5])
def test_numpy_integers_are_stream_handles(handle):
    ref = as_stream_ref(handle)
    assert ref is LEGACY if int(handle) == 0 else (ref.value == int(handle) and type(ref.value) is int)


@pytest.mark.parametrize("value, on", [("1", True), ("2", True), (" 1 ", True), ("0", False), ("00", False),
                                       ("false", False), ("yes", False), ("", False)])
def test_the_simulator_is_on_as_numba_reads_the_variable(value, on):
    assert simulator.requested({"NUMBA_ENABLE_CUDASIM": value}) is on or simulator.active()


@pytest.mark.parametrize("variable, option", [("NUMBA_POOL_LOG", "log"), ("NUMBA_POOL_OOM_SNAPSHOT", "oom_snapshot")])
@pytest.mark.parametrize("word", ["off", "OFF", "none", "0", "false", "no"])
def test_an_optional_file_is_off_for_off_not_a_file_named_off(variable, option, word):
    assert getattr(config.load({variable: word}), option) is None
    assert getattr(config.load({}, **{option: word}), option) is None


@pytest.mark.parametrize("call", [lambda: numba_pool.install("arena"), lambda: numba_pool.stats(frontend="bogus")])
def test_a_bad_frontend_is_a_value_error_with_one_prefix(call):
    with pytest.raises(ValueError) as caught:
        call()
    line = str(caught.value)
    assert isinstance(caught.value, frontends.FrontendError) and isinstance(caught.value, RuntimeError)
    assert line.startswith("numba_pool.") and "numba_pool: numba_pool" not in line and "is not a frontend" in line


def test_a_log_that_cannot_write_a_failure_row_leaves_the_doors_error_to_tell():
    from types import SimpleNamespace

    from numba_pool.plugin import serving

    def full_disk(*_):
        raise OSError(28, "No space left on device")
    for door in ("cupy", "torch", "cuda.core"):
        serving.failed(SimpleNamespace(log=SimpleNamespace(failure=full_disk)), door, 64, LEGACY)  # does not raise
