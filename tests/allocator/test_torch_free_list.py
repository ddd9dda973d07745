"""The PyTorch door's legacy-stream free list (Note [The doors' free lists] in
:mod:`numba_pool.plugin.free_lists`) on the CUDA model, through the compiled callbacks as PyTorch calls them:
what it keeps, what it never keeps, who gives its blocks back, and the statistics it keeps exact."""

from __future__ import annotations

import gc
import weakref

import pytest
from cuda.bindings import driver as real_cu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numba_pool
from cuda_model.checks import assert_clean
from cuda_model.harness import LEGACY, Program
from numba_pool.cuda.streams import LEGACY as LEGACY_REF
from numba_pool.cuda.errors import CudaAPIError
from numba_pool.plugin.state import process
from numba_pool.plugin.torch_allocator import TorchDoor

native = pytest.importorskip("numba_pool.cuda._native", reason="the free list is in the compiled module")
LEGACY_HANDLE = int(real_cu.CU_STREAM_LEGACY)  # 1; PyTorch's default stream is 0, the same stream
PER_THREAD_HANDLE = int(real_cu.CU_STREAM_PER_THREAD)


def _door(p) -> TorchDoor:
    return TorchDoor(find_manager=lambda device_id, door: p.mm)


def _stream(p) -> int:
    return int(p.model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1])


class _Tensor:  # what numba_pool.record_stream is given: an object with a device pointer
    def __init__(self, address: int):
        self.device_pointer_value = address


class _Hold:  # an IPC export's lease: a hold the block waits for (numba_pool.allocator.waits.Hold's defer)
    def defer(self, release) -> bool:
        raise AssertionError("a hold was taken on memory no tensor holds")


def _no_python(*args):
    raise AssertionError(f"the Python end was called: {args}")


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
@pytest.mark.parametrize("handle", [0, LEGACY_HANDLE], ids=["null", "CU_STREAM_LEGACY"])
def test_a_block_freed_on_the_legacy_stream_serves_the_next_request_of_its_size_without_python(programs, arena,
                                                                                               handle, monkeypatch):
    p = programs(arena=arena)
    door = _door(p)
    first = door.malloc(4096, 0, handle)
    p.model.launch(LEGACY, [(first, 4096, "first")])
    door.free(first, 4096, 0, handle)
    assert door.native.cached(0) == (1, 4096)
    monkeypatch.setattr(door, "_malloc", _no_python)  # the C ends look the door's Python ends up by name
    monkeypatch.setattr(door, "_free", _no_python)
    again = door.malloc(4096, 0, 0)
    assert again == first and door.native.reuses == 1 and door.native.cached(0) == (0, 0)
    p.model.launch(LEGACY, [(again, 4096, "second")])  # after the first in the legacy stream's order
    door.free(again, 4096, 0, 0)
    monkeypatch.undo()
    stats = p.mm.statistics()  # gives the kept block back first
    assert (stats.total_allocations, stats.total_frees, stats.bytes_in_use) == (2, 2, 0), stats
    assert door.native.cached(0) == (0, 0)
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_block_of_a_blocking_stream_or_freed_naming_another_stream_reaches_python(programs, arena):
    p = programs(arena=arena)
    door = _door(p)
    s, blocking = _stream(p), int(p.model.cuStreamCreate(0)[1])
    on_blocking = door.malloc(4096, 0, blocking)  # a free on a blocking stream orders more (Note [Idle blocks ...])
    door.free(on_blocking, 4096, 0, blocking)
    per_thread = door.malloc(4096, 0, PER_THREAD_HANDLE)  # a per-thread default stream may be captured
    door.free(per_thread, 4096, 0, PER_THREAD_HANDLE)
    legacy = door.malloc(4096, 0, 0)
    p.model.launch(s, [(legacy, 4096, "tensor")])
    door.free(legacy, 4096, 0, s)  # freed naming s: released after s's work, never kept for the legacy stream
    assert door.native.cached(0) == (0, 0)
    again = door.malloc(4096, 0, 0)
    p.model.launch(LEGACY, [(again, 4096, "next")])
    door.free(again, 4096, 0, 0)
    assert door.native.reuses == 0
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_tensor_recorded_for_another_stream_is_not_kept(programs, arena):
    # numba_pool.record_stream takes the block out of the live blocks (the allocator's on_wait): its free reaches
    # Python, whose release waits for the stream recorded.  Kept, the next tensor would reuse it at once.
    p = programs(arena=arena)
    door = _door(p)
    s = _stream(p)
    ptr = door.malloc(4096, 0, 0)
    p.model.wait(s, LEGACY)
    p.model.launch(s, [(ptr, 4096, "read on s")])
    assert p.mm.record_stream(_Tensor(ptr), s)
    door.free(ptr, 4096, 0, 0)  # PyTorch frees naming the allocation stream
    assert door.native.cached(0) == (0, 0)
    again = door.malloc(4096, 0, 0)
    p.model.launch(LEGACY, [(again, 4096, "next tensor")])
    door.free(again, 4096, 0, 0)
    assert_clean(p)  # no unordered reuse


def test_what_is_kept_is_bounded_per_size_and_per_device(programs):
    p = programs(arena=False, max_size=256 << 20)
    door = _door(p)
    many = [door.malloc(4096, 0, 0) for _ in range(native.PER_SIZE + 2)]
    for ptr in many:
        door.free(ptr, 4096, 0, 0)
    assert door.native.cached(0) == (native.PER_SIZE, native.PER_SIZE * 4096)
    assert door.native.max_cached_bytes == native.MAX_CACHED_BYTES
    door.native.max_cached_bytes = 1 << 20  # the model's device holds less than the default
    big = (1 << 19) + 1
    large = [door.malloc(big, 0, 0) for _ in range(2)]
    for ptr in large:
        door.free(ptr, big, 0, 0)
    assert door.native.cached(0) == (native.PER_SIZE + 1, native.PER_SIZE * 4096 + big)  # the second went back
    assert door.malloc(0, 0, 0) is None  # PyTorch's empty tensors own no memory
    assert door.give_back() == native.PER_SIZE + 1 and door.native.cached(0) == (0, 0)
    assert p.mm.statistics().bytes_in_use == 0


def _kept(p, door, size: int = 4096) -> int:
    ptr = door.malloc(size, 0, 0)
    door.free(ptr, size, 0, 0)
    assert door.native.cached(0) == (1, size)
    return ptr


@pytest.mark.parametrize("call", ["statistics", "trim", "reset_peak", "get_memory_info", "snapshot", "reset"])
def test_figures_trims_snapshots_and_resets_give_the_kept_blocks_back(programs, call):
    p = programs(arena=False)
    door = _door(p)
    ptr = _kept(p, door)
    if call == "snapshot":
        numba_pool.snapshot()
    else:
        getattr(p.mm, call)()
    assert door.native.cached(0) == (0, 0) and ptr not in door._blocks  # released through the door's table
    assert_clean(p)


def test_an_out_of_memory_retry_gives_the_kept_blocks_back(programs):
    p = programs(arena=False, max_size=2 << 20)
    door = _door(p)
    _kept(p, door, 3 << 19)  # 1.5 MiB kept
    ptr = door.malloc(1 << 20, 0, 0)  # another size: only the kept block's memory makes room for it
    assert ptr is not None and door.native.cached(0) == (0, 0)
    door.free(ptr, 1 << 20, 0, 0)
    assert_clean(p)


def test_a_reset_forgets_the_live_blocks_their_late_frees_reach_the_doors_table(programs):
    p = programs(arena=False)
    door = _door(p)
    live = door.malloc(4096, 0, 0)
    p.mm.reset()
    door.free(live, 4096, 0, 0)  # a block of the dropped generation: Note [An address a reset gave again]
    assert door.native.cached(0) == (0, 0) and live not in door._blocks
    again = door.malloc(4096, 0, 0)
    door.free(again, 4096, 0, 0)
    assert door.native.cached(0) == (1, 4096)  # the new generation's block is kept
    assert_clean(p)


def test_a_tensor_allocated_as_a_reset_runs_is_never_kept(programs, monkeypatch):
    # The reset overtakes the door between its allocation and its entry of the block in the free list's table (a
    # thread switch there): the block is of the generation the reset dropped, and must never serve another tensor.
    p = programs(arena=False)
    door = _door(p)
    allocate = p.mm.allocate_block

    def racing(size, stream, not_capturing=False):
        block = allocate(size, stream, not_capturing)
        p.mm.reset()
        return block
    monkeypatch.setattr(p.mm, "allocate_block", racing)
    dropped = door.malloc(4096, 0, 0)
    monkeypatch.undo()
    door.free(dropped, 4096, 0, 0)
    assert door.native.cached(0) == (0, 0)
    again = door.malloc(4096, 0, 0)
    door.free(again, 4096, 0, 0)
    assert door.native.cached(0) == (1, 4096) and door.native.reuses == 0
    assert_clean(p)


def test_a_free_while_a_reset_runs_is_not_kept(programs, monkeypatch):
    # Another thread's free in the middle of a reset (here: where the reset forgets its arrays' usage): the free list
    # keeps nothing for the device until the reset ends, so no tensor after it gets the dropped generation's block.
    from numba_pool.allocator.usage import UsageTracker
    p = programs(arena=False)
    door = _door(p)
    x = door.malloc(4096, 0, 0)
    forget_in_use = UsageTracker.forget_in_use

    def freeing(usage):
        forget_in_use(usage)
        door.free(x, 4096, 0, 0)
    monkeypatch.setattr(UsageTracker, "forget_in_use", freeing)
    p.mm.reset()
    monkeypatch.undo()
    assert door.native.cached(0) == (0, 0)
    block = p.mm.allocate_block(4096, LEGACY_REF)  # the new generation's (it may be at x)
    y = door.malloc(4096, 0, 0)
    assert y != block.start and door.native.reuses == 0
    door.free(y, 4096, 0, 0)
    assert_clean(p)


def test_tensors_allocated_and_freed_while_a_reset_runs_are_never_kept(programs, monkeypatch):
    # Another thread's tensors made and freed after the reset began, before it swaps the generation (here: inside
    # Numba's own reset, which runs first): their blocks may be the dropped generation's, so none is kept, and
    # none is handed out again.
    p = programs(arena=False)
    door = _door(p)
    _kept(p, door)  # the door keeps p's blocks before the reset
    seen = []
    numba_class = next(c for c in type(p.mm).__mro__ if c.__module__.startswith(("numba.", "numba_cuda")))
    numba_reset = numba_class.reset

    def numba_reset_racing(manager):
        first = door.malloc(4096, 0, 0)
        door.free(first, 4096, 0, 0)
        seen.append((first, door.malloc(4096, 0, 0), door.native.cached(0)))
        numba_reset(manager)
    monkeypatch.setattr(numba_class, "reset", numba_reset_racing)
    p.mm.reset()
    monkeypatch.undo()
    (first, second, cached), = seen
    assert cached == (0, 0) and door.native.reuses == 0
    door.free(second, 4096, 0, 0)  # the dropped generation's, after the reset: not kept either
    assert door.native.cached(0) == (0, 0)
    assert_clean(p)


def test_a_door_made_while_a_reset_runs_is_paused_too(programs, monkeypatch):
    # The first torch_allocator() of another thread, racing a reset: its door is made paused for the device, so a
    # tensor it allocates before the generation is dropped is never kept for a later one.
    p = programs(arena=False)
    seen = []
    numba_class = next(c for c in type(p.mm).__mro__ if c.__module__.startswith(("numba.", "numba_cuda")))
    numba_reset = numba_class.reset

    def numba_reset_racing(manager):
        door = _door(p)
        x = door.malloc(4096, 0, 0)
        door.free(x, 4096, 0, 0)
        seen.append((door, door.native.cached(0)))
        numba_reset(manager)
    monkeypatch.setattr(numba_class, "reset", numba_reset_racing)
    p.mm.reset()
    monkeypatch.undo()
    (door, cached), = seen
    assert cached == (0, 0)
    _kept(p, door)  # and it keeps blocks once the reset is over
    assert_clean(p)


def test_an_ipc_export_of_a_tensor_pytorch_freed_is_refused(programs):
    class Memory:  # what Numba's get_ipc_handle is given
        def __init__(self, address: int, size: int):
            self.device_pointer_value, self.size = address, size
    p = programs(arena=False)
    door = _door(p)
    ptr = _kept(p, door, 1 << 20)
    with pytest.raises(ValueError, match="not in a live allocation"):
        p.mm.get_ipc_handle(Memory(ptr, 1 << 20))
    assert door.native.cached(0) == (0, 0) and ptr not in door._blocks  # released, not exported
    assert_clean(p)


def test_a_reset_during_a_managers_switch_leaves_the_door_giving_back_to_the_new_one(programs):
    # A reset (another thread) runs while the door gives the first manager's blocks back: the door is added to the
    # new manager's free lists at its next block, so record_stream still takes a tensor out.
    p, q = programs(arena=False), programs(arena=False)
    serving = [p.mm]
    door = TorchDoor(find_manager=lambda device_id, name: serving[0])
    _kept(p, door)
    python_free, once = door._free, []

    def resetting(*args):
        python_free(*args)
        if not once:
            once.append(1)
            q.mm.reset()
    door._free = resetting
    serving[0] = q.mm
    first = door.malloc(8192, 0, 0)
    del door._free
    door.free(first, 8192, 0, 0)
    s = _stream(q)
    x = door.malloc(4096, 0, 0)
    q.model.wait(s, LEGACY)
    q.model.launch(s, [(x, 4096, "read on s")])
    assert q.mm.record_stream(_Tensor(x), s)
    door.free(x, 4096, 0, 0)
    assert door.native.cached(0) == (0, 0)
    y = door.malloc(4096, 0, 0)
    q.model.launch(LEGACY, [(y, 4096, "next tensor")])
    door.free(y, 4096, 0, 0)
    assert q.mm.statistics().bytes_in_use == 0
    assert_clean(q)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_hold_or_record_stream_on_a_tensor_pytorch_freed_is_refused_and_the_block_released(programs, arena):
    # A kept block belongs to no tensor: numba_pool.record_stream and an IPC export's hold answer False (as for any
    # freed memory), and the block goes back through the pool at once, never kept under the hold.
    p = programs(arena=arena)
    door = _door(p)
    s = _stream(p)
    for add_wait in (lambda ptr: p.mm.allocator.hold(ptr, _Hold()), lambda ptr: p.mm.record_stream(_Tensor(ptr), s)):
        ptr = _kept(p, door)
        assert add_wait(ptr) is False
        assert door.native.cached(0) == (0, 0) and ptr not in door._blocks
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_a_free_list_given_back_while_it_frees_stays_whole(programs, monkeypatch):
    # The Python frees of a give-back may run anything (a collection's finalizers: other tensors freed, allocated):
    # the kept blocks are taken off first, so nothing is lost or given twice.
    p = programs(arena=False)
    door = _door(p)
    a, b, c = (door.malloc(4096, 0, 0) for _ in range(3))
    door.free(a, 4096, 0, 0)
    door.free(b, 4096, 0, 0)
    python_free, again = door._free, []

    def reentering(ptr, size, device, stream):
        if not again:
            door.free(c, 4096, 0, 0)  # kept: the stacks are whole
            again.append(door.malloc(4096, 0, 0))  # takes c back
        python_free(ptr, size, device, stream)
    monkeypatch.setattr(door, "_free", reentering)
    assert door.give_back() == 2
    monkeypatch.undo()
    assert again == [c] and door.native.cached(0) == (0, 0) and set(door._blocks) == {c}
    door.free(c, 4096, 0, 0)
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_a_give_back_whose_free_raises_still_releases_the_other_blocks(programs, monkeypatch):
    # A Python free may raise (MemoryError, KeyboardInterrupt): the blocks pulled off with it are released all the
    # same, and the first error is raised once they are.
    p = programs(arena=False)
    door = _door(p)
    a, b, c = (door.malloc(4096, 0, 0) for _ in range(3))
    for ptr in (a, b, c):
        door.free(ptr, 4096, 0, 0)
    python_free, released = door._free, []

    def failing_once(ptr, size, device, stream):
        if not released:
            released.append(None)
            raise KeyboardInterrupt
        released.append(ptr)
        python_free(ptr, size, device, stream)
    monkeypatch.setattr(door, "_free", failing_once)
    with pytest.raises(KeyboardInterrupt):
        door.give_back()
    monkeypatch.undo()
    assert len(released) == 3 and door.native.cached(0) == (0, 0)
    assert p.mm.statistics().bytes_in_use == 4096  # the one whose free raised; the other two given back
    lost = ({a, b, c} - set(released[1:])).pop()
    door.free(lost, 4096, 0, 0)  # (the free PyTorch would make again)
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def test_a_door_made_while_a_history_starts_is_switched_off(programs):
    # set_recording switches the doors off before the recording starts; a door made between its list of doors and
    # the recording's start takes the state it set, not the recording it read (None then), and keeps nothing.
    p = programs(arena=False)
    first = _door(p)
    made = []

    class _Switching:  # the first door's free list, making a door as set_recording switches it off
        def __init__(self, native):
            self.native = native

        def switch(self, on):
            if not on and not made:
                made.append(_door(p))
                made.append(made[0].malloc(4096, 0, 0))  # live: allocated before the recording starts
            self.native.switch(on)

        def __getattr__(self, name):
            return getattr(self.native, name)
    first.native = _Switching(first.native)
    numba_pool.record_history()
    try:
        made[0].free(made[1], 4096, 0, 0)  # kept, the next tensor would reuse it unrecorded
        ptr = made[0].malloc(4096, 0, 0)
        made[0].free(ptr, 4096, 0, 0)
        assert made[0].native.cached(0) == (0, 0) and made[0].native.reuses == 0
        actions = [e["action"] for e in numba_pool.snapshot()["device_traces"][0]]
        assert actions.count("alloc") == 1, actions
    finally:
        numba_pool.record_history(False)
        first.native = first.native.native
    _kept(p, made[0])  # on again once it stops
    made[0].give_back()
    assert_clean(p)


def test_a_history_records_every_allocation_while_it_runs(programs):
    p = programs(arena=False)
    door = _door(p)
    _kept(p, door)
    numba_pool.record_history()
    try:
        assert door.native.cached(0) == (0, 0)  # given back at the start
        ptr = door.malloc(4096, 0, 0)
        door.free(ptr, 4096, 0, 0)
        assert door.native.cached(0) == (0, 0) and door.native.reuses == 0
        actions = [e["action"] for e in numba_pool.snapshot()["device_traces"][0]]
        assert actions.count("alloc") == 1 and "free_requested" in actions, actions
    finally:
        numba_pool.record_history(False)
    _kept(p, door)  # kept again once it stops
    assert_clean(p)


def test_a_door_dropped_gives_its_kept_blocks_back(programs):
    p = programs(arena=False)
    door = _door(p)
    _kept(p, door)
    dropped = weakref.ref(door)
    del door
    gc.collect()
    assert dropped() is None
    assert p.mm.statistics().bytes_in_use == 0  # no door left to give it back: its finalizer did


def test_a_device_served_by_another_manager_gives_the_first_ones_blocks_back(programs):
    p, q = programs(arena=False), programs(arena=False)
    serving = [p.mm]
    door = TorchDoor(find_manager=lambda device_id, name: serving[0])
    _kept(p, door)
    held = door.malloc(2048, 0, 0)  # p's, live across the switch
    serving[0] = q.mm
    ptr = door.malloc(8192, 0, 0)  # the first manager's block goes back before a block counting in q's is entered
    assert p.mm.statistics().bytes_in_use == 2048 and door.native.cached(0) == (0, 0)
    door.free(held, 2048, 0, 0)  # p's live tensor: released through p (never kept and counted in q)
    door.free(ptr, 8192, 0, 0)
    assert door.native.cached(0) == (1, 8192) and p.mm.statistics().bytes_in_use == 0
    stats = q.mm.statistics()  # (the two models' addresses overlap: q may set a block at held's address aside)
    assert stats.total_allocations == stats.total_frees and stats.bytes_in_use == 0, stats
    assert_clean(p)
    assert_clean(q)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), st.sampled_from([256, 4096, 65536]), st.integers(0, 11)),
                      min_size=1, max_size=60))
def test_statistics_count_every_tensor_whether_the_free_list_served_it_or_not(frontend_name, arena, steps):
    # Each step allocates a tensor on the legacy stream or frees the live one chosen: the free list serves exactly
    # the requests it should (a model of it: 8 kept per size), the figures match what PyTorch holds, and no two
    # live tensors share memory.  (A Program per example: the fixture's is one per test.)
    p = Program(arena=arena, frontend=frontend_name)
    try:
        _count_every_tensor(p, steps)
    finally:
        p.close()


def _count_every_tensor(p, steps) -> None:
    door = _door(p)
    live: list[tuple[int, int]] = []
    kept: dict[int, int] = {}  # size -> blocks the free list should hold
    allocations = frees = reuses = 0
    for allocate, size, pick in steps:
        if allocate or not live:
            ptr = door.malloc(size, 0, 0)
            assert all(not (a <= ptr < a + n or ptr <= a < ptr + size) for a, n in live), "overlapping tensors"
            live.append((ptr, size))
            allocations += 1
            if kept.get(size):
                kept[size] -= 1
                reuses += 1
        else:
            ptr, n = live.pop(pick % len(live))
            door.free(ptr, n, 0, 0)
            frees += 1
            kept[n] = min(kept.get(n, 0) + 1, native.PER_SIZE)
    assert door.native.reuses == reuses and door.native.cached(0)[0] == sum(kept.values())
    stats = p.mm.statistics()
    assert (stats.total_allocations, stats.total_frees, stats.bytes_in_use) == \
        (allocations, frees, sum(n for _, n in live)), (stats, door.native.reuses)
    for ptr, n in live:
        door.free(ptr, n, 0, 0)
    assert p.mm.statistics().bytes_in_use == 0
    assert_clean(p)


def _switch_with_an_allocation_meanwhile(p, q, meanwhile):
    """A door serving p's manager, with one block kept, switched to q's at an 8192-byte allocation; while the switch
    gives p's block back (Python), ``meanwhile(door, serving)`` runs once, its 2048-byte tensor's address kept.
    Returns ``(door, the switching allocation, the tensor made meanwhile)``."""
    serving = [p.mm]
    door = TorchDoor(find_manager=lambda device_id, name: serving[0])
    ptr = door.malloc(4096, 0, 0)
    door.free(ptr, 4096, 0, 0)  # p's block kept
    python_free, made = door._free, []

    def releasing(*args):
        python_free(*args)
        if not made:
            made.append(meanwhile(door, serving))
    door._free = releasing
    serving[0] = q.mm
    first = door.malloc(8192, 0, 0)  # q's first block: the switch
    del door._free
    return door, first, made[0]


def test_an_allocation_during_a_switch_and_a_reset_is_taken_out_by_record_stream(programs):
    # From a review: an allocation made during a device's switch of managers, after a reset, must still join the new
    # manager's free lists, so record_stream takes its block out and the reuse finds a tracker.
    p, q = programs(arena=False), programs(arena=False)

    def reset_then_allocate(door, serving):
        q.mm.reset()
        return door.malloc(2048, 0, 0)
    door, first, x = _switch_with_an_allocation_meanwhile(p, q, reset_then_allocate)
    s = _stream(q)
    q.model.launch(LEGACY, [(x, 2048, "fill")])
    q.model.wait(s, LEGACY)
    q.model.launch(s, [(x, 2048, "read on s")])
    assert q.mm.record_stream(_Tensor(x), s)
    door.free(x, 2048, 0, 0)
    assert door.native.cached(0) == (0, 0), "kept after record_stream"
    y = door.malloc(2048, 0, 0)
    q.model.launch(LEGACY, [(y, 2048, "next tensor")])
    door.free(y, 2048, 0, 0)
    door.free(first, 8192, 0, 0)
    assert_clean(q)


def test_a_block_the_first_manager_enters_during_a_switch_is_never_kept_for_the_second(programs):
    # From a second review: an allocation still served by the first manager during the switch enters nothing (a
    # block is entered only while its tracker is the device's), so its free inside the first manager's
    # defer_cleanup is not checked against the second's deferral, and kept.
    p, q = programs(arena=False), programs(arena=False)

    def allocate_through_the_first(door, serving):  # another thread, which found p's manager before the switch
        serving[0] = p.mm
        try:
            return door.malloc(2048, 0, 0)
        finally:
            serving[0] = q.mm
    door, first, x = _switch_with_an_allocation_meanwhile(p, q, allocate_through_the_first)
    s = _stream(p)
    with p.mm.defer_cleanup():
        p.model.launch(LEGACY, [(x, 2048, "fill")])
        p.model.wait(s, LEGACY)
        p.model.launch(s, [(x, 2048, "read on s")])
        door.free(x, 2048, 0, 0)  # inside p's defer_cleanup: held back to its exit
        assert door.native.cached(0) == (0, 0), "p's block kept inside p's defer_cleanup"
        p.model.cuStreamSynchronize(s)
    y = door.malloc(2048, 0, 0)  # q's
    q.model.launch(LEGACY, [(y, 2048, "next tensor")])
    door.free(y, 2048, 0, 0)
    door.free(first, 8192, 0, 0)
    assert_clean(p)
    assert_clean(q)


def test_every_devices_usage_tracker_is_drained_by_reuses_alone():
    # From a second review: one door serves every device; the periodic drain (every 4096 reuses, before a take) drains
    # every device's tracker, not only the one of the device that happens to take next.
    from types import SimpleNamespace

    from numba_pool.allocator.usage import DRAIN_AT, UsageTracker

    addresses = iter(range(1 << 20, 1 << 40, 1 << 16))
    door = native.DoorCallbacks(lambda size, device, stream: next(addresses), lambda *args: None, free_list=True)
    trackers, blocks = [UsageTracker(), UsageTracker()], []
    for device in (0, 1):
        address = door.malloc(4096, device, 0)
        assert door.live(address, 4096, device, trackers[device], door.generation(device), SimpleNamespace(depth=0))
        blocks.append(address)
        door.free(address, 4096, device, 0)  # kept
    for _ in range(DRAIN_AT):  # reuses alternating devices 1 and 0, every one served in C
        for device in (1, 0):
            assert door.malloc(4096, device, 0) == blocks[device]
            door.free(blocks[device], 4096, device, 0)
    assert door.reuses == 2 * DRAIN_AT
    assert all(len(tracker.events) <= DRAIN_AT + 2 * native.PER_SIZE * 1024 for tracker in trackers), \
        [len(tracker.events) for tracker in trackers]
