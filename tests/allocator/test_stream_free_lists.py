"""The doors' free lists for a stream of their own (Note [The doors' free lists] in :mod:`numba_pool.plugin.free_lists`)
on the CUDA model: a PyTorch tensor or a cuda.core buffer of a non-blocking stream, freed naming that stream, serves
the next request of its size on that very stream (its driver id) without Python; never another stream's, a
capturing stream's, or one given the handle of a stream destroyed since; and one kept for a stream destroyed since
is given back after a synchronize (Note [A kept block whose stream is gone])."""

from __future__ import annotations

import warnings

import pytest
from cuda.bindings import driver as real_cu
from cuda.core import Stream as CoreStream

from cuda_model.checks import assert_clean
from cuda_model.harness import LEGACY, _Context
from numba_pool import config as pool_config
from numba_pool.config import DEFAULT_ARENA_MAX_BLOCK
from numba_pool.plugin.debugging import snapshot_of
from numba_pool.plugin.manager import manager_class
from numba_pool.plugin.torch_allocator import TorchDoor

pytest.importorskip("numba_pool.cuda._native", reason="the free lists are in the compiled module")


N = 2 * DEFAULT_ARENA_MAX_BLOCK  # bytes: a mempool block in arena mode too (an arena block is its domain's)


def _door(p) -> TorchDoor:
    return TorchDoor(find_manager=lambda device_id, door: p.mm)


def _stream(p) -> int:
    return int(p.model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1])


def _one_kept_for_a_stream(p, use: str = "first") -> tuple:
    """``(p, door, s, first)``: a PyTorch door, a non-blocking stream ``s``, and a tensor ``first`` of ``N`` bytes
    allocated, used (``use``) and freed on ``s``, kept for it."""
    door = _door(p)
    s = _stream(p)
    first = door.malloc(N, 0, s)
    p.model.launch(s, [(first, N, use)])
    door.free(first, N, 0, s)
    assert door.native.cached(0) == (1, N)
    return p, door, s, first


def _no_python(*args):
    raise AssertionError(f"the Python end was called: {args}")


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_tensor_freed_on_its_stream_serves_the_next_request_there_without_python(programs, arena, monkeypatch):
    p, door, s, first = _one_kept_for_a_stream(programs(arena=arena))
    monkeypatch.setattr(door, "_malloc", _no_python)
    monkeypatch.setattr(door, "_free", _no_python)
    again = door.malloc(N, 0, s)
    assert again == first and door.native.reuses_on_streams == 1
    p.model.launch(s, [(again, N, "second")])  # after the first in s's order
    door.free(again, N, 0, s)
    monkeypatch.undo()
    stats = p.mm.statistics()  # keeps it: counted as freed
    assert (stats.total_allocations, stats.total_frees, stats.bytes_in_use, stats.blocks_in_use) == (2, 2, 0, 0)
    assert door.native.cached(0) == (1, N)
    p.mm.trim()  # gives it back (after a synchronize: s is never named again)
    stats = p.mm.statistics()
    assert (stats.total_allocations, stats.total_frees, stats.bytes_in_use) == (2, 2, 0), stats
    assert door.native.cached(0) == (0, 0) and door.native.streams_given_back == 1
    assert_clean(p)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_block_kept_for_a_stream_is_never_handed_to_another_or_to_the_legacy_stream(programs, arena):
    p = programs(arena=arena)
    door = _door(p)
    s, t = _stream(p), _stream(p)
    first = door.malloc(N, 0, s)
    p.model.launch(s, [(first, N, "long read on s")])
    door.free(first, N, 0, s)
    on_t, legacy = door.malloc(N, 0, t), door.malloc(N, 0, 0)
    assert first not in (on_t, legacy) and door.native.reuses == 0
    p.model.launch(t, [(on_t, N, "t")])
    p.model.launch(LEGACY, [(legacy, N, "legacy")])
    door.free(on_t, N, 0, t)
    door.free(legacy, N, 0, 0)
    p.mm.statistics()
    assert_clean(p)  # the model saw no unordered reuse


def test_a_block_of_a_capturing_stream_is_neither_kept_nor_reused(programs):
    p, door, s, first = _one_kept_for_a_stream(programs(arena=False))
    relaxed = real_cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    assert p.model.cuStreamBeginCapture(s, relaxed)[0] == real_cu.CUresult.CUDA_SUCCESS
    taken = door.native.take(N, 0, s)  # capturing: the door's own path (graph memory, rule 13); no id asked
    err, graph = p.model.cuStreamEndCapture(s)
    assert err == real_cu.CUresult.CUDA_SUCCESS  # the capture was not invalidated (an id query would have)
    p.model.cuGraphDestroy(graph)
    assert taken == 0 and door.native.reuses == 0 and door.native.cached(0) == (1, N)
    p.mm.statistics()
    assert_clean(p)


@pytest.mark.parametrize("core_keeps", [True, False], ids=["core keeps idle", "core frees on the handle"])
@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_block_kept_for_a_stream_destroyed_since_is_given_back_after_its_work_and_never_to_its_handles_heir(
        programs, arena, core_keeps, monkeypatch):
    if not core_keeps:  # rule 7a's idle lists full: the core frees a released block on its stream's handle
        monkeypatch.setattr("numba_pool.allocator.stream_idle.MAX_BYTES", 0)
    p, door, s, first = _one_kept_for_a_stream(programs(arena=arena), "long read on s")
    p.model.cuStreamDestroy(s)  # legal: nothing of s's is live; its work may still run
    heir = _stream(p)
    assert heir == s  # the model gives the handle again (so may the driver): the id differs
    other = door.malloc(N, 0, heir)
    assert other != first and door.native.reuses == 0
    p.model.launch(heir, [(other, N, "heir")])
    door.free(other, N, 0, heir)
    stats = p.mm.statistics()  # the block kept for s counted as freed, not given back: s is never named again
    assert (stats.total_frees, stats.bytes_in_use) == (2, 0), stats
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not order" warning: nothing names s's handle
        snapshot_of([p.mm])  # gives it back, after a synchronize (a trim synchronizes after it anyway)
    assert door.native.cached(0) == (0, 0)
    p.model.opportunistic_reuse = True  # the pool hands out what is freed at once: only the order protects it
    for stream in (0, heir):
        reused = door.malloc(N, 0, stream)
        p.model.launch(stream or LEGACY, [(reused, N, "next owner")])
        door.free(reused, N, 0, stream)
    p.mm.statistics()
    assert_clean(p)  # the first owner's read on s finished before anyone else got the block


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_buffer_closed_on_its_own_stream_serves_the_next_one_without_python(programs, arena, monkeypatch):
    p = programs(arena=arena)
    mr, s = p.core_resource, _stream(p)
    stream = CoreStream.from_handle(s)
    first = mr.allocate(N, stream)
    p.model.launch(s, [(first.device_pointer_value, N, "first")])
    mr.deallocate(first.device_pointer_value, N, CoreStream.from_handle(s))  # cuda.core's close(stream)
    assert mr.native.cached(0) == (1, N)
    monkeypatch.setattr(mr, "_malloc", _no_python)
    monkeypatch.setattr(mr, "_free", _no_python)
    monkeypatch.setattr(mr, "_deallocate", _no_python)
    again = mr.allocate(N, stream)
    assert again.device_pointer_value == first.device_pointer_value and mr.native.reuses_on_streams == 1
    p.model.launch(s, [(again.device_pointer_value, N, "second")])
    mr.deallocate(again.device_pointer_value, N, CoreStream.from_handle(s))
    monkeypatch.undo()
    stats = p.mm.statistics()
    assert (stats.total_allocations, stats.total_frees, stats.bytes_in_use) == (2, 2, 0), stats
    assert_clean(p)


def test_a_buffer_closed_naming_another_stream_or_none_is_not_kept(programs):
    p = programs(arena=False)
    mr, s, t = p.core_resource, _stream(p), _stream(p)
    a = mr.allocate(N, CoreStream.from_handle(s))
    p.model.launch(s, [(a.device_pointer_value, N, "a")])
    p.model.wait(t, s)
    mr.deallocate(a.device_pointer_value, N, CoreStream.from_handle(t))  # ordered on t (rule 14)
    b = mr.allocate(N, CoreStream.from_handle(s))
    mr.deallocate(b.device_pointer_value, N, None)  # its allocation stream, through Python
    assert mr.native.cached(0) == (0, 0)
    c = mr.allocate(N, CoreStream.from_handle(s))
    p.model.launch(s, [(c.device_pointer_value, N, "c")])
    mr.deallocate(c.device_pointer_value, N, CoreStream.from_handle(s))
    p.mm.statistics()
    assert_clean(p)


def test_an_arena_block_is_never_kept_for_a_stream_its_domain_serves_it(programs):
    # Rule 5: a domain's event is recorded on its stream only; a give-back (after a synchronize, never naming S)
    # recorded it on another stream, overwriting a record on S by another thread's release made meanwhile (the
    # slab then went back under S's read: review of f52e0d4).  An arena block of S is S's domain's (rule 3).
    p = programs(arena=True)
    door = _door(p)
    s, t = _stream(p), _stream(p)
    xs = [door.malloc(4096, 0, s) for _ in range(3)]
    y = p.allocate(4096, s)  # a Numba array of S's domain, in the slab of xs
    z = door.malloc(4096, 0, s)  # a second slab of S's domain (kept live)
    for x in xs:
        p.model.launch(s, [(x, 4096, "x")])
        door.free(x, 4096, 0, s)
    assert door.native.cached(0) == (0, 0)
    python_free, calls = door._free, []

    def free_then_another_thread_works_on_s(*args):
        python_free(*args)
        if not calls:  # another thread, between two blocks of a give-back
            calls.append(1)
            p.launch(s, [y])
            p.drop(y)
    door._free = free_then_another_thread_works_on_s
    snapshot_of([p.mm])
    del door._free
    p.model.opportunistic_reuse = True
    on_t = [door.malloc(4096, 0, t) for _ in range(4)]
    p.model.launch(t, [(a, 4096, "t") for a in on_t])
    for a in on_t:
        door.free(a, 4096, 0, t)
    door.free(z, 4096, 0, s)
    p.mm.trim()
    assert_clean(p)


def test_a_give_back_a_capture_holds_back_keeps_the_block_counted_as_freed(programs, no_capture_left):
    from test_capture_model import _capturing

    p = programs(arena=False)
    door = _door(p)
    s, c = _stream(p), p.create_stream(True)
    x = door.malloc(4096, 0, s)
    p.model.launch(s, [(x, 4096, "x")])
    door.free(x, 4096, 0, s)  # kept for s: freed, as the figures go
    before = p.mm.statistics()
    with _capturing(p, c):
        snapshot_of([p.mm])  # gives x back: after the capture (no synchronize during it)
        during = p.mm.statistics()
    assert door.native.cached(0) == (0, 0)
    after = p.mm.statistics()  # given back now
    figures = [(f.total_frees, f.bytes_in_use, f.blocks_in_use) for f in (before, during, after)]
    assert figures[0] == figures[1] == figures[2] == (1, 0, 0), figures
    assert_clean(p)


def test_blocks_kept_for_destroyed_streams_never_crowd_out_the_legacy_free_list(programs):
    # They are reused by no one until a trim, snapshot, reset or out-of-memory retry: at most half the bound is
    # theirs, and their empty stacks' keys go when the key table fills.
    p = programs(arena=False)
    door = _door(p)
    door.native.max_cached_bytes = 64 << 10
    for _ in range(16):
        s = _stream(p)
        x = door.malloc(4096, 0, s)
        door.free(x, 4096, 0, s)
        p.model.cuStreamDestroy(s)
    assert door.native.cached(0) == (8, 32 << 10)  # half the bound
    p.mm.statistics()  # a figure: gives back the legacy stream's only
    y = door.malloc(4096, 0, 0)
    door.free(y, 4096, 0, 0)
    z = door.malloc(4096, 0, 0)
    assert z == y and door.native.reuses == 1, (door.native.cached(0), door.native.reuses)
    door.free(z, 4096, 0, 0)
    p.mm.trim()
    assert door.native.cached(0) == (0, 0)
    assert_clean(p)


def test_the_key_table_drops_empty_stacks_when_it_fills(programs):
    # A program making a stream per request leaves a (size, stream) key per stream; once the table is full, the
    # empty stacks' keys go and a new stream's block is kept all the same.
    p = programs(arena=False)
    door = _door(p)
    for _ in range(native_max_sizes() + 10):
        s = _stream(p)
        x = door.malloc(256, 0, s)
        door.free(x, 256, 0, s)  # kept for s
        again = door.malloc(256, 0, s)  # taken: the stack is empty again
        door.free(again, 256, 0, s)
        again = door.malloc(256, 0, s)
        assert again == x
        door.free(again, 256, 0, 0)  # named another stream: not kept, the key left empty
        p.model.cuStreamDestroy(s)
    assert door.native.reuses_on_streams == 2 * (native_max_sizes() + 10)
    p.mm.trim()
    assert_clean(p)


def native_max_sizes() -> int:
    return 2048  # _native's _MAX_SIZES


# -- the second review (of e72675d): each failed there -------------------------------------------------------------
def test_a_switch_during_a_capture_counts_the_first_managers_held_back_block_in_the_first_manager(
        programs, no_capture_left):
    from test_capture_model import _capturing

    p = programs(arena=False)
    q_mm = manager_class(p.frontend)(context=_Context(), config=pool_config.load(environ={}, arena=False))
    q_mm.initialize()  # a second manager for device 0, on the same driver (model)
    serving = [p.mm]
    door = TorchDoor(find_manager=lambda device_id, name: serving[0])
    s, t = _stream(p), _stream(p)
    x = door.malloc(N, 0, s)
    p.model.launch(s, [(x, N, "x")])
    door.free(x, N, 0, s)  # kept for s, p's block: freed as p's figures go
    with _capturing(p, p.create_stream(True)):
        serving[0] = q_mm
        y = door.malloc(4096, 0, t)  # q serves the device now: p's kept block given back, held back by the capture
        p_during, q_during = p.mm.statistics(), q_mm.statistics()
        assert door._gone_later, "not held back"
    door.free(y, 4096, 0, t)
    figures = [(f.total_allocations, f.total_frees, f.bytes_in_use) for f in (p_during, q_during)]
    assert figures == [(1, 1, 0), (1, 0, 4096)], figures


def test_a_figure_read_during_a_give_backs_synchronize_still_counts_the_block_freed(programs, monkeypatch):
    # Another thread's statistics() while the give-back waits in cuCtxSynchronize (the GIL released there)
    import numba_pool.plugin.free_lists as free_lists

    p, door, s, x = _one_kept_for_a_stream(programs(arena=False))
    before, during = p.mm.statistics(), []
    synchronize = free_lists._synchronize

    def synchronize_while_another_thread_reads(allocator):
        during.append(p.mm.statistics())
        return synchronize(allocator)
    monkeypatch.setattr(free_lists, "_synchronize", synchronize_while_another_thread_reads)
    p.mm.trim()
    after = p.mm.statistics()
    figures = [(f.total_frees, f.bytes_in_use) for f in (before, during[0], after)]
    assert figures == [(1, 0)] * 3, figures


def test_a_give_back_whose_synchronize_fails_keeps_the_block_until_one_succeeds(programs, no_capture_left):
    # A capture numba_pool does not know of (nothing allocated on it yet), relaxed mode: the give-back's
    # cuCtxSynchronize fails; the block must not go back unordered after s's work, but at a later give-back.
    p, door, s, x = _one_kept_for_a_stream(programs(arena=False), "long read on s")
    t, c = _stream(p), _stream(p)
    relaxed = real_cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    assert p.model.cuStreamBeginCapture(real_cu.CUstream(c), relaxed)[0] == 0
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        snapshot_of([p.mm])
    assert any("cuCtxSynchronize (blocks kept for a stream given back) failed" in str(w.message) for w in said)
    assert door._gone_later and p.mm.statistics().bytes_in_use == 0  # not released, counted as freed
    p.model.cuStreamEndCapture(real_cu.CUstream(c))
    p.model.opportunistic_reuse = True
    y = door.malloc(N, 0, t)
    p.model.launch(t, [(y, N, "next owner on t")])
    door.free(y, N, 0, t)
    snapshot_of([p.mm])  # gives it back now
    assert not door._gone_later and p.mm.statistics().bytes_in_use == 0
    unordered = [str(v) for v in p.model.violations if v.kind == "unordered reuse"]
    p.model.violations.clear()  # the capture's invalidation: numba_pool did not know of it (rule 13's gap)
    assert unordered == [], unordered


@pytest.mark.parametrize("door_name", ["torch", "cuda.core"])
def test_a_legacy_allocation_made_during_the_threads_capture_is_graph_memory_never_kept(programs, no_capture_left,
                                                                                      door_name):
    from test_capture_model import _capturing

    p = programs(arena=False)
    door = _door(p) if door_name == "torch" else p.core_resource
    relaxed = real_cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    with _capturing(p, p.create_stream(False), relaxed):
        if door_name == "torch":  # the legacy stream, in the capturing thread: an allocation node (rule 13)
            x = door.malloc(4096, 0, 0)
            assert door._blocks[x][0].capture is not None
            door.free(x, 4096, 0, 0)
        else:
            buffer = door.allocate(4096)
            x = buffer.device_pointer_value
            assert door._blocks[x][0].capture is not None
            door.deallocate(x, 4096)
        kept = door.native.cached(0)
    assert kept == (0, 0), kept
    if door_name == "torch":
        y = door.malloc(4096, 0, 0)  # after the capture, outside any graph
        p.model.launch(LEGACY, [(y, 4096, "a tensor outside the graph")])
        door.free(y, 4096, 0, 0)
        p.mm.trim()
        assert_clean(p)


def test_a_give_back_acting_on_a_stale_record_never_releases_the_addresss_next_owner(programs, no_capture_left):
    # A thread retrying a give-back read its record; another released the block meanwhile, and the address went to
    # a new tensor: the first must leave that tensor alone (its record is not the one it read).
    p, door, s, x = _one_kept_for_a_stream(programs(arena=False), "long read on s")
    c = _stream(p)
    relaxed = real_cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    assert p.model.cuStreamBeginCapture(real_cu.CUstream(c), relaxed)[0] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the synchronize fails (a capture numba_pool does not know of)
        snapshot_of([p.mm])
    p.model.cuStreamEndCapture(real_cu.CUstream(c))
    p.model.violations.clear()  # the capture's invalidation (rule 13's gap), not what this test is about
    stale = list(door._gone_later.items())
    assert [address for address, _ in stale] == [x]
    snapshot_of([p.mm])  # another thread's give-back: x released
    p.model.cuCtxSynchronize()  # (its free complete: the pool may give the address to anyone)
    y = door.malloc(N, 0, s)
    assert y == x  # the model's pool gives the address again
    door._release_gone(stale)  # the first thread, late
    assert door._blocks.get(y) is not None  # y still its owner's
    p.model.launch(s, [(y, N, "y")])
    door.free(y, N, 0, s)
    p.mm.trim()
    assert_clean(p)
