"""The cuda.core and CuPy doors' legacy-stream free lists (Note [The doors' free lists] in
:mod:`numba_pool.plugin.free_lists`) on the CUDA model: the cuda.core resource's buffers on the legacy stream, and
CuPy's null-stream arrays through :func:`numba_pool.cupy_allocator` over a stand-in of the CuPy objects it makes
(CuPy's own need a GPU: tests/gpu/test_gpu_library_doors.py).  PyTorch's: test_torch_free_list.py."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from cuda.bindings import driver as real_cu
from cuda.core import LEGACY_DEFAULT_STREAM
from cuda.core import Stream as CoreStream

import numba_pool
from cuda_model.checks import assert_clean
from cuda_model.harness import LEGACY, StreamObject
from numba_pool.cuda.errors import CudaAPIError
from numba_pool.plugin.cupy_allocator import CupyDoor, cupy_allocator
from numba_pool.plugin.state import process

pytest.importorskip("numba_pool.cuda._native", reason="the free lists are in the compiled module")


def _stream(p) -> int:
    return int(p.model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1])


def _no_python(*args):
    raise AssertionError(f"the Python end was called: {args}")


class _Array:  # what numba_pool.record_stream is given: an object with a device pointer
    def __init__(self, address: int):
        self.device_pointer_value = address


# -- cuda.core ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
@pytest.mark.parametrize("closed_on", ["legacy", "allocation stream"])
def test_a_legacy_buffer_closed_there_serves_the_next_one_of_its_size_without_python(programs, arena, closed_on,
                                                                                       monkeypatch):
    p = programs(arena=arena)
    mr = p.core_resource
    first = mr.allocate(4096)  # None: the legacy stream
    p.model.launch(LEGACY, [(first.device_pointer_value, 4096, "first")])
    mr.deallocate(first.device_pointer_value, 4096, LEGACY_DEFAULT_STREAM if closed_on == "legacy" else None)
    assert mr.native.cached(0) == (1, 4096)
    monkeypatch.setattr(mr, "_malloc", _no_python)  # the C ends look the resource's Python ends up by name
    monkeypatch.setattr(mr, "_free", _no_python)
    again = mr.allocate(4096, LEGACY_DEFAULT_STREAM)
    assert again.device_pointer_value == first.device_pointer_value and mr.native.reuses == 1
    p.model.launch(LEGACY, [(again.device_pointer_value, 4096, "second")])  # after the first in the stream's order
    again.deallocate(None)  # cuda.core's close(): the stream the buffer recorded
    monkeypatch.undo()
    stats = p.mm.statistics()  # gives the kept block back first
    assert (stats.total_allocations, stats.total_frees, stats.bytes_in_use) == (2, 2, 0), stats
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_buffer_of_another_stream_or_closed_naming_another_stream_is_never_kept(programs, arena):
    p = programs(arena=arena)
    mr, s = p.core_resource, _stream(p)
    on_s = mr.allocate(4096, CoreStream.from_handle(s))
    mr.deallocate(on_s.device_pointer_value, 4096, None)  # its allocation stream, s: the Python end, ordered there
    legacy = mr.allocate(4096)
    p.model.wait(s, LEGACY)
    p.model.launch(s, [(legacy.device_pointer_value, 4096, "read on s")])
    mr.deallocate(legacy.device_pointer_value, 4096, CoreStream.from_handle(s))  # its last user: waits for s
    assert mr.native.cached(0) == (0, 0)
    again = mr.allocate(4096)
    p.model.launch(LEGACY, [(again.device_pointer_value, 4096, "next")])
    again.deallocate(None)
    assert mr.native.reuses == 0
    assert_clean(p)  # no unordered reuse


def test_a_legacy_buffer_closed_naming_numbas_default_stream_is_kept(programs):
    # numba-cuda's launches close their host arrays' copies naming Numba's default stream object (handle 0)
    p = programs(arena=False)
    mr = p.core_resource
    first = mr.allocate(4096, StreamObject(0))
    p.model.launch(LEGACY, [(first.device_pointer_value, 4096, "first")])
    mr.deallocate(first.device_pointer_value, 4096, StreamObject(0))
    assert mr.native.cached(0) == (1, 4096)
    again = mr.allocate(4096, StreamObject(0))
    assert again.device_pointer_value == first.device_pointer_value and mr.native.reuses == 1
    p.model.launch(LEGACY, [(again.device_pointer_value, 4096, "second")])
    mr.deallocate(again.device_pointer_value, 4096, StreamObject(0))
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_a_legacy_buffer_closed_naming_another_stream_is_live_no_more(programs):
    # Its free went through Python: the free list forgets it first, so a later legacy free of that address (another
    # buffer's, were the address given again) is never taken for this one's and kept.
    p = programs(arena=False)
    mr, s = p.core_resource, _stream(p)
    buffer = mr.allocate(4096)
    address = buffer.device_pointer_value
    p.model.wait(s, LEGACY)
    p.model.launch(s, [(address, 4096, "read on s")])
    mr.deallocate(address, 4096, CoreStream.from_handle(s))
    mr.native.free(address, 4096, 0, 1)  # (nothing of this door's holds it now: Python's end finds no buffer)
    assert mr.native.cached(0) == (0, 0) and p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_a_buffer_recorded_for_another_stream_is_not_kept(programs):
    p = programs(arena=False)
    mr, s = p.core_resource, _stream(p)
    buffer = mr.allocate(4096)
    p.model.wait(s, LEGACY)
    p.model.launch(s, [(buffer.device_pointer_value, 4096, "read on s")])
    assert p.mm.record_stream(_Array(buffer.device_pointer_value), s)
    buffer.deallocate(None)
    assert mr.native.cached(0) == (0, 0)
    again = mr.allocate(4096)
    p.model.launch(LEGACY, [(again.device_pointer_value, 4096, "next")])
    again.deallocate(None)
    assert_clean(p)


def test_a_legacy_buffer_is_in_the_history_at_its_callers_line_and_never_kept_while_it_records(programs):
    p = programs(arena=False)
    mr = p.core_resource
    numba_pool.record_history()
    try:
        buffer = mr.allocate(4096)
        event = process.recording.live[(p.mm.device_id, buffer.device_pointer_value)]
        assert (event.kind, event.frames[0].co_name) == (
            "cuda.core", "test_a_legacy_buffer_is_in_the_history_at_its_callers_line_and_never_kept_while_it_records")
        buffer.deallocate(None)
        assert mr.native.cached(0) == (0, 0)
    finally:
        numba_pool.record_history(False)
    assert_clean(p)


def test_a_legacy_buffer_made_again_after_a_reset_is_in_the_history_at_its_callers_line(programs):
    # Note [An address a reset gave again] through the free list's Python end: the retry's frames are skipped too.
    p = programs(arena=False)
    mr = p.core_resource
    old = mr.allocate(744)
    p.mm.reset()
    numba_pool.record_history()
    try:
        new = mr.allocate(744)
        assert any(mr._blocks.aside.values())  # the retry ran
        event = process.recording.live[(p.mm.device_id, new.device_pointer_value)]
        assert event.frames[0].co_name == \
            "test_a_legacy_buffer_made_again_after_a_reset_is_in_the_history_at_its_callers_line"
        old.deallocate(None)
        new.deallocate(None)
    finally:
        numba_pool.record_history(False)
    assert_clean(p)


def test_the_pinned_and_managed_resources_keep_nothing(programs):
    p = programs(arena=False, host=True)
    assert numba_pool.PinnedMemoryResource(manager=p.mm).native is None
    assert numba_pool.ManagedMemoryResource(manager=p.mm).native is None


def test_an_out_of_memory_legacy_buffer_raises_with_the_pools_sizes_and_loses_nothing(programs):
    p = programs(arena=False, max_size=1 << 20)
    mr = p.core_resource
    kept = mr.allocate(4096)
    kept.deallocate(None)
    with pytest.raises(CudaAPIError, match="OUT_OF_MEMORY"):
        mr.allocate(2 << 20)
    assert mr.native.cached(0) == (0, 0)  # the retry gave the kept block back
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


# -- CuPy --------------------------------------------------------------------------------------------------------
class _Pointer:  # cupy.cuda.MemoryPointer over UnownedMemory: keeps the owner while the array lives
    def __init__(self, memory, offset: int):
        self.mem, self.ptr = memory, memory.ptr + offset


def _unowned(ptr: int, size: int, owner, device_id: int):
    return SimpleNamespace(ptr=ptr, size=size, owner=owner, device_id=device_id)


def _cupy_stand_in(p, monkeypatch, stream_ptr: int = 0, free=None, door: bool = True) -> None:
    """A stand-in ``cupy`` module for ``cupy_allocator``: CuPy's current device 0, its current stream (``ptr``
    ``stream_ptr``, settable), ``runtime.free`` (``free``: cudaFree's stand-in); with ``door``, the process's CuPy
    door on ``p``'s manager."""
    stream = SimpleNamespace(ptr=stream_ptr)
    runtime = SimpleNamespace(getDevice=lambda: 0, free=free or (lambda ptr: None))
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(
        runtime=runtime, get_current_stream=lambda: stream, MemoryPointer=_Pointer, UnownedMemory=_unowned)))
    if door:
        monkeypatch.setattr(process, "cupy_door", CupyDoor(find_manager=lambda device_id, name: p.mm))


@pytest.fixture
def cupy(programs, monkeypatch):
    """A Program whose CuPy door (on its manager) ``cupy_allocator`` reaches through a stand-in ``cupy`` module: CuPy's
    current device 0 and its null stream (``stream.ptr``, settable)."""
    p = programs(arena=False)
    _cupy_stand_in(p, monkeypatch)
    return p


def test_a_null_stream_array_dropped_serves_the_next_one_of_its_size_without_python(cupy, monkeypatch):
    p, door = cupy, process.cupy_door
    first = cupy_allocator(4096)
    address = first.ptr
    p.model.launch(LEGACY, [(address, 4096, "first")])
    del first  # CuPy drops its last reference: kept
    assert door.native.cached(0) == (1, 4096)
    monkeypatch.setattr(door, "_malloc", _no_python)
    monkeypatch.setattr(door, "_free", _no_python)
    again = cupy_allocator(4096)
    assert again.ptr == address and door.native.reuses == 1
    p.model.launch(LEGACY, [(address, 4096, "second")])
    del again
    monkeypatch.undo()
    stats = p.mm.statistics()
    assert (stats.total_allocations, stats.total_frees, stats.bytes_in_use) == (2, 2, 0), stats
    assert_clean(p)


def test_a_null_stream_array_recorded_for_another_stream_is_not_kept(cupy):
    p, door = cupy, process.cupy_door
    s = _stream(p)
    array = cupy_allocator(4096)
    p.model.wait(s, LEGACY)
    p.model.launch(s, [(array.ptr, 4096, "read on s")])
    assert p.mm.record_stream(_Array(array.ptr), s)
    del array
    assert door.native.cached(0) == (0, 0)
    again = cupy_allocator(4096)
    p.model.launch(LEGACY, [(again.ptr, 4096, "next")])
    del again
    assert_clean(p)


def test_a_null_stream_array_is_in_the_history_as_cupys_at_its_callers_line(cupy):
    p = cupy
    numba_pool.record_history()
    try:
        array = cupy_allocator(4096)
        event = process.recording.live[(p.mm.device_id, array.ptr)]
        assert (event.kind, event.frames[0].co_name) == (
            "cupy", "test_a_null_stream_array_is_in_the_history_as_cupys_at_its_callers_line")
        del array
        assert [e.action for e in process.recording.entries] == ["alloc", "free"]
    finally:
        numba_pool.record_history(False)
    assert_clean(p)


def test_an_out_of_memory_null_stream_array_raises_as_cupys_allocator_does(programs, monkeypatch):
    p = programs(arena=False, max_size=1 << 20)
    _cupy_stand_in(p, monkeypatch)
    with pytest.raises(CudaAPIError, match="OUT_OF_MEMORY"):
        cupy_allocator(2 << 20)
    array = cupy_allocator(4096)  # the pool works after it
    del array
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_an_array_on_another_stream_takes_the_python_path(cupy, monkeypatch):
    p = cupy
    s = _stream(p)
    monkeypatch.setattr(sys.modules["cupy"].cuda.get_current_stream(), "ptr", s)
    monkeypatch.setattr("numba_pool.plugin.cupy_allocator.serving_manager", lambda device_id, door: p.mm)
    array = cupy_allocator(4096)
    p.model.launch(s, [(array.ptr, 4096, "on s")])
    del array
    assert process.cupy_door.native.cached(0) == (0, 0) and process.cupy_door.native.reuses == 0
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


@pytest.mark.parametrize("on", ["null", "a stream"])
def test_cupys_first_allocation_in_a_thread_without_a_context_makes_cupys_current(programs, monkeypatch, on):
    # Note [CuPy's first allocation in a thread]: CuPy's own cudaMalloc makes the primary context current; the door's
    # driver calls fail there, so it calls runtime.free(0) (cudaFree(0)) as CuPy would have, and allocates again.
    from cuda_model import CONTEXT

    p = programs(arena=False)
    s = _stream(p)
    freed_zero = []

    def cuda_free(ptr):  # cudaFree(0): the CUDA runtime makes the device's primary context current in the thread
        assert ptr == 0
        freed_zero.append(p.model.cuCtxPushCurrent(CONTEXT))
    _cupy_stand_in(p, monkeypatch, 0 if on == "null" else s, cuda_free)
    monkeypatch.setattr("numba_pool.plugin.cupy_allocator.serving_manager", lambda device_id, door: p.mm)
    made = []
    p.bare.submit(lambda: made.append(cupy_allocator(4096))).result()  # a thread that never used CUDA
    array = made.pop()
    assert freed_zero == [(real_cu.CUresult.CUDA_SUCCESS,)] and p.mm.statistics().bytes_in_use == 4096
    p.model.launch(LEGACY if on == "null" else s, [(array.ptr, 4096, "array")])
    del array
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


# -- from a review: defer_cleanup, a reset inside a reuse, the door made once, the retry's log ---------------------

@pytest.mark.parametrize("door", ["cupy", "cuda.core", "torch"])
def test_memory_dropped_inside_defer_cleanup_is_not_handed_out_again_before_its_exit(programs, monkeypatch, door):
    # The guide: no memory of an array dropped inside defer_cleanup is handed out again before the outermost block
    # exits, so work on a non-blocking stream need only be done by the exit.  The free list keeps nothing meanwhile.
    p = programs(arena=False)
    _cupy_stand_in(p, monkeypatch)
    allocate, free = {
        "cupy": (lambda: cupy_allocator(4096), lambda x: None),
        "cuda.core": (lambda: p.core_resource.allocate(4096), lambda x: x.deallocate(None)),
        "torch": (lambda: _TorchTensor(p.torch_door), lambda x: x.free())}[door]
    address_of = (lambda x: x.ptr) if door == "cupy" else (lambda x: x.device_pointer_value)
    s = _stream(p)
    with p.mm.defer_cleanup():
        first = allocate()
        p.model.launch(LEGACY, [(address_of(first), 4096, "fill")])
        p.model.wait(s, LEGACY)
        p.model.launch(s, [(address_of(first), 4096, "read on a non-blocking stream")])
        free(first)
        del first  # relying on defer_cleanup, as the guide allows
        again = allocate()
        p.model.launch(LEGACY, [(address_of(again), 4096, "next owner")])
        p.model.cuStreamSynchronize(s)  # before the exit, as the guide requires
        free(again)
        del again
    assert_clean(p)


class _TorchTensor:
    def __init__(self, door):
        self.door, self.device_pointer_value = door, door.malloc(4096, 0, 0)

    def free(self):
        self.door.free(self.device_pointer_value, 4096, 0, 0)


def test_a_reuse_a_reset_overtakes_is_served_by_the_next_generation(programs):
    # The usage tracker's periodic drain is Python, where another thread may reset: it runs before a kept block is
    # taken, so no reuse completes against the generation a reset dropped (rule 12).
    p = programs(arena=False)
    mr = p.core_resource
    reset_now = [True]

    def drain_if_due():  # where the GIL may pass to a thread that resets
        if reset_now:
            reset_now.clear()
            p.mm.reset()
    p.mm.usage.drain_if_due = drain_if_due
    first = mr.allocate(4096)
    mr.deallocate(first.device_pointer_value, 4096, None)
    for _ in range(native_module().PER_SIZE * 1024):
        mine = mr.allocate(4096)
        if not reset_now:  # the reset ran inside this allocation
            other = p.allocate(4096)  # the next generation's block: a Numba array
            assert mine.device_pointer_value != other.address, "two live owners of one address"
            p.model.launch(LEGACY, [(mine.device_pointer_value, 4096, "buffer"), (other.address, 4096, "array")])
            mine.deallocate(None)
            p.drop(other)
            break
        mr.deallocate(mine.device_pointer_value, 4096, None)
    else:
        pytest.fail("the drain never ran")
    assert_clean(p)


def native_module():
    from numba_pool.cuda import _native
    return _native


def test_the_cupy_door_is_made_once_when_two_threads_race_to_it(programs, monkeypatch):
    # Thread B's first null-stream allocation starts while A makes the door: B waits and uses A's door (one made,
    # never replaced: its arrays' owners free through it).
    import threading

    import numba_pool.plugin.cupy_allocator as cupy_door_module
    from numba_pool.plugin.state import ProcessState

    p = programs(arena=False)
    _cupy_stand_in(p, monkeypatch, door=False)  # the door is made by the race
    made_doors = []

    def make(_door=cupy_door_module.CupyDoor):
        made_doors.append(_door(find_manager=lambda device_id, name: p.mm))
        return made_doors[-1]
    monkeypatch.setattr(cupy_door_module, "CupyDoor", make)
    state, threads, theirs = {"value": None, "gets": 0}, [], []

    def get(self):
        state["gets"] += 1
        if state["gets"] == 2 and threading.current_thread() is threading.main_thread():  # A, making the door
            threads.append(threading.Thread(target=lambda: theirs.append(cupy_allocator(4096))))
            threads[0].start()
        return state["value"]
    monkeypatch.setattr(ProcessState, "cupy_door", property(get, lambda self, value: state.update(value=value)),
                        raising=False)
    mine = cupy_allocator(4096)
    threads[0].join()
    assert len(made_doors) == 1
    p.model.launch(LEGACY, [(mine.ptr, 4096, "A"), (theirs[0].ptr, 4096, "B")])
    del mine
    theirs.clear()
    monkeypatch.undo()
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_cupys_retry_in_a_thread_without_a_context_logs_no_failure(programs, monkeypatch):
    from cuda_model import CONTEXT

    p = programs(arena=False, adaptors=True)  # NUMBA_POOL_LOG on
    _cupy_stand_in(p, monkeypatch, free=lambda ptr: p.model.cuCtxPushCurrent(CONTEXT))
    made = []
    p.bare.submit(lambda: made.append(cupy_allocator(4096))).result()
    array = made.pop()
    p.model.launch(LEGACY, [(array.ptr, 4096, "array")])
    del array
    assert "allocate failure" not in [row[2] for row in p.mm.log._rows]
    assert_clean(p)


def test_a_cuda_core_allocation_failing_not_for_memory_logs_no_allocate_failure(programs, monkeypatch):
    # From a second review: the log's allocate failure rows are out-of-memory only, at every door
    from cuda.bindings.driver import CUresult

    p = programs(arena=False, adaptors=True)  # NUMBA_POOL_LOG on
    mr = p.core_resource

    def fails(*args, **kwargs):
        raise CudaAPIError(CUresult.CUDA_ERROR_INVALID_CONTEXT, "no context")
    monkeypatch.setattr(p.mm, "allocate_block", fails)
    with pytest.raises(CudaAPIError):
        mr.allocate(4096)  # the legacy stream: the free list's Python end
    monkeypatch.undo()
    assert "allocate failure" not in [row[2] for row in p.mm.log._rows]
    assert_clean(p)
