"""The compiled module (``numba_pool.cuda._native``) without a GPU: its driver-call twins bound to C callbacks that
stand in for the driver's entry points, and PyTorch's allocator callbacks called as PyTorch calls them.  The
twins must answer exactly as cuda-python's functions do: the allocator compares their results with cuda-python's
enums.  On the GPU, tests/gpu/test_gpu_native.py checks them against cuda-python's own answers."""

from __future__ import annotations

import ctypes

import pytest
from cuda.bindings import driver as cu
from hypothesis import given, strategies as st

from numba_pool.cuda import driver

# Built by any install with a C compiler (.ci/run fails where it is not); skipped where it is not built.
_native = pytest.importorskip("numba_pool.cuda._native", reason="the compiled module is not built here")

IS_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
FREE_ASYNC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_ulonglong, ctypes.c_void_p)
GET_ID = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_ulonglong))
HANDLES = st.integers(min_value=1, max_value=(1 << 64) - 1)


class FakeEntryPoints:
    """C functions standing in for cuStreamIsCapturing, cuMemFreeAsync and cuStreamGetId: they record their arguments
    and answer ``err`` (and ``status``, or a stream id of handle + 1)."""

    def __init__(self):
        self.err, self.status, self.calls = 0, 0, []
        self.functions = (IS_CAPTURING(self._is_capturing), FREE_ASYNC(self._free_async), GET_ID(self._get_id))

    def bind(self):
        _native.bind(*(ctypes.cast(f, ctypes.c_void_p).value for f in self.functions),
                     cu.CUresult, cu.CUstreamCaptureStatus, driver.NOT_CAPTURING_ANSWER)

    def _is_capturing(self, handle, status):
        self.calls.append(("capturing", handle or 0))
        status[0] = self.status
        return self.err

    def _free_async(self, address, handle):
        self.calls.append(("free", address, handle or 0))
        return self.err

    def _get_id(self, handle, stream_id):
        self.calls.append(("id", handle or 0))
        stream_id[0] = ((handle or 0) + 1) % (1 << 64)
        return self.err


# Bound to stand-ins, the twins would serve a GPU session's live managers (a finalizer's free): not there.
pytestmark = pytest.mark.skipif(driver.twins_in_use(), reason="the twins serve this process's managers")


def unbind() -> None:
    """After a test: no entry points (a twin called then raises), or the driver's own once bound."""
    if driver.twins_in_use():
        driver._bind_twins()
    else:
        _native.bind(0, 0, 0, cu.CUresult, cu.CUstreamCaptureStatus, driver.NOT_CAPTURING_ANSWER)


@pytest.fixture
def fake():
    entry = FakeEntryPoints()
    entry.bind()
    yield entry
    unbind()


@given(handle=HANDLES)
def test_the_capture_query_passes_the_handle_and_answers_not_capturing_as_cuda_python(handle):
    entry = FakeEntryPoints()
    entry.bind()
    try:
        err, status = _native.cuStreamIsCapturing(cu.CUstream(handle))
        assert entry.calls == [("capturing", handle)]
        assert err == driver.SUCCESS and status == cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
        assert type(err) is cu.CUresult and type(status) is cu.CUstreamCaptureStatus
        assert _native.cuStreamIsCapturing(handle) is driver.NOT_CAPTURING_ANSWER  # the hot paths' identity test
    finally:
        unbind()


@pytest.mark.parametrize("status", list(cu.CUstreamCaptureStatus))
def test_the_capture_query_reports_every_status(fake, status):
    fake.status = int(status)
    assert _native.cuStreamIsCapturing(cu.CUstream(0x50)) == (cu.CUresult.CUDA_SUCCESS, status)


def test_a_refused_capture_query_is_cuda_pythons_error_and_none(fake):
    fake.err, fake.status = int(cu.CUresult.CUDA_ERROR_INVALID_HANDLE), 1
    err, status = _native.cuStreamIsCapturing(cu.CUstream(0x50))
    assert err is cu.CUresult.CUDA_ERROR_INVALID_HANDLE and status is None and err.name == "CUDA_ERROR_INVALID_HANDLE"


@pytest.mark.parametrize("err", [cu.CUresult.CUDA_SUCCESS, cu.CUresult.CUDA_ERROR_INVALID_VALUE])
def test_the_free_passes_address_and_handle_and_answers_as_cuda_python(fake, err):
    fake.err = int(err)
    assert _native.cuMemFreeAsync(cu.CUdeviceptr(0x7f00_0000_1000), cu.CUstream(0x60)) == (err,)
    assert _native.cuMemFreeAsync(0x7f00_0000_2000, 0x61) == (err,)  # ints, as cuda-python takes them
    assert fake.calls == [("free", 0x7f00_0000_1000, 0x60), ("free", 0x7f00_0000_2000, 0x61)]


@given(handle=HANDLES)
def test_the_stream_id_query_passes_the_handle_and_answers_the_id_as_cuda_python(handle):
    entry = FakeEntryPoints()
    entry.bind()
    try:
        assert _native.cuStreamGetId(cu.CUstream(handle)) == (cu.CUresult.CUDA_SUCCESS, (handle + 1) % (1 << 64))
        entry.err = int(cu.CUresult.CUDA_ERROR_INVALID_HANDLE)
        assert _native.cuStreamGetId(handle) == (cu.CUresult.CUDA_ERROR_INVALID_HANDLE, None)
        assert entry.calls == [("id", handle), ("id", handle)]
    finally:
        unbind()


def test_a_twin_with_no_entry_points_raises():
    unbind()
    for call, args in ((_native.cuStreamIsCapturing, (1,)), (_native.cuMemFreeAsync, (1, 1)), (_native.cuStreamGetId, (1,))):
        with pytest.raises(RuntimeError, match="no driver entry points bound"):
            call(*args)


def test_hot_gives_a_stand_ins_own_function_and_cuda_pythons_where_no_driver_binds():
    class StandIn:
        def cuStreamIsCapturing(self, stream):
            return "model"
    stand_in = StandIn()
    assert driver.hot(stand_in, "cuStreamIsCapturing")(0) == "model"  # the CUDA model keeps its own functions
    # cuda-python's module: the twin once bound (a GPU here), else cuda-python's function (no driver library here)
    got = driver.hot(cu, "cuStreamIsCapturing")
    assert got is (_native.cuStreamIsCapturing if driver.twins_in_use() else cu.cuStreamIsCapturing)


MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


def test_torchs_callbacks_call_the_python_ends_with_ints_and_give_null_for_none_or_an_error():
    calls = []

    def malloc(size, device, stream):
        calls.append(("malloc", size, device, stream))
        if size == 13:
            raise RuntimeError("a Python end that raised")
        return None if size == 7 else 0x7f00_0000_0000 + size

    def free(pointer, size, device, stream):
        calls.append(("free", pointer, size, device, stream))
    from numba_pool.plugin.state import process
    try:
        malloc_at, free_at = _native.torch_callbacks(malloc, free)
        c_malloc, c_free = MALLOC(malloc_at), FREE(free_at)
        assert c_malloc(4096, 1, 0x99) == 0x7f00_0000_1000
        assert c_malloc(7, 0, None) is None and c_malloc(13, 0, None) is None  # NULL to PyTorch
        c_free(0x7f00_0000_1000, 4096, 1, None)
    finally:
        door = process.torch_door  # a GPU session's PyTorch allocator calls these C functions: give them back
        if door is not None:
            door.addresses()
    assert calls == [("malloc", 4096, 1, 0x99), ("malloc", 7, 0, 0), ("malloc", 13, 0, 0),
                     ("free", 0x7f00_0000_1000, 4096, 1, 0)]
