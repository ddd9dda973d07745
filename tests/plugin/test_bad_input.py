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


@pytest.mark.parametrize("call, use", [
    ("using_stream", "with numba_pool.using_stream(cuda.stream()):\n    a = cuda.device_array(4)\nprint(a.size)"),
    ("record_stream", "a = cuda.device_array(4)\nprint(numba_pool.record_stream(a, cuda.stream()), a.size)"),
])
def test_a_simulator_stream_is_said_to_order_nothing(call, use):
    from helpers import run_python
    proc = run_python("import warnings; warnings.simplefilter('always'); from numba import cuda; import numba_pool\n" + use,
                      {"NUMBA_ENABLE_CUDASIM": "1"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"numba_pool.{call}() orders nothing: the CUDA simulator is on" in proc.stderr, proc.stderr
    assert proc.stdout.strip() in ("4", "False 4")


_MANAGED = _Interface({"shape": (4,), "typestr": "<f4", "version": 3, "data": (0x1000, False)})

MORE_CASES = [
    # (call, exception, words the line must hold): the second round of findings
    (lambda: numba_pool.record_history(max_entries=2**70), ValueError, f"max_entries={2**70} must be a positive "),
    (lambda: numba_pool.record_history(max_entries=2**70), ValueError, "2**63"),
    (lambda: numba_pool.record_history(False, stacks="bogus"), ValueError, "record_history: stacks='bogus' must be"),
    (lambda: numba_pool.record_history(False, max_entries=-5), ValueError, "record_history: max_entries=-5 must be"),
    (lambda: numba_pool.statistics(profile=True).report("x"), TypeError, "report: limit='x' must be None or a pos"),
    (lambda: numba_pool.statistics(profile=True).report(1.5), TypeError, "report: limit=1.5 must be None or a pos"),
    (lambda: numba_pool.statistics(profile=True).report(True), TypeError, "report: limit=True must be None or a po"),
    (lambda: numba_pool.statistics(profile=True).report(-1), ValueError, "report: limit=-1 must be None or a posi"),
    (lambda: numba_pool.statistics(profile=True).report(0), ValueError, "report: limit=0 must be None or a posit"),
    (_enter(numba_pool.scratch(64, manager="x")), TypeError, "numba_pool.scratch: manager='x' is not a manager"),
    (_enter(numba_pool.scratch(64, manager=3)), TypeError, "numba_pool.scratch: manager=3 is not a manager"),
    (lambda: numba_pool.record_stream([1, 2], 0), TypeError, "record_stream: array=[1, 2]: list is neither a device"),
    (lambda: numba_pool.record_stream(None, 0), TypeError, "record_stream: array=None: NoneType is neither a device"),
    (lambda: numba_pool.record_stream("x", 0), TypeError, "record_stream: array='x': str is neither a device"),
    (lambda: numba_pool.record_stream(5, 0), TypeError, "record_stream: array=5: int is neither a device"),
    (lambda: numba_pool.stats(2**70), ValueError, f"numba_pool.stats(): device={2**70} is not a device ordinal"),
    (lambda: numba_pool.stats(2**31), ValueError, f"numba_pool.stats(): device={2**31} is not a device ordinal"),
    (lambda: numba_pool.stats(np.int64(2**40)), ValueError, "device=np.int64(1099511627776) is not a device ordinal"
     if np.__version__ >= "2" else "device=1099511627776 is not a device ordinal"),
    (lambda: numba_pool.trim(0, device=2**70), ValueError, f"trim(): device={2**70} is not a device ordinal"),
    (lambda: numba_pool.memory_summary(device=2**70), ValueError, f"device={2**70} is not a device ordinal"),
    (lambda: numba_pool.used_bytes(2**70), ValueError, f"used_bytes(): device={2**70} is not a device ordinal"),
    (lambda: numba_pool.reserved_bytes(2**70), ValueError, f"device={2**70} is not a device ordinal"),
    (lambda: numba_pool.reset_peak(2**70), ValueError, f"reset_peak(): device={2**70} is not a device ordinal"),
    (lambda: numba_pool.prefetch(_MANAGED, device=2**70), ValueError, f"device={2**70} is not a device ordinal"),
    (lambda: numba_pool.live_allocations(device=2**70), ValueError, f"device={2**70} is not a device ordinal"),
    (lambda: numba_pool.statistics(profile=2), TypeError, "statistics: profile=2 must be True or False"),
    (lambda: numba_pool.record_history(-1), TypeError, "record_history: enabled=-1 must be True or False"),
]


@pytest.mark.parametrize("call, error, words", CASES + MORE_CASES,
                         ids=[f"{i}:{words[:40]}" for i, (_, _, words) in enumerate(CASES + MORE_CASES)])
def test_bad_input_gets_one_line_naming_it_before_any_gpu(call, error, words):
    try:
        with pytest.raises(error) as caught:
            call()
    finally:
        process.set_recording(None)
    message = str(caught.value)
    assert words in message and "\n" not in message and len(message) < 400, message


def test_max_entries_takes_a_numpy_integer():
    try:
        numba_pool.record_history(max_entries=np.int64(100))
        assert process.recording.max_entries == 100 and type(process.recording.max_entries) is int
        numba_pool.record_history(True, "none", 2**63 - 1)
        assert process.recording.stacks == "none"
    finally:
        process.set_recording(None)


def test_report_takes_a_numpy_integer_or_none_for_its_limit():
    scope = numba_pool.statistics(profile=True)
    assert scope.report(np.int64(3)).startswith("| call site") and scope.report(None).startswith("| call site")


def test_switches_take_0_and_1_as_install_does():
    try:
        numba_pool.record_history(np.int64(1))
        assert process.recording is not None
        numba_pool.record_history(0)
        assert process.recording is None
    finally:
        process.set_recording(None)
    assert numba_pool.statistics(profile=1).sites == {} and numba_pool.statistics(profile=np.uint8(1)).sites == {}
    with pytest.raises(RuntimeError, match="only with profile=True"):
        numba_pool.statistics(profile=0).sites


def test_a_summary_under_the_simulator_checks_its_arguments_first():
    from helpers import run_json
    code = ("import json, warnings; warnings.simplefilter('ignore'); from numba import cuda; import numba_pool\n"
            "out = {}\nfor key, kwargs in (('type', {'device': 'x'}), ('value', {'device': -1}), "
            "('big', {'device': 2**31}), ('frontend', {'frontend': 'bogus'}), ('fine', {'device': 0})):\n"
            "    try:\n        out[key] = numba_pool.memory_summary(**kwargs)\n"
            "    except Exception as err:\n        out[key] = f'{type(err).__name__}: {err}'\nprint(json.dumps(out))")
    out = run_json(code, {"NUMBA_ENABLE_CUDASIM": "1"})
    assert out["type"].startswith("TypeError: numba_pool.memory_summary(): device='x' is not a device"), out
    assert out["value"].startswith("ValueError: numba_pool.memory_summary(): device=-1 is not a device ordinal"), out
    assert out["big"].startswith(f"ValueError: numba_pool.memory_summary(): device={2**31} is not a device "), out
    assert out["frontend"].startswith("FrontendError: ") and "memory_summary(): frontend='bogus' is not a frontend" in \
        out["frontend"], out
    assert out["fine"].startswith("numba_pool: no memory summary: the CUDA simulator is on"), out
