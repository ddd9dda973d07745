"""Rule 7a (:mod:`numba_pool.allocator.stream_idle`) on the CUDA model: a mempool block released on a stream other
than the legacy one is that stream's next allocation of its size, with no driver call; never another stream's,
never one given a destroyed stream's handle, never while the stream is captured; within its caps."""

from __future__ import annotations

import pytest
from cuda.bindings import driver as cu

from cuda_model.checks import assert_clean
from cuda_model.harness import LEGACY as LEGACY_HANDLE
from helpers import AnyStreamsIdleBlocks
from numba_pool.allocator import stream_idle
from numba_pool.allocator.stream_idle import StreamIdle

SIZE = 6000  # above the model's arena's largest block: the mempool's in both modes
GLOBAL = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL


def _used_and_dropped(p, stream: int) -> int:
    f = p.allocate(SIZE, stream=stream)
    p.launch(stream, [f])
    address = f.address
    p.drop(f)
    return address


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_a_block_released_on_its_stream_is_its_next_allocation_with_no_driver_call(programs, arena):
    p = programs(arena=arena)
    s = p.create_stream(False)
    first = _used_and_dropped(p, s)
    allocs, frees = p.model.stats()["allocs"], p.model.stats()["frees"]
    assert _used_and_dropped(p, s) == first
    assert (p.model.stats()["allocs"], p.model.stats()["frees"]) == (allocs, frees)
    assert_clean(p)
    p.finish()


def test_another_stream_never_gets_it(programs):
    p = programs(arena=False)
    s, t = p.create_stream(False), p.create_stream(False)
    first = _used_and_dropped(p, s)
    f = p.allocate(SIZE, stream=t)
    assert f.address != first
    p.launch(t, [f])
    p.drop(f)
    assert_clean(p)
    p.finish()


@pytest.mark.parametrize("planted", [False, True], ids=["real", "planted: any stream's block"])
def test_a_stream_given_a_destroyed_streams_handle_gets_none_of_its_blocks(programs, monkeypatch, planted):
    """The model gives a new stream the destroyed one's handle; the destroyed stream's kernel is still unordered.
    Planted (the idle blocks taken by size, whatever the stream): the model sees the new owner's kernel race it."""
    p = programs(arena=False)
    idle = p.mm.allocator.mempool_blocks.stream_idle
    if planted:
        idle.lists = AnyStreamsIdleBlocks()
    s = p.create_stream(False)
    first = _used_and_dropped(p, s)
    assert p.destroy_stream(s)
    t = p.create_stream(False)
    assert t == s  # the model reuses the handle, as the driver may
    f = p.allocate(SIZE, stream=t)
    p.launch(t, [f])
    if planted:
        assert f.address == first and p.model.violations
        p.model.violations.clear()
        return
    assert f.address != first
    p.drop(f)
    assert_clean(p)
    p.finish()


@pytest.mark.parametrize("planted", [False, True], ids=["real", "planted: no capture check"])
def test_a_block_released_while_its_stream_is_captured_is_the_graphs_free(programs, monkeypatch, planted):
    """A capture numba_pool does not know of (begun by another library): the release is the pool's free, which
    the driver refuses for memory the graph did not allocate (warned of; the block is never reused), as for
    cuda.core's own pool.  Planted (no capture check at the release): the block is kept, and the stream's next
    allocation gets it while the graph may still use it."""
    p = programs(arena=False)
    s = p.create_stream(False)
    if planted:  # the release's driver answers "not capturing" whatever the stream
        idle = p.mm.allocator.mempool_blocks.stream_idle
        monkeypatch.setattr(idle, "_capture_status", _NeverCapturing(idle._cu).cuStreamIsCapturing)
    f = p.allocate(SIZE, stream=s)
    p.launch(s, [f])
    first = f.address
    assert p.model.cuStreamBeginCapture(cu.CUstream(s), GLOBAL)[0] == cu.CUresult.CUDA_SUCCESS
    p.drop(f)
    err, graph = p.model.cuStreamEndCapture(cu.CUstream(s))
    assert err == cu.CUresult.CUDA_SUCCESS
    g = p.allocate(SIZE, stream=s)
    assert (g.address == first) == planted
    p.launch(s, [g])
    p.drop(g)
    if not planted:
        assert [str(w.message) for w in p.warnings] == [
            f"numba_pool: cuMemFreeAsync({first:#x}) failed with CUDA_ERROR_INVALID_VALUE"]
        p.warnings.clear()


def test_caps_free_the_rest_on_the_stream(programs, monkeypatch):
    p = programs(arena=False)
    s = p.create_stream(False)
    families = [p.allocate(SIZE, stream=s) for _ in range(stream_idle.PER_STREAM_SIZE + 2)]
    for f in families:
        p.launch(s, [f])
    frees = p.model.stats()["frees"]
    for f in families:
        p.drop(f)
    idle = p.mm.allocator.mempool_blocks.stream_idle
    assert len(idle.lists[next(iter(idle.lists))]) == stream_idle.PER_STREAM_SIZE
    assert p.model.stats()["frees"] == frees + 2
    monkeypatch.setattr(stream_idle, "MAX_BYTES", idle.nbytes - SIZE)
    f = p.allocate(SIZE, stream=s)  # two idle ones: room for one of them to come back
    g = p.allocate(SIZE, stream=s)
    p.launch(s, [f, g])
    p.drop(f)
    p.drop(g)
    assert p.model.stats()["frees"] == frees + 3
    assert_clean(p)
    p.finish()


@pytest.mark.parametrize("barrier", ["trim", "reset"])
def test_statistics_count_idle_blocks_and_a_barrier_frees_them(programs, barrier):
    p = programs(arena=False)
    s = p.create_stream(False)
    _used_and_dropped(p, s)
    assert p.mm.statistics().pool_released_bytes == SIZE
    source = p.mm.allocator.mempool_blocks
    if barrier == "trim":
        p.mm.trim()
    else:
        p.reset()
    assert source.stream_idle.held_bytes() == 0
    assert p.mm.statistics().pool_used_bytes == 0
    assert_clean(p)
    p.finish()


class _Stream:
    handle, idle_key, owner = cu.CUstream(0x5000), 7, None


class _Block:
    size, stream = 64, _Stream()


class _Popped(dict):
    """A table whose list is popped (a take_all) between the release's append and its check."""

    def __init__(self, *, taken: bool):
        super().__init__()
        self.taken, self.calls = taken, 0

    def get(self, key, default=None):
        self.calls += 1
        found = super().get(key, default)
        if self.calls == 2 and found is not None:  # the check after the append
            self.pop(key)
            if self.taken:
                found.clear()  # the taker has it
            return None
        return found


@pytest.mark.parametrize("taken", [False, True], ids=["still in the orphan list", "taken by take_all"])
def test_a_release_racing_take_all_frees_its_block_or_leaves_it_to_the_taker(monkeypatch, taken):
    class Driver:
        def cuStreamIsCapturing(self, handle):
            return cu.CUresult.CUDA_SUCCESS, cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
    idle = StreamIdle(Driver())
    idle.lists = _Popped(taken=taken)
    block = _Block()
    kept = idle.keep(block)
    assert kept == taken  # taken: the taker frees it; else the release frees it on its stream
    if not taken:
        assert block.stream is _Block.stream and idle.nbytes == 0


@pytest.mark.parametrize("planted", [False, True], ids=["real", "planted: blocking streams too"])
def test_a_blocking_streams_block_is_freed_not_kept(programs, monkeypatch, planted):
    """On a blocking stream B, a block last used on the legacy stream is released on B with no event of the program
    (B's next operation waits for the legacy stream).  Its next owner on B is used on a non-blocking stream T
    after T waits for B's work so far.  Freed, the block's free is B's operation, after the legacy use.  Planted
    (blocking streams keep blocks too, as the fuzzer's model once found): nothing on B follows the legacy use, and
    the model sees T's kernel race it."""
    p = programs(arena=False)
    if planted:
        monkeypatch.setattr(StreamIdle, "key_of", lambda self, stream: p.model.stream_id(stream.handle))
    b, t = p.create_stream(True), p.create_stream(False)
    f = p.allocate(SIZE, stream=b)
    p.launch(b, [f])
    p.model.wait(t, b)  # T is after B's work so far
    p.launch(LEGACY_HANDLE, [f])
    frees = p.model.stats()["frees"]
    p.drop(f, legalize="wait")  # nothing to do: B's next operation waits for the legacy stream
    assert p.model.stats()["frees"] == frees + (not planted)
    g = p.allocate(SIZE, stream=b)
    p.launch(t, [g])  # after g's allocation on B, as the program orders it
    if planted:
        assert p.model.violations
        p.model.violations.clear()
        return
    p.drop(g)
    assert_clean(p)
    p.finish()


class _Driver:
    def cuStreamIsCapturing(self, handle):
        return cu.CUresult.CUDA_SUCCESS, cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def test_a_prune_racing_a_release_puts_its_block_back(monkeypatch):
    """The table is full; a prune finds stream 7's list empty and, before it pops the list, a whole release appends
    its block there (finding the list in the table).  The prune puts it back: stream 7's next allocation gets it."""
    monkeypatch.setattr(stream_idle, "MAX_LISTS", 2)
    idle, released = StreamIdle(_Driver()), _Block()

    class Switch(list):
        fired = False

        def __len__(self):  # the prune's emptiness test, then the release runs whole (a thread switch)
            empty = super().__len__() == 0
            if empty and not Switch.fired:
                Switch.fired = True
                assert idle.keep(released)
            return 0 if empty else super().__len__()

    idle.lists.update({(7, 64): Switch(), (8, 64): [object()]})
    other = _Block()
    other.stream = type("Other", (), {"handle": cu.CUstream(0x6000), "idle_key": 9, "owner": None})()
    assert not idle.keep(other)  # still full after the prune: freed on its stream
    assert idle.lists[(7, 64)] == [released]  # stream 7's next allocation of 64 bytes gets it


def test_a_release_racing_a_reset_synchronizes_before_freeing_on_the_legacy_stream(programs, monkeypatch):
    """A release that passed the gate's reset test keeps its block after the reset took the idle lists; finding the
    source dropped, it frees the block, whose stream's kernel may still run, on the legacy stream: only after a
    synchronize (the legacy stream waits for no non-blocking stream)."""
    p = programs(arena=False)
    s = p.create_stream(False)
    f = p.allocate(SIZE, stream=s)
    p.launch(s, [f])
    source = p.mm.allocator.mempool_blocks
    block = next(b for b in source.blocks() if b.address == f.address)
    block.ledger.pop(block.ptr)  # the release got past the gate's ledger pop (rule 12)
    events = []
    free, synchronize = p.model.cuMemFreeAsync, p.model.cuCtxSynchronize
    monkeypatch.setattr(source, "_free_async", lambda ptr, on: events.append(("free", int(ptr))) or free(ptr, on))
    monkeypatch.setattr(p.model, "cuCtxSynchronize", lambda: events.append(("sync",)) or synchronize())
    take_released = type(source).take_released

    def reset_snapshot_then_the_release(self, releases):
        taken = take_released(self, releases)
        if self is source and source.stream_idle.keep(block) and source.dropped:  # the release resumes
            source.free_after_reset()
        return taken
    monkeypatch.setattr(type(source), "take_released", reset_snapshot_then_the_release)
    p.mm.allocator.reset()
    first = events.index(("free", block.address))
    assert ("sync",) in events[:first], events
    block.state = "free"  # the harness's family is gone with the reset
    p.families.clear()


class _NeverCapturing:
    """A driver object answering ``cuStreamIsCapturing`` with "none" for every stream (a planted bug)."""

    def __init__(self, cu_):
        self._cu = cu_

    def __getattr__(self, name):
        return getattr(self._cu, name)

    def cuStreamIsCapturing(self, handle):
        return cu.CUresult.CUDA_SUCCESS, cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
