"""The PyTorch door's callbacks (:class:`numba_pool.plugin.torch_allocator.TorchDoor`) on the CUDA model, called
as PyTorch's pluggable allocator calls them: ``malloc(size, device, stream)`` and ``free(ptr, size, device,
stream)`` with raw stream handles, no frontend in between.  (CuPy's and PyTorch's own objects need a GPU:
tests/gpu/test_gpu_library_doors.py.)"""

from __future__ import annotations

import pytest
from cuda.bindings import driver as real_cu

from cuda_model.checks import assert_clean
from numba_pool.allocator import captures
from numba_pool.cuda.streams import as_stream_ref
from numba_pool.plugin import torch_allocator
from numba_pool.plugin.torch_allocator import TorchDoor


def _door(p, monkeypatch) -> TorchDoor:
    return TorchDoor(find_manager=lambda device_id, door: p.mm)


def _stream(p) -> int:
    return int(p.model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1])


def _freed_after_another_streams_use(p, door: TorchDoor) -> int:
    """A tensor allocated on stream A is used by a kernel on B, freed naming B (its last user), and the
    next tensor on A used there (the model reports a use of the first's memory before B's kernel ends).
    Returns the second tensor's address."""
    a, b = _stream(p), _stream(p)
    ptr = door._malloc(1000, 0, a)
    p.model.wait(b, a)
    p.model.launch(b, [(ptr, 1000, "first")])
    door._free(ptr, 1000, 0, b)
    again = door._malloc(1000, 0, a)
    p.model.launch(a, [(again, 1000, "second")])
    door._free(again, 1000, 0, a)
    return ptr if again == ptr else 0


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_tensor_block_comes_from_the_pool_and_goes_back(programs, monkeypatch, arena):
    p = programs(arena=arena)
    door = _door(p, monkeypatch)
    s = _stream(p)
    ptr = door._malloc(4096, 0, s)
    stats = p.mm.statistics()
    assert ptr and stats.bytes_in_use == 4096 and stats.total_allocations == 1, stats
    assert door._malloc(0, 0, s) is None  # PyTorch's empty tensors own no memory
    p.model.launch(s, [(ptr, 4096, "tensor")])
    door._free(ptr, 4096, 0, s)
    door._free(ptr, 4096, 0, s)  # a second free of the same pointer: nothing (the block went back once)
    assert door._malloc(4096, 0, s) == ptr  # the stream's own block, free for it at once
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_free_naming_another_stream_waits_for_it(programs, monkeypatch, arena):
    control = programs(arena=arena)
    _freed_after_another_streams_use(control, _door(control, monkeypatch))
    assert_clean(control)

    class Forgetful(TorchDoor):  # planted: the free ignores the stream PyTorch names
        def _free(self, ptr, size, device, stream):
            block, allocator, _ = self._blocks.pop(ptr)
            allocator.deallocate(block, None)

    planted = programs(arena=arena)
    assert _freed_after_another_streams_use(planted, Forgetful(find_manager=lambda device_id, door: planted.mm))
    assert any(v.kind == "unordered reuse" for v in planted.model.violations), planted.model.violations
    planted.model.violations.clear()


def test_an_allocation_that_fails_returns_null_and_says_why_in_one_line(programs, monkeypatch, capsys):
    p = programs(arena=False, max_size=1 << 20)
    door = _door(p, monkeypatch)
    assert door._malloc(8 << 20, 0, 0) is None
    err = capsys.readouterr().err.strip()
    assert err.startswith("numba_pool.torch_allocator: ") and "out of memory" in err and "\n" not in err, err
    ptr = door._malloc(4096, 0, 0)  # the pool goes on working
    assert ptr
    door._free(ptr, 4096, 0, 0)
    assert_clean(p)


def test_a_door_allocation_is_in_the_history_with_its_door_and_its_callers_line(programs, monkeypatch):
    # Issue 35, item 5: each allocation tagged with the door it came through; its stack starts at the
    # line that asked the library (here, this test's call of the callback PyTorch would make).
    import numba_pool
    from numba_pool.plugin.state import process

    p = programs(arena=False)
    door = _door(p, monkeypatch)
    numba_pool.record_history()
    try:
        ptr = door._malloc(4096, 0, 0)
        history = process.recording
        event = history.live[(p.mm.device_id, ptr)]
        assert (event.kind, event.size) == ("torch", 4096)
        assert event.frames[0].co_name == "test_a_door_allocation_is_in_the_history_with_its_door_and_its_callers_line"
        door._free(ptr, 4096, 0, 0)
        assert (p.mm.device_id, ptr) not in history.live
        assert [(e.action, e.kind) for e in history.entries if e.address == ptr] == [("alloc", "torch"), ("free", "torch")]
    finally:
        numba_pool.record_history(False)
    assert_clean(p)


def test_a_pinned_door_allocation_with_no_current_context_runs_in_the_owners(programs):
    # CuPy may ask its pinned allocator before it made a context current (seen on the GPU: cuMemHostAlloc
    # failed with CUDA_ERROR_INVALID_CONTEXT); the door runs the allocation in the manager's context.
    from numba_pool.allocator.host_blocks import host_flags
    from numba_pool.cuda.errors import CudaAPIError
    from numba_pool.cuda.streams import LEGACY

    p = programs(arena=False, host=True)
    host = p.mm.host
    flags = host_flags(False, True, False)
    block = p.bare.submit(host.owner.call, host.allocate_block, 4096, LEGACY, flags).result()
    assert block.ptr and p.mm.statistics().host_in_use_bytes == 4096
    with pytest.raises(CudaAPIError, match="CUDA_ERROR_INVALID_CONTEXT"):  # without it
        p.bare.submit(host.allocate_block, 4096, LEGACY, flags).result()
    host.deallocate(block)
    assert_clean(p)


def test_the_doors_find_their_manager_once_and_let_it_go_with_numba(monkeypatch):
    # The CuPy and PyTorch doors look the manager up per allocation: a cache (5.4 µs a lookup before it,
    # 0.2 µs with it, on the development machine), weak, so that a manager Numba dropped is looked up again.
    import gc

    from numba_pool.plugin import serving

    class Manager:
        context = object()

    looked = []
    made = [Manager(), Manager()]
    monkeypatch.setattr(serving.process, "door_managers", {})
    monkeypatch.setattr(serving, "_find", lambda device_id, door: looked.append(device_id) or made.pop(0))
    first = serving.serving_manager(0, "t")
    assert serving.serving_manager(0, "t") is first and looked == [0]
    del first
    gc.collect()
    assert serving.serving_manager(0, "t") is not None and looked == [0, 0]


@pytest.mark.parametrize("recording", [False, True], ids=["plain", "history"])
def test_cupys_owner_gives_the_block_back_when_cupy_drops_it(programs, recording):
    # What CuPy's UnownedMemory keeps alive (numba_pool.plugin.cupy_allocator._DeviceOwner): its collection
    # is the block's drop (rule 14 with no stream: ordered on the allocation stream).
    import numba_pool
    from numba_pool.cuda.streams import LEGACY
    from numba_pool.plugin.cupy_allocator import device_owner
    from numba_pool.plugin.serving import recorded
    from numba_pool.plugin.state import process

    p = programs(arena=False)
    numba_pool.record_history(recording)
    try:
        block = p.mm.allocate_block(4096, LEGACY)
        owner = device_owner(block, recorded(p.mm, block, "cupy"))
        assert p.mm.statistics().bytes_in_use == 4096
        del owner, block
        assert p.mm.statistics().bytes_in_use == 0
        if recording:
            assert [e.action for e in process.recording.entries] == ["alloc", "free"]
            assert process.recording.entries[0].kind == "cupy"
    finally:
        numba_pool.record_history(False)
    assert_clean(p)


def _cache_block_used_on_a_named_stream(p, mr, use) -> None:
    """cuda.core's pinned or managed resource: a buffer allocated on stream A is used on B, deallocated naming
    B (its last user); A's work is then seen complete, and the next buffer of the size is written by the host
    at once.  (cuda.core's Buffer itself needs a driver: the resource's own steps are called here.)"""
    from numba_pool.cuda.streams import LEGACY, StreamRef

    a, b = _stream(p), _stream(p)
    block, source = mr._take(4096, StreamRef(real_cu.CUstream(a)), p.mm)
    source.fences.fence_blocks = 1  # fence at the next allocation (else once 32 wait)
    mr._blocks[block.address] = (block, source, None)
    p.model.wait(b, a)
    use(b, block.address)
    mr.deallocate(block.address, 4096, b)
    other, _ = mr._take(8192, LEGACY, p.mm)  # records the released block's legacy-stream fence
    for done in (a, LEGACY.value):  # the allocation stream and the fence are seen done; B may not be
        assert p.model.cuStreamSynchronize(real_cu.CUstream(done))[0] == 0
    again, _ = mr._take(4096, LEGACY, p.mm)
    p.model.host_use(again.address, 4096, "next owner")
    source.deallocate(again)
    source.deallocate(other)


@pytest.mark.parametrize("kind", ["pinned", "managed"])
def test_cuda_cores_pinned_and_managed_resources_wait_for_the_named_stream(programs, kind):
    from numba_pool.allocator.host_blocks import HostBlocks
    from numba_pool.plugin.resource import ManagedMemoryResource, PinnedMemoryResource

    def use(p):
        if kind == "pinned":
            return lambda stream, address: p.model.copy_async(stream, address, 4096, "first")
        return lambda stream, address: p.model.launch(stream, [(address, 4096, "first")])

    cls = PinnedMemoryResource if kind == "pinned" else ManagedMemoryResource
    control = programs(arena=False, host=kind == "pinned")
    _cache_block_used_on_a_named_stream(control, cls(manager=control.mm), use(control))
    assert_clean(control)

    planted = programs(arena=False, host=kind == "pinned")
    real = HostBlocks.deallocate

    def forgets(self, block, stream=None):  # planted: the named stream ignored
        real(self, block, None)

    HostBlocks.deallocate = forgets
    try:
        _cache_block_used_on_a_named_stream(planted, cls(manager=planted.mm), use(planted))
    finally:
        HostBlocks.deallocate = real
    assert any("unordered reuse" in v.kind for v in planted.model.violations), planted.model.violations
    planted.model.violations.clear()


def test_cuda_cores_cache_resources_say_why_in_one_line_when_the_cache_is_off(programs):
    from numba_pool.cuda.streams import LEGACY
    from numba_pool.plugin.resource import PinnedMemoryResource

    p = programs(arena=False)  # NUMBA_POOL_HOST off: no pinned cache
    with pytest.raises(RuntimeError, match="no cache serves this memory resource: NUMBA_POOL_HOST is off"):
        PinnedMemoryResource(manager=p.mm)._take(4096, LEGACY, p.mm)


def test_a_door_allocation_is_logged_with_its_door_and_replays_as_device_memory(programs, monkeypatch, tmp_path):
    # Issue 35, item 5: NUMBA_POOL_LOG's rows for a door's allocation, free and failure name the door in the Kind
    # column; the replay tool reads them as device memory.
    import csv

    from numba_pool.observe.alloclog import AllocationLog
    from numba_pool_tools.replay.log import read_log

    p = programs(arena=False, max_size=1 << 20)
    path = tmp_path / "doors.csv"
    p.mm.log = AllocationLog(str(path))
    try:
        door = _door(p, monkeypatch)
        ptr = door._malloc(4096, 0, 0)
        door._free(ptr, 4096, 0, 0)
        assert door._malloc(8 << 20, 0, 0) is None  # out of memory: a failure row
        p.mm.log.flush()
    finally:
        p.mm.log.close()
        p.mm.log = None
    with path.open() as f:
        rows = list(csv.reader(f))[1:]
    assert [(r[2], r[3], r[4], r[6]) for r in rows] == [
        ("allocate", f"{ptr:#x}", "4096", "torch"), ("free", f"{ptr:#x}", "4096", "torch"),
        ("allocate failure", "0x0", str(8 << 20), "torch")]
    parsed = read_log(path)
    assert (len(parsed.operations), parsed.allocations, parsed.failures, parsed.managed) == (2, 1, 1, 0)
    assert_clean(p)


def test_a_cuda_error_finding_the_manager_returns_null_and_says_why_in_one_line(capsys):
    # The callback's failure path once logged the failure through the manager it had not found (None): an
    # AttributeError out of a C callback.  The failure row needs a manager; without one, the line alone.
    from numba_pool.cuda.errors import CudaAPIError

    def no_manager(device_id, door):
        raise CudaAPIError(2, "cuMemPoolCreate failed: out of memory")

    assert TorchDoor(find_manager=no_manager)._malloc(4096, 0, 0) is None
    err = capsys.readouterr().err.strip()
    assert err.startswith("numba_pool.torch_allocator: ") and "cuMemPoolCreate failed" in err and "\n" not in err, err


def test_the_cupy_door_keeps_its_last_own_stream_only():
    """Note [The last stream named] for CuPy: its own ``Stream`` objects are kept with their StreamRef (the idle key is
    asked once); an ``ExternalStream`` (a handle it does not own) and a per-thread default stream are not."""
    from numba_pool.cuda.streams import StreamRef
    from numba_pool.plugin.cupy_allocator import _stream_ref
    from numba_pool.plugin.state import process

    def stream_class(name, handle):
        return type(name, (), {"ptr": handle, "__cuda_stream__": lambda self: (0, handle)})

    saved = process.cupy_stream
    try:
        own = stream_class("Stream", 0x5000)()
        first = _stream_ref(own)
        assert isinstance(first, StreamRef) and first.value == 0x5000 and _stream_ref(own) is first
        external = stream_class("ExternalStream", 0x6000)()
        assert _stream_ref(external) is not _stream_ref(external) and process.cupy_stream[0] is own
        per_thread = stream_class("Stream", int(real_cu.CU_STREAM_PER_THREAD))()
        assert _stream_ref(per_thread).thread is not None and process.cupy_stream[0] is own
    finally:
        process.cupy_stream = saved


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_handle_the_driver_gives_again_is_a_new_stream_to_the_torch_door(programs, monkeypatch, arena):
    # Note [A raw handle's stream]: the door keeps the last stream by handle and id; a destroyed stream's handle
    # given to a new stream must not hand the new stream the old one's idle block while the old one's kernel runs.
    def tensor_used_and_freed(stream: int, kernel: str) -> None:
        ptr = door._malloc(4096, 0, stream)
        p.model.launch(stream, [(ptr, 4096, kernel)])
        door._free(ptr, 4096, 0, stream)  # idle for the stream (rule 7a)

    p = programs(arena=arena)
    door, old = _door(p, monkeypatch), _stream(p)
    tensor_used_and_freed(old, "old stream's kernel")
    p.model.cuStreamDestroy(real_cu.CUstream(old))  # its kernel may still run
    assert _stream(p) == old  # the handle, given again to a new stream (the model does, as the driver may)
    tensor_used_and_freed(old, "new stream's kernel")
    assert_clean(p)


def test_a_tensor_allocated_in_a_capture_leaves_the_capture_valid(programs, monkeypatch):
    # Note [A raw handle's stream]: the door never asks a capturing stream's id (the query invalidates the capture);
    # torch.cuda.graph allocates through the pluggable allocator on the capturing stream.
    p = programs(arena=False)
    door, s = _door(p, monkeypatch), _stream(p)
    door._free(door._malloc(4096, 0, s), 4096, 0, s)  # the door has seen the stream
    relaxed = real_cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    assert p.model.cuStreamBeginCapture(real_cu.CUstream(s), relaxed)[0] == real_cu.CUresult.CUDA_SUCCESS
    ptr = door._malloc(4096, 0, s)
    status = p.model.cuStreamIsCapturing(real_cu.CUstream(s))[1]
    assert ptr and status == real_cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE, (ptr, status)
    door._free(ptr, 4096, 0, s)  # a free node of the graph
    err, graph = p.model.cuStreamEndCapture(real_cu.CUstream(s))
    assert err == real_cu.CUresult.CUDA_SUCCESS
    assert captures.refresh(p.model) is False and captures.underway == []  # numba_pool saw it end


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_tensor_alive_across_a_reset_releases_nothing_else_when_dropped(programs, monkeypatch, arena):
    """Note [An address a reset gave again]: the pool gives a dangling tensor's address to a new block; the door
    sets that block aside, and the dangling tensor's free releases it, not the new tensor's."""
    p = programs(arena=arena)
    door, s = _door(p, monkeypatch), _stream(p)
    old = door._malloc(744, 0, s)
    p.mm.reset()
    new = door._malloc(744, 0, s)
    assert new != old and [at for at, kept in door._blocks.aside.items() if kept] == [old]  # ``old`` given again
    assert p.mm.statistics().bytes_in_use == 744  # the new tensor's: the block set aside is released, held
    door._free(old, 744, 0, s)  # the dangling tensor dropped
    assert p.mm.statistics().bytes_in_use == 744 and not any(door._blocks.aside.values())
    p.model.launch(s, [(new, 744, "new tensor")])  # still its own
    p.mm.trim()  # the block set aside goes back after a fence (or a synchronize), once s's work is seen done
    again = door._malloc(744, 0, s)
    assert again == old  # the address set aside is free again
    p.model.launch(s, [(again, 744, "third tensor")])
    door._free(new, 744, 0, s)
    door._free(again, 744, 0, s)
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
@pytest.mark.parametrize("freed_on", ["its own stream", "another stream"])
def test_a_dangling_tensors_free_orders_what_was_set_aside_after_its_stream(programs, monkeypatch, freed_on, arena):
    """The dangling tensor's late work (on the stream its free names, else its allocation stream, as PyTorch's
    frees name) lands in the block set aside at its address: that block goes back only after that stream's work,
    though it was allocated on another."""
    p = programs(arena=arena)
    door, s, t = _door(p, monkeypatch), _stream(p), _stream(p)
    old = door._malloc(744, 0, t if freed_on == "its own stream" else s)
    p.mm.reset()
    new = door._malloc(744, 0, s)  # ``old`` set aside
    p.model.launch(t, [(old, 744, "the dangling tensor's late kernel")])
    door._free(old, 744, 0, t)
    again = door._malloc(744, 0, s)
    p.model.launch(s, [(again, 744, "the next tensor")])
    door._free(again, 744, 0, s)
    door._free(new, 744, 0, s)
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_block_set_aside_is_reused_by_no_door_before_its_holders_free(programs, monkeypatch, arena):
    """The block set aside at a dangling tensor's address (Note [An address a reset gave again]) is released at once on
    its stream s, but held: a Numba array allocated on s meanwhile (a door that keeps no table) never gets it while
    the dangling tensor's late kernel may still write it."""
    p = programs(arena=arena)
    door, s, t = _door(p, monkeypatch), _stream(p), _stream(p)
    old = door._malloc(744, 0, t)
    p.mm.reset()
    new = door._malloc(744, 0, s)  # ``old`` set aside
    p.model.launch(t, [(old, 744, "the dangling tensor's late kernel")])
    array = p.allocate(744, s)
    p.launch(s, [array])
    door._free(old, 744, 0, t)
    door._free(new, 744, 0, s)
    assert_clean(p)


def test_an_allocation_made_again_is_in_the_history_at_its_callers_line(programs, monkeypatch):
    """A tensor whose first block was set aside (Note [An address a reset gave again]) is recorded with the stack of
    the line that asked for it, as any other: the retry's frames are skipped."""
    import numba_pool
    from numba_pool.plugin.state import process

    p = programs(arena=False)
    door, s = _door(p, monkeypatch), _stream(p)
    old = door._malloc(744, 0, s)
    p.mm.reset()
    numba_pool.record_history()
    try:
        new = door._malloc(744, 0, s)
        assert any(door._blocks.aside.values())  # the retry ran
        event = process.recording.live[(p.mm.device_id, new)]
        assert event.frames[0].co_name == "test_an_allocation_made_again_is_in_the_history_at_its_callers_line"
        door._free(old, 744, 0, s)
        door._free(new, 744, 0, s)
    finally:
        numba_pool.record_history(False)
    assert_clean(p)


class _Interleaved(dict):
    """A DoorTable's ``aside`` whose address dicts run ``between()`` (another thread's free, interleaved there)
    just before (``first``) or just after an entry goes in: the door table's race."""

    def __init__(self, between, first: bool):
        super().__init__()
        self.between, self.first = between, first

    def setdefault(self, address, default):
        made = _Hooked()
        made.between, made.first, self.between = self.between, self.first, None
        return super().setdefault(address, made)


class _Hooked(dict):
    def __setitem__(self, key, value):
        between, self.between = self.between, None
        if between is not None and self.first:
            between()
        super().__setitem__(key, value)
        if between is not None and not self.first:
            between()


@pytest.mark.parametrize("when", ["before the set-aside", "before its entry", "after its entry"])
def test_a_block_set_aside_as_its_holder_frees_is_released_once(programs, when):
    """The holder's free (another thread) runs after the door's ``setdefault`` found its address held: before the
    block goes aside, or as its entry goes in: released once either way, nothing left aside."""
    from numba_pool.cuda.streams import LEGACY
    from numba_pool.plugin.serving import DoorTable

    p = programs(arena=False)
    table = DoorTable()
    holder = p.mm.allocate_block(4096, LEGACY)
    stale = table[holder.address] = (holder, p.mm.allocator, None)

    def holder_frees():
        table.pop(holder.address)
        if table.aside and holder.address in table.aside:
            table.release_aside(holder.address, LEGACY)
    if when == "before the set-aside":
        holder_frees()
    else:
        table.aside = _Interleaved(holder_frees, first=when == "before its entry")
    block = p.mm.allocate_block(4096, LEGACY)  # another address; entered as if the pool gave the holder's
    table._set_aside(holder.address, (block, p.mm.allocator, None), LEGACY)
    assert not any(table.aside.values()) and p.mm.statistics().bytes_in_use == 4096, table.aside  # released once
    stale[0].free()
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_a_graphs_block_set_aside_goes_back_in_its_capture(programs):
    """A graph's block is not kept past its allocation call (its capture must free it): once another address is
    entered, it is released there, a free node."""
    from numba_pool.cuda.streams import LEGACY, as_stream_ref
    from numba_pool.plugin.serving import DoorTable

    p = programs(arena=False)
    s = _stream(p)
    table = DoorTable()
    holder = p.mm.allocate_block(4096, LEGACY)
    table[holder.address] = (holder, p.mm.allocator, None)
    relaxed = real_cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    assert p.model.cuStreamBeginCapture(real_cu.CUstream(s), relaxed)[0] == real_cu.CUresult.CUDA_SUCCESS
    ref = as_stream_ref(s)
    graphs = p.mm.allocate_block(4096, ref)
    assert graphs.capture is not None

    def allocate():
        block = p.mm.allocate_block(4096, ref)
        return block.address, (block, p.mm.allocator, None)
    try:
        address, entry = table.enter_again(holder.address, (graphs, p.mm.allocator, None), table[holder.address],
                                           allocate)
        assert address != holder.address and table[address] is entry and not table.aside
        assert graphs.ptr not in graphs.ledger  # freed in the capture (a free node)
        entry[0].free()
    finally:  # the capture ends whatever failed: later tests must not run beside it
        err, graph = p.model.cuStreamEndCapture(real_cu.CUstream(s))
        ended = captures.refresh(p.model) is False
    assert err == real_cu.CUresult.CUDA_SUCCESS and ended
    holder.free()
    assert_clean(p)


@pytest.mark.parametrize("named_by", ["a cuda.core Stream", "a stream object"])
@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_buffer_closed_naming_another_stream_goes_back_after_its_work(programs, arena, named_by):
    """cuda.core's door: a Buffer allocated on A, used by a kernel on B and closed naming B (cuda.core passes a new
    ``Stream`` for it) goes back after B's kernel; closed naming A (a new ``Stream`` equal to A's), at once for A."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    p = programs(arena=arena)
    mr = ModelResource(manager=p.mm)
    a, b = _stream(p), _stream(p)
    on_a = Stream.from_handle(a) if named_by == "a cuda.core Stream" else _StreamObject(a)
    first = mr.allocate(1000, on_a)
    p.model.wait(b, a)
    p.model.launch(b, [(first.device_pointer_value, 1000, "first")])
    mr.deallocate(first.device_pointer_value, 1000, Stream.from_handle(b))
    second = mr.allocate(1000, on_a)
    p.model.launch(a, [(second.device_pointer_value, 1000, "second")])
    mr.deallocate(second.device_pointer_value, 1000, Stream.from_handle(a))
    third = mr.allocate(1000, on_a)
    assert third.device_pointer_value == second.device_pointer_value  # A's own block, free for A at once
    p.model.launch(a, [(third.device_pointer_value, 1000, "third")])
    third.deallocate(None)
    assert_clean(p)


class _StreamObject:
    """A library's stream object that is not cuda.core's (CuPy's, PyTorch's): ``__cuda_stream__`` only."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_buffer_alive_across_a_reset_releases_nothing_else_when_closed(programs, arena):
    """Note [An address a reset gave again] in cuda.core's door: ``MemoryResource.allocate`` sets aside a block at a
    dangling buffer's address, and that buffer's ``deallocate`` releases it."""
    from cuda_model.harness import ModelResource

    p = programs(arena=arena)
    mr = ModelResource(manager=p.mm)
    old = mr.allocate(744)
    p.mm.reset()
    new = mr.allocate(744)
    assert new.device_pointer_value != old.device_pointer_value and sum(map(len, mr._blocks.aside.values())) == 1
    old.deallocate(None)
    assert p.mm.statistics().bytes_in_use == 744 and not any(mr._blocks.aside.values())
    new.deallocate(None)
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def _on_per_thread_stream(p, door_kind: str):
    """``(allocate(), free(address))`` of 1000 bytes through a door (``cuda.core``: ``ModelResource`` with cuda.core
    ``Stream``s, ``torch``: PyTorch's callbacks), naming ``CU_STREAM_PER_THREAD``: the calling thread's stream."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    per_thread = int(real_cu.CU_STREAM_PER_THREAD)
    if door_kind == "torch":
        door = _door(p, None)
        return (lambda: door._malloc(1000, 0, per_thread)), (lambda ptr: door._free(ptr, 1000, 0, per_thread))
    mr = ModelResource(manager=p.mm)
    return (lambda: mr.allocate(1000, Stream.from_handle(per_thread)).device_pointer_value,
            lambda ptr: mr.deallocate(ptr, 1000, Stream.from_handle(per_thread)))


@pytest.mark.parametrize("door_kind", ["cuda.core", "torch"])
@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_free_from_another_thread_naming_the_per_thread_stream_synchronizes(programs, arena, door_kind):
    """Thread 0 allocates on its per-thread default stream; thread 1's per-thread stream uses the buffer last, and
    thread 1 frees it naming ``CU_STREAM_PER_THREAD``, as PyTorch's free and cuda.core's close do.  Thread 1 cannot
    name thread 0's stream, after which the block must go back: the release synchronizes and says so (rule 8a)."""
    import warnings

    from cuda_model.checks import FALLBACK

    per_thread = int(real_cu.CU_STREAM_PER_THREAD)
    p = programs(arena=arena, threads=2)
    allocate, free = _on_per_thread_stream(p, door_kind)
    ptr = p.run(0, allocate)
    p.run(1, p.model.launch, per_thread, [(ptr, 1000, "thread 1's kernel")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p.run(1, free, ptr)
    assert any(FALLBACK in str(w.message) for w in caught), [str(w.message) for w in caught]
    again = p.run(0, allocate)
    p.run(0, p.model.launch, per_thread, [(again, 1000, "thread 0's next kernel")])
    p.run(0, free, again)
    assert_clean(p)


def test_a_deallocate_naming_no_stream_raises_and_loses_nothing(programs):
    """cuda.core's door given something that is not a stream (or a closed ``Stream``) at ``deallocate``: one line
    naming it, and the buffer's block stays live and counted, freed by the next ``deallocate``."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    p = programs(arena=False)
    mr = ModelResource(manager=p.mm)
    buffer = mr.allocate(744, _StreamObject(_stream(p)))
    with pytest.raises(TypeError, match="^numba_pool: str is not a CUDA stream"):
        mr.deallocate(buffer.device_pointer_value, 744, "stream 7")
    closed = Stream.from_handle(_stream(p))
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        mr.deallocate(buffer.device_pointer_value, 744, closed)
    assert p.mm.statistics().bytes_in_use == 744 and len(mr._blocks) == 1
    buffer.deallocate(None)  # its stream's: kept for it (Note [The doors' free lists]), freed in the figures
    assert p.mm.statistics().bytes_in_use == 0
    p.mm.trim()  # gives it back
    assert not mr._blocks
    assert_clean(p)


@pytest.mark.parametrize("door_kind", ["cuda.core", "torch"])
@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_free_from_another_thread_held_back_by_a_capture_waits_for_that_threads_stream(programs, arena, door_kind):
    """As ``test_a_free_from_another_thread_naming_the_per_thread_stream_synchronizes``, but a capture (thread 2's) is
    under way at thread 1's free: the release is held back and runs at
    thread 0's next allocation, after the capture.  There ``CU_STREAM_PER_THREAD`` is thread 0's stream; the release
    must still wait for thread 1's, which the free named (the door takes it as another stream than the allocation's).
    Seen failing (unordered reuse) with the doors taking the handle for the allocation's stream from any thread."""
    per_thread = int(real_cu.CU_STREAM_PER_THREAD)
    p = programs(arena=arena, threads=3)
    allocate, free = _on_per_thread_stream(p, door_kind)
    captured = _stream(p)
    relaxed = real_cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    ptr = p.run(0, allocate)
    p.run(1, p.model.launch, per_thread, [(ptr, 1000, "thread 1's kernel")])
    assert p.run(2, p.model.cuStreamBeginCapture, real_cu.CUstream(captured), relaxed)[0] == real_cu.CUresult.CUDA_SUCCESS
    try:
        graphs = p.run(2, p.mm.allocate_block, 4096, as_stream_ref(captured))  # numba_pool knows of the capture
        assert captures.underway
        p.run(1, free, ptr)
        assert captures.held_back() == 1  # rule 13
        p.run(2, graphs.free)  # a free node
    finally:
        err, graph = p.run(2, p.model.cuStreamEndCapture, real_cu.CUstream(captured))
        if captures.held_back():  # on a failure above: no release of this program left for later tests to run
            captures.underway.clear()
            captures._deferred.take()
    assert err == real_cu.CUresult.CUDA_SUCCESS
    again = p.run(0, allocate)  # the held-back release runs here, in thread 0
    assert captures.held_back() == 0 and not captures.underway
    p.run(0, p.model.launch, per_thread, [(again, 1000, "thread 0's next kernel")])
    p.run(0, free, again)
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_buffer_closed_naming_a_stream_behind_a_waiting_kernel_deadlocks_nothing(programs, arena):
    """cuda.core's door: a Buffer allocated and used on A, then closed naming S while a kernel on S waits for a copy
    on A.  cuda.core's own pool frees on S, after the kernel, and the copy on A runs; no release may order A after
    the kernel (the model reports such a copy as a deadlock: Note [A named stream is not waited for], found by the
    long fuzz, seed 3447, through a block set aside at a dangling buffer's address)."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    p = programs(arena=arena)
    mr = ModelResource(manager=p.mm)
    a, s = _stream(p), _stream(p)
    buffer = mr.allocate(1000, Stream.from_handle(a))
    p.model.launch(a, [(buffer.device_pointer_value, 1000, "on A")])
    p.model.wait(s, a)  # the program orders the use before the free on S, as cuda.core's deallocate asks
    p.launch_waiting(s)
    mr.deallocate(buffer.device_pointer_value, 1000, Stream.from_handle(s))
    p.release_waiting(a)
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_dangling_buffer_closed_behind_a_waiting_kernel_deadlocks_nothing(programs, arena):
    """The long fuzz's seed 3447: a buffer on a blocking stream X dangles across a reset, a buffer on A is given its
    address (the block set aside, Note [An address a reset gave again]), and the dangling buffer is closed while a
    kernel on the legacy stream waits for a copy on A.  The block set aside goes back after X's work so far, which
    follows the kernel (X is blocking), with no stream waiting for it (Note [A named stream is not waited for])."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    p = programs(arena=arena)
    mr = ModelResource(manager=p.mm)
    x = int(p.model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_DEFAULT)[1])
    a = _stream(p)
    old = mr.allocate(744, Stream.from_handle(x))
    p.mm.reset()
    new = mr.allocate(744, Stream.from_handle(a))
    assert sum(map(len, mr._blocks.aside.values())) == 1  # the scenario: a block set aside at old's address
    p.launch_waiting(int(real_cu.CU_STREAM_LEGACY))
    old.deallocate(None)
    p.release_waiting(a)
    p.model.launch(a, [(new.device_pointer_value, 744, "new")])
    new.deallocate(None)
    assert_clean(p)


def test_an_arena_block_closed_naming_another_stream_goes_back_once_that_streams_work_is_seen_done(programs):
    """Note [A named stream is not waited for], the arena: a buffer on A used on B and closed naming B goes back to
    A's domain after a fence, once the host sees B's (and A's) work so far done, events, never a stream's wait: not
    while B's kernel may run (the fence and A seen done), and then at A's next allocations."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    p = programs(arena=True)
    arena = p.mm.allocator.arena
    arena.quarantine_limit = -1  # fence before every miss
    arena.fences.fence_blocks = 1
    mr = ModelResource(manager=p.mm)
    a, b = _stream(p), _stream(p)
    legacy = real_cu.CUstream(int(real_cu.CU_STREAM_LEGACY))
    first = mr.allocate(1000, Stream.from_handle(a))
    p.model.wait(b, a)
    p.model.launch(b, [(first.device_pointer_value, 1000, "first")])
    mr.deallocate(first.device_pointer_value, 1000, Stream.from_handle(b))
    taken = []
    for synchronized in ([legacy, real_cu.CUstream(a)], [legacy, real_cu.CUstream(a), real_cu.CUstream(b)]):
        taken.append(mr.allocate(256))  # a legacy allocation: records a fence
        for stream in synchronized:
            assert p.model.cuStreamSynchronize(stream)[0] == 0
        taken += [mr.allocate(1000, Stream.from_handle(a)) for _ in range(3)]
        came_back = first.device_pointer_value in [t.device_pointer_value for t in taken]
        assert came_back == (len(synchronized) == 3)  # only once B's kernel is seen done
    for t in taken:
        p.model.launch(a, [(t.device_pointer_value, t.size, "next")])
        t.deallocate(None)
    assert_clean(p)


def test_blocks_held_back_by_a_busy_named_stream_make_no_fence_of_their_own(programs):
    """Note [A named stream is not waited for]: 40 arena blocks closed naming B while B's kernel runs wait for B on
    the host; legacy allocations meanwhile fence as if they were not there (none is due: 20 allocations, nothing
    else released), and once B is seen done they go back, every event destroyed."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    p = programs(arena=True)
    arena = p.mm.allocator.arena
    mr = ModelResource(manager=p.mm)
    a, b = _stream(p), _stream(p)
    events_before = p.model.live_events()
    buffers = [mr.allocate(1000, Stream.from_handle(a)) for _ in range(40)]
    p.model.wait(b, a)
    p.model.launch(b, [(buffer.device_pointer_value, 1000, "on B") for buffer in buffers])
    for buffer in buffers:
        mr.deallocate(buffer.device_pointer_value, 1000, Stream.from_handle(b))
    legacy = real_cu.CUstream(int(real_cu.CU_STREAM_LEGACY))
    taken, fences = [], arena.fences.recorded
    for _ in range(20):
        taken.append(mr.allocate(256))
        assert p.model.cuStreamSynchronize(legacy)[0] == 0
        taken.append(mr.allocate(600, Stream.from_handle(a)))
        assert p.model.cuStreamSynchronize(real_cu.CUstream(a))[0] == 0
    assert arena.fences.recorded - fences <= 1, arena.fences.recorded - fences
    assert p.model.cuStreamSynchronize(real_cu.CUstream(b))[0] == 0
    for buffer in taken:
        buffer.deallocate(None)
    p.mm.trim()
    assert p.model.live_events() - events_before <= 2  # the arena's own: a domain's event, a fence's spare
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_block_set_aside_on_a_stream_destroyed_since_goes_back_without_it(programs, arena):
    """Note [An address a reset gave again]: a buffer dangles across a reset, a buffer on A is given its address (the
    block set aside, on A) and then freed, A is destroyed (nothing of the program's is on it), then the dangling
    buffer is closed: the block set aside must go back without naming A (found by the long fuzz, seed 3450: its
    release named A, destroyed)."""
    from cuda.core import Stream
    from cuda_model.harness import ModelResource

    p = programs(arena=arena)
    mr = ModelResource(manager=p.mm)
    old = mr.allocate(1)
    p.mm.reset()
    a = _stream(p)
    new = mr.allocate(1, Stream.from_handle(a))
    assert sum(map(len, mr._blocks.aside.values())) == 1  # the scenario: a block set aside at old's address
    p.model.launch(a, [(new.device_pointer_value, 1, "new")])
    new.deallocate(None)
    assert p.model.cuStreamSynchronize(real_cu.CUstream(a))[0] == 0
    assert p.model.cuStreamDestroy(real_cu.CUstream(a))[0] == 0
    old.deallocate(None)
    p.mm.trim()
    assert_clean(p)
