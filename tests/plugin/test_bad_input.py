"""Bad input to the public functions (issue 36): one line naming the culprit and its value, as ValueError or
TypeError, told before a GPU is needed (these run on machines without one); numpy scalars taken for the number or
switch they hold; a truthy string never taken for True."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import numba_pool
from numba_pool.plugin.state import process


class _Stream:
    def __init__(self, answer):
        self.answer = answer

    def __cuda_stream__(self):
        return self.answer


class _Interface:
    def __init__(self, interface):
        self.__cuda_array_interface__ = interface


def _enter(context):
    return lambda: context.__enter__()


CASES = [
    # (call, exception, words the line must hold)
    (lambda: numba_pool.dump_snapshot(None), ValueError, "dump_snapshot(path)=None is not a file path"),
    (lambda: numba_pool.dump_snapshot(3.5), ValueError, "dump_snapshot(path)=3.5 is not a file path"),
    (lambda: numba_pool.dump_snapshot(["x"]), ValueError, "dump_snapshot(path)=['x'] is not a file path"),
    (lambda: numba_pool.dump_snapshot(12345), ValueError, "dump_snapshot(path)=12345 is not a file path"),
    (lambda: numba_pool.dump_snapshot(1), ValueError, "dump_snapshot(path)=1 is not a file path"),
    (lambda: numba_pool.dump_snapshot(True), ValueError, "dump_snapshot(path)=True is not a file path"),
    (lambda: numba_pool.dump_snapshot("/proc/self/status"), ValueError, "is a kernel interface file"),
    (lambda: numba_pool.prefetch(_Interface({"shape": (1,), "typestr": "<f4", "version": 3}), "cpu"), TypeError,
     "__cuda_array_interface__ has data=None"),
    (lambda: numba_pool.prefetch(_Interface({"shape": (1,), "typestr": "<f4", "version": 3, "data": None}), "cpu"),
     TypeError, "__cuda_array_interface__ has data=None"),
    (_enter(numba_pool.using_stream(-1)), ValueError, "stream handle -1 is not a CUDA stream"),
    (_enter(numba_pool.using_stream(2**70)), ValueError, f"stream handle {2**70} is not a CUDA stream"),
    (_enter(numba_pool.using_stream(_Stream(5))), TypeError, "_Stream.__cuda_stream__ gave 5"),
    (_enter(numba_pool.using_stream(_Stream(()))), TypeError, "_Stream.__cuda_stream__ gave ()"),
    (_enter(numba_pool.using_stream(_Stream((0, "x")))), TypeError, "_Stream.__cuda_stream__ gave (0, 'x')"),
    (lambda: numba_pool.record_history("off"), TypeError, "record_history: enabled='off' must be True or False"),
    (lambda: numba_pool.record_history(enabled="false"), TypeError, "enabled='false' must be True or False"),
    (lambda: numba_pool.statistics(profile="no"), TypeError, "statistics: profile='no' must be True or False"),
    (lambda: numba_pool.live_allocations(device="0"), TypeError, "device='0' is not a device"),
    (lambda: numba_pool.live_allocations(device=-1), ValueError, "device=-1 is not a device ordinal"),
    (lambda: numba_pool.live_allocations(device=1.5), TypeError, "device=1.5 is not a device"),
    (lambda: numba_pool.live_allocations(device=[0]), TypeError, "device=[0] is not a device"),
    (lambda: numba_pool.on_out_of_memory(lambda: None), TypeError, "cannot be called as callback(device, size, "),
    (lambda: numba_pool.install(NUMBA_POOL_ARENA=1), ValueError, "'NUMBA_POOL_ARENA' (did you mean 'arena'?)"),
    (lambda: numba_pool.install(oom_snapshot=3), ValueError, "expected the path of a snapshot (pickle) to write"),
    (lambda: numba_pool.stats(device=-1), ValueError, "stats(): device=-1 is not a device ordinal"),
    (lambda: numba_pool.trim(keep_bytes=-1), ValueError, "trim: keep_bytes=-1 must be a non-negative number"),
    (_enter(numba_pool.scratch(2**70)), ValueError, f"scratch: nbytes={2**70} must be a positive number of bytes"),
    (lambda: numba_pool.record_stream(None, None), TypeError, "NoneType is not a CUDA stream"),
]


@pytest.mark.parametrize("call, error, words", CASES, ids=[words[:48] for _, _, words in CASES])
def test_bad_input_gets_one_line_naming_it_before_any_gpu(call, error, words):
    try:
        with pytest.raises(error) as caught:
            call()
    finally:
        process.set_recording(None)
    message = str(caught.value)
    assert words in message and "\n" not in message and len(message) < 400, message


def test_numpy_scalars_are_taken_for_what_they_hold(monkeypatch):
    monkeypatch.setenv("NUMBA_CUDA_MEMORY_MANAGER", "")
    config = numba_pool.config.load(arena=np.bool_(True), host=np.int64(1))
    assert config.arena is True and config.host is True
    from numba_pool.config.values import byte_count, switch
    assert byte_count(np.int64(1 << 20), "numba_pool.scratch", "nbytes", positive=True) == 1 << 20
    assert switch(np.bool_(False), "numba_pool.record_history", "enabled") is False


def test_max_size_none_means_no_cap_as_for_the_caches(monkeypatch):
    monkeypatch.setenv("NUMBA_POOL_MAX_SIZE", "none")
    assert numba_pool.config.load().max_size is None
    assert numba_pool.config.load(max_size="None").max_size is None


def test_a_bad_variable_is_told_under_the_simulator_when_the_plugin_is_named():
    from helpers import run_python
    proc = run_python("import warnings; warnings.simplefilter('always'); import numba_pool",
                      {"NUMBA_ENABLE_CUDASIM": "1", "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool",
                       "NUMBA_POOL_ARENA": "maybe"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NUMBA_POOL_ARENA='maybe' is not a switch" in proc.stderr, proc.stderr


def test_a_recording_under_the_simulator_says_it_records_nothing():
    from helpers import run_python
    proc = run_python("import warnings; warnings.simplefilter('always'); from numba import cuda; import numba_pool; "
                      "numba_pool.record_history(); print(numba_pool.memory_summary())", {"NUMBA_ENABLE_CUDASIM": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "record_history() records nothing: the CUDA simulator is on" in proc.stderr, proc.stderr
    assert proc.stdout.strip() == ("numba_pool: no memory summary: the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): "
                                   "it keeps device arrays in host memory and has no memory manager for numba_pool "
                                   "to replace"), proc.stdout


def test_install_without_a_gpu_says_so_at_the_callers_line():
    from helpers import GPU, run_python
    if GPU:
        pytest.skip("a GPU is here")
    proc = run_python("import warnings; warnings.simplefilter('always')\nimport numba_pool\nnumba_pool.install()\n",
                      {"NUMBA_ENABLE_CUDASIM": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "<string>:3: RuntimeWarning: numba_pool.install(): no CUDA GPU is available here" in proc.stderr, proc.stderr


def test_using_stream_with_a_simulator_stream_says_it_orders_nothing():
    from helpers import run_python
    proc = run_python("import warnings; warnings.simplefilter('always'); from numba import cuda; import numba_pool\n"
                      "with numba_pool.using_stream(cuda.stream()):\n    a = cuda.device_array(4)\nprint(a.size)",
                      {"NUMBA_ENABLE_CUDASIM": "1"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "numba_pool.using_stream() orders nothing: the CUDA simulator is on" in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "4"
