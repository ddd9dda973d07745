"""The stream rule (:mod:`numba_pool.allocator`) on the CUDA model (no GPU): the README's examples,
reproductions of reported programs, regressions, and planted bugs that the model must catch.

Every program here is run by numba_pool's real manager over the CUDA model (``cuda_model``),
which reports any reuse of memory by work that is not ordered after its previous owner's last
use (``model.violations``).  The planted-bug tests each run the same program twice: unpatched (a
control that must be clean) and with one rule of the arena broken by
``monkeypatch`` (which must give a violation naming both owners' streams), so that a clean
control means something.
"""

from __future__ import annotations

import copy
import gc
import threading
import warnings
from types import SimpleNamespace

import pytest

import numba_pool
from cuda.bindings import driver as real_cu
from numba_pool.allocator import arena as arena_module
from numba_pool.allocator import quarantine as quarantine_module
from numba_pool.cuda.driver import EVENT_FLAGS, check
from numba_pool.cuda.streams import LEGACY as LEGACY_REF

from cuda_model import CudaModel
from cuda_model.ordering import describe_stream
from cuda_model.checks import FALLBACK, assert_clean, assert_no_fallback, eager
from cuda_model.harness import LEGACY, Hold, Program
from test_fuzz_can_fail import gate_without_quarantine  # rule 4 planted: no quarantine, no fence

PER_THREAD = 2  # CU_STREAM_PER_THREAD


def stream_text(p: Program, handle: int) -> str:
    """How the model's violations name a (live) stream."""
    return describe_stream(handle, p.model.stream_id(handle))


def arena_and_pool_blocks(p: Program, stream_a: int, stream_b: int) -> list:
    """An arena-sized and a mempool-sized array on the legacy stream, then one of each
    inside ``using_stream`` (``stream_a``, ``stream_b``)."""
    return [p.allocate(1000), p.allocate(100_000), p.allocate(1000, stream=stream_a),
            p.allocate(100_000, stream=stream_b)]


def assert_caught(p: Program, names: list[tuple[object, str]]) -> None:
    """At least one unordered reuse, whose text names each (owner, stream description)."""
    reuses = [v for v in p.model.violations if v.kind == "unordered reuse"]
    assert reuses, f"the model caught nothing: {p.model.violations}"
    for v in reuses:
        text = str(v)
        if all(f"owner {owner!r} on {stream}" in text for owner, stream in names):
            return
    raise AssertionError(f"no violation names {names}:\n" + "\n".join(map(str, reuses)))


# ------------------------------------------------------------------------------------------
# 1. Controls: the README's examples must run clean, in both modes.

MODES = pytest.mark.parametrize("arena", [False, True], ids=["pool", "arena"])


@MODES
def test_readme_reader_on_blocking_stream_then_reuse_on_another(programs, arena):
    p = programs(arena=arena)
    eager(p)
    s1, s2 = p.create_stream(True), p.create_stream(True)
    x = p.allocate(1000)
    p.launch(s1, [x])  # a reader on a Numba-like (blocking) stream
    p.drop(x)  # on the legacy stream: no record_stream needed
    y = p.allocate(1000)
    assert y.address == x.address  # the block is reused: the control exercises the rule
    p.launch(s2, [y])
    assert_clean(p)
    p.finish()


@MODES
def test_readme_using_stream_on_non_blocking_stream_reuses_at_once(programs, arena):
    p = programs(arena=arena)
    eager(p)
    nb = p.create_stream(False)
    x = p.allocate(1000, stream=nb)
    p.launch(nb, [x])
    p.drop(x)
    y = p.allocate(1000, stream=nb)
    assert y.address == x.address  # same-stream reuse is immediate
    p.launch(nb, [y])
    assert_clean(p)
    p.finish()


@MODES
def test_readme_record_stream_on_non_blocking_stream(programs, arena):
    p = programs(arena=arena)
    eager(p)
    nb1, nb2 = p.create_stream(False), p.create_stream(False)
    x = p.allocate(1000)
    p.model.wait(nb1, LEGACY)  # the program orders nb1 after the allocation
    p.launch(nb1, [x])
    p.record_stream(x, nb1)
    p.drop(x)
    assert x.uses and not p.model.would_follow(LEGACY, x.uses[0][1])  # nothing on the legacy stream at the drop
    y = p.allocate(1000)
    assert p.model.would_follow(LEGACY, x.uses[0][1])  # the fence, recorded by y's allocation, waited for nb1
    assert y.address == x.address
    p.model.wait(nb2, LEGACY)
    p.launch(nb2, [y])
    assert_clean(p)
    p.finish()


@MODES
def test_readme_defer_cleanup_holds_memory_until_exit(programs, arena):
    p = programs(arena=arena)
    eager(p)
    s1 = p.create_stream(True)
    x = p.allocate(1000)
    p.launch(s1, [x])
    frees_before = p.model.stats()["frees"]
    with p.mm.defer_cleanup():
        p.drop(x)
        inside = p.allocate(1000)
        assert inside.address != x.address  # not reused inside the block
        if not arena:
            assert p.model.stats()["frees"] == frees_before  # the free itself is held back
            assert p.mm.statistics().pool_used_bytes >= 2 * 1024
        else:
            assert p.mm.allocator.arena.statistics().quarantined == 0  # held back, not quarantined
        p.launch(s1, [inside])
    after = p.allocate(1000)  # fences the block released at the exit (rule 4), then reuses it idle
    assert after.address == x.address  # reused once the block has exited
    p.launch(s1, [after])
    assert_clean(p)
    p.finish()


@MODES
def test_readme_scratch_arrays_used_and_dropped(programs, arena):
    p = programs(arena=arena)
    eager(p)
    s1, s2 = p.create_stream(True), p.create_stream(False)
    arrays = p.scratch([1000, 2000, 300], 8192, stream=s2)
    addresses = [f.address for f in arrays]
    assert len(set(addresses)) == 3
    p.launch(s2, arrays)
    for f in arrays:
        p.drop(f)
    arrays = p.scratch([1000, 2000], 8192)
    p.launch(s1, arrays)
    for f in arrays:
        p.drop(f)
    again = [p.allocate(1000, stream=s2), p.allocate(8192, stream=s2), p.allocate(1000)]
    p.launch(s2, again[:2])
    p.launch(s1, again[2:])
    assert_clean(p)
    p.finish()


@MODES
def test_scratch_array_recorded_on_a_stream_destroyed_before_its_block_goes(programs, arena):
    # record_stream belongs to the carved array: the block waits for the recorded stream when
    # the array is dropped.  Applied at the block's own release instead, it would record an
    # event on a stream the program has legally destroyed by then (caught by the fuzzer).
    p = programs(arena=arena)
    eager(p)
    s2, s3 = p.create_stream(False), p.create_stream(False)
    first, second = p.scratch([1000, 2000], 8192, stream=s2)
    p.launch(s2, [first, second])
    p.launch(s3, [first])
    p.drop(first, legalize="record")  # record_stream(first, s3), then the last reference goes
    assert p.destroy_stream(s3)
    p.drop(second)  # the scratch block goes back now
    again = [p.allocate(1000, stream=s2), p.allocate(8192, stream=s2)]
    p.launch(s2, again)
    p.check()
    assert_no_fallback(p)
    p.finish()


@MODES
def test_scratch_array_recorded_then_reset_orders_nothing_when_dropped(programs, arena):
    # A reset freed the block: the array that outlives it must not record on its stream, which
    # the program may destroy once the reset is done (found by the fuzzer).
    p = programs(arena=arena)
    s2 = p.create_stream(False)
    (only,) = p.scratch([1000], 4096)
    p.record_stream(only, s2)
    p.reset()
    assert p.destroy_stream(s2)
    p.drop(only)
    p.check()
    assert_no_fallback(p)
    p.finish()


@MODES
@pytest.mark.parametrize("recorded", [False, True])
def test_an_array_dropped_in_a_thread_without_a_context_is_released(programs, arena, recorded):
    # A thread that never used CUDA has no current context (IPC's lease thread, a worker that
    # only drops arrays): the release pushes its manager's context, and nothing is lost.
    p = programs(arena=arena)
    eager(p)
    s2, s3 = p.create_stream(False), p.create_stream(False)
    arrays = arena_and_pool_blocks(p, s2, s2)
    for f in arrays:
        p.launch(f.stream, [f])
        if recorded:
            p.launch(s3, [f])
    before = p.model.stats()
    for f in arrays:
        p.drop(f, legalize="record", how="bare")
    after = p.model.stats()
    # The owner's context was pushed (after a refused free on a stream's own handle, or before a
    # call on a handle that depends on the current context).
    assert after["context_pushes"] > before["context_pushes"]
    assert p.mm.statistics().bytes_in_use == 0
    again = arena_and_pool_blocks(p, s2, s2)
    for f in again:
        p.launch(f.stream, [f])
    p.check()
    assert_no_fallback(p)
    p.finish()


@MODES
def test_harness_legalizes_a_use_on_a_destroyed_stream_whose_handle_came_back(programs, arena):
    # The harness, not numba_pool: a use on a stream destroyed since is legalized by a
    # synchronize even when a new stream got the same handle (recording the new stream orders
    # nothing of the old one's work).  Found by the fuzzer as an unordered reuse.
    p = programs(arena=arena)
    eager(p)
    s = p.create_stream(False)
    a = p.allocate(1)
    p.launch(s, [a])
    assert p.destroy_stream(s)
    assert p.create_stream(False) == s  # the model hands the handle out again
    p.drop(a, legalize="record")
    b = p.allocate(1)
    assert b.address == a.address
    p.launch(LEGACY, [b])
    assert_clean(p)
    p.finish()


@MODES
def test_scratch_array_on_a_per_thread_stream_dropped_in_another_thread(programs, arena):
    # The block is on thread 0's per-thread default stream, which thread 1 cannot name
    # (CU_STREAM_PER_THREAD there is thread 1's stream).  Once, the drop made it wait for the
    # recorded stream: rule 8's synchronize instead (found in review).  Now the drop records an
    # event on the recorded stream alone, which any thread can: no wait, no synchronize.
    p = programs(arena=arena, threads=2)
    s2 = p.create_stream(False)
    a, b = p.scratch([1000, 2000], 8192, stream=PER_THREAD, thread=0)
    p.launch(PER_THREAD, [a, b], thread=0)
    p.launch(s2, [a], thread=0)
    p.run(0, p.mm.record_stream, a.refs[0], s2)
    a.recorded.add(s2)
    p.drop(a, legalize="record", thread=1)
    p.drop(b, thread=0)  # the block goes back on thread 0's per-thread stream
    c = p.allocate(8192, stream=PER_THREAD, thread=0)
    p.launch(PER_THREAD, [c], thread=0)
    assert_clean(p)
    assert not any(FALLBACK in str(w.message) for w in p.warnings)
    p.finish()


# ------------------------------------------------------------------------------------------
# 2. Reported programs, fixed (arena mode).


def test_legacy_and_blocking_stream_allocations_alternate_200_times(programs):
    p = programs(arena=True)
    s = p.create_stream(True)
    a = p.allocate(1000)
    b = p.allocate(1000, stream=s)
    c = p.allocate(1000)
    assert None not in (a, b, c)
    p.launch(LEGACY, [a, c])
    p.launch(s, [b])
    for i in range(200):
        stream = s if i % 2 else None
        f = p.allocate(1000, stream=stream)
        assert f is not None
        p.launch(stream if stream is not None else LEGACY, [f])
        p.drop(f)
    assert_clean(p)
    p.finish()


@pytest.mark.parametrize("count", [2, 3])
def test_alternating_non_blocking_streams_and_legacy_reuse_blocks_safely(programs, count):
    p = programs(arena=True)
    streams = [p.create_stream(False) for _ in range(count)]
    order = [s for s in streams for s in (s, None)]  # each non-blocking stream, then the legacy one
    reused = {1000: 0, 6000: 0}  # size -> allocations that got a block its stream had before
    seen: dict[int, int] = {}  # address -> the stream of its last owner
    for i in range(300):
        stream = order[i % len(order)]
        on = stream if stream is not None else LEGACY
        # 1000 B is served by the arena; 6000 B (above its largest block) by the mempool.  The
        # model counts reuse of mempool allocations only: arena blocks live inside slabs.
        size = 1000 if i % 4 < 2 else 6000
        f = p.allocate(size, stream=stream)
        reused[size] += seen.get(f.address) == on
        seen[f.address] = on
        p.launch(on, [f])
        p.drop(f)
    assert_clean(p)
    p.finish()
    # 6000 B blocks come back from the stream's idle blocks (rule 7a), not through the pool: counted here.
    assert reused[1000] > 0 and reused[6000] > 0, reused


# ------------------------------------------------------------------------------------------
# 3. Regressions.


def _drop_during(p: Program, call: str, x, s1: int):
    """A preempt hook that, once, at the exit of driver call ``call``, launches a kernel on the
    blocking stream ``s1`` over the legacy array ``x`` and drops ``x`` (legal: the legacy
    stream's next operation follows s1's work).  Returns the list it appends each firing to."""
    fired: list[str] = []

    def hook(phase, name):
        if phase != "exit" or name != call or fired:
            return
        fired.append(name)
        op = p.model.launch(s1, [(x.address, x.size, x.id)])  # in this thread: no p.run (deadlock)
        x.uses.append((s1, op))
        del p.families[x.id]
        x.refs.clear()  # the last reference: released here, between two steps of the allocator

    p.model.preempt = hook
    return fired


def _barrier_program(p: Program, barrier: str, call: str):
    """A block freed while a barrier runs waits for the next fence (rule 4's snapshot).

    ``x`` (held) is the slab's first block, ``w`` (quarantined) the next; the barrier's snapshot
    holds ``w`` only.  Returns (x, y, z, s1, s2): ``y`` and ``z`` are the two allocations
    after the barrier, used on s2."""
    eager(p)
    s1, s2 = p.create_stream(True), p.create_stream(True)
    x = p.allocate(1000)
    w = p.allocate(1000)
    p.launch(LEGACY, [x, w])
    p.drop(w)  # quarantined: the next fence has something to take
    fired = _drop_during(p, call, x, s1)
    if barrier == "miss":
        y = p.allocate(1000)  # a miss with quarantined blocks: fence
        assert fired, "the hook never ran"
        p.model.preempt = None
    else:
        p.mm.trim()
        assert fired, "the hook never ran"
        p.model.preempt = None
        y = p.allocate(1000)
    z = p.allocate(1000)
    p.launch(s2, [y, z])
    assert x.address in (y.address, z.address)  # x's block was reused: the test means something
    return x, y, z, s1, s2


@pytest.mark.parametrize("barrier, call", [("miss", "cuEventRecord"), ("trim", "cuCtxSynchronize")])
def test_a_block_freed_during_a_barrier_waits_for_the_next_fence(programs, barrier, call):
    p = programs(arena=True)
    _barrier_program(p, barrier, call)
    assert_clean(p)
    p.finish()


def test_a_small_allocation_after_a_reset_is_ordered(programs):
    p = programs(arena=True)
    s1 = p.create_stream(True)
    old = p.allocate(100)
    p.launch(s1, [old])
    p.reset()
    f = p.allocate(100)
    assert f is not None
    p.launch(LEGACY, [f])
    p.launch(s1, [f])
    g = p.allocate(100, stream=s1)
    p.launch(s1, [g])
    assert_clean(p)
    assert p.mm.statistics().blocks_in_use == 2
    p.finish()


def test_a_new_stream_on_a_destroyed_streams_handle_gets_its_own_domain(programs):
    p = programs(arena=True)
    a = p.create_stream(False)
    x = p.allocate(1000, stream=a)
    p.launch(a, [x])
    p.drop(x)
    assert p.destroy_stream(a)
    b = p.create_stream(False)
    assert b == a  # the model hands the handle out again, as the driver may
    y = p.allocate(1000, stream=b)
    p.launch(b, [y])
    assert_clean(p)
    assert y.address != x.address  # not a's block: b cannot be ordered after a's work
    assert p.mm.allocator.arena.statistics().domains == 3  # legacy, a's and b's
    p.finish()


@MODES
@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copies_of_a_pointer_release_once(programs, arena, copier):
    p = programs(arena=arena)
    f = p.allocate(1000)
    first, second = copier(f.refs[0]), copier(f.refs[0])
    assert first.device_pointer_value == f.address == second.device_pointer_value
    del p.families[f.id]
    f.refs.clear()  # the original goes first
    gc.collect()
    assert p.mm.statistics().blocks_in_use == 1
    del first
    gc.collect()
    assert p.mm.statistics().blocks_in_use == 1
    del second
    gc.collect()
    stats = p.mm.statistics()
    assert (stats.blocks_in_use, stats.total_frees) == (0, 1), stats
    eager(p)
    g, h = p.allocate(1000), p.allocate(1000)
    assert g.address != h.address  # a double free would hand one block out twice
    p.launch(LEGACY, [g, h])
    assert_clean(p)
    p.finish()


@MODES
def test_a_release_whose_recorded_stream_was_destroyed_synchronizes(programs, arena):
    p = programs(arena=arena)
    eager(p)
    nb, other = p.create_stream(False), p.create_stream(False)
    x = p.allocate(1000)
    p.launch(nb, [x])  # p.launch orders nb after the allocation
    p.record_stream(x, nb)
    del p.streams[nb]
    p.model.cuStreamDestroy(real_cu.CUstream(nb))  # illegal in a program; the release must survive
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p.drop(x)
    assert p.problems == []
    assert any(FALLBACK in str(w.message) and w.category is RuntimeWarning for w in caught), \
        [str(w.message) for w in caught]
    # numba_pool could not know the stream was gone: its one attempt is the program's error.
    invalid = [v for v in p.model.violations if v.kind == "invalid stream"]
    assert invalid == p.model.violations and invalid, p.model.violations
    p.model.violations.clear()
    y = p.allocate(1000)
    assert y.address == x.address
    p.model.wait(other, LEGACY)
    p.launch(other, [y])
    assert_clean(p)
    p.finish()


@MODES
def test_a_per_thread_stream_block_released_in_another_thread_synchronizes(programs, arena):
    p = programs(arena=arena, threads=2)
    f = p.allocate(1000, stream=PER_THREAD, thread=0)
    p.run(0, p.model.launch, PER_THREAD, [(f.address, f.size, f.id)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p.drop(f, thread=1)
    assert p.problems == []
    assert any(FALLBACK in str(w.message) for w in caught), [str(w.message) for w in caught]
    g = p.allocate(1000, stream=PER_THREAD, thread=0)
    p.run(0, p.model.launch, PER_THREAD, [(g.address, g.size, g.id)])
    p.drop(g, thread=0)
    assert_clean(p)
    p.finish()


def test_the_log_of_reuse_scratch_and_threads_replays(tmp_path):
    from numba_pool.cuda.driver import use
    from numba_pool.cuda.frontend import for_tools
    from numba_pool.plugin.manager import manager_class
    from numba_pool_tools.replay import LogError, parse_log, replay

    path = tmp_path / "log.csv"
    cfg = numba_pool.config.load(environ={}, arena=True, arena_max_block=4096, arena_slab_size=16384,
                                 log=str(path))
    model = CudaModel()
    with use(model):
        mm = manager_class(for_tools())(context=SimpleNamespace(device=SimpleNamespace(id=0)), config=cfg)
        mm.initialize()
        arena = mm.allocator.arena
        arena.quarantine_limit, arena.quarantine.cache_limit = -1, 0
        model.gpu_eager = True  # the fence completes by the time the allocation asks
        a = mm.memalloc(1000)
        first = a.device_pointer_value
        a.free()
        b = mm.memalloc(1000)
        assert b.device_pointer_value == first  # reused
        with numba_pool.scratch(4096, manager=mm) as block:
            s1, s2 = mm.memalloc(100), mm.memalloc(200)
        carved = (s1.device_pointer_value, s2.device_pointer_value)
        assert carved[0] != carved[1] and block.base <= min(carved)
        del s1, s2

        together = threading.Barrier(3)  # all alive at once: three distinct thread ids

        def work():
            together.wait(timeout=10)
            for n in (300, 5000, 300):
                mm.memalloc(n).free()
            together.wait(timeout=10)

        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        del b
        gc.collect()
        mm.reset()  # flushes the log
    assert model.violations == []
    try:
        parsed = parse_log(open(path, newline=""), source=str(path))
    except LogError as err:  # pragma: no cover - the failure message is the point
        pytest.fail(f"the log does not parse: {err}")
    rows = [r.split(",") for r in path.read_text().splitlines()[1:]]
    allocs = {(int(r[3], 16), int(r[4])) for r in rows if r[2] == "allocate"}
    assert (carved[0], 100) in allocs and (carved[1], 200) in allocs  # scratch arrays, own addresses
    assert not any(int(r[4]) == 4096 for r in rows)  # the scratch block itself is not logged
    assert len({r[0] for r in rows}) >= 4  # the main thread and three workers
    assert sum(r[2] == "free" for r in rows) >= 2 + 3 * 3
    report = replay(parsed, slab_size=16384, max_block=4096)
    assert report.operations == len(parsed.operations) > 0


# ------------------------------------------------------------------------------------------
# 4. Planted bugs that the model must catch; each with the same program unpatched as control.


def _legacy_reuse_program(p: Program):
    eager(p)
    s1, s2 = p.create_stream(True), p.create_stream(True)
    x = p.allocate(1000)
    p.launch(s1, [x])
    p.drop(x)
    y = p.allocate(1000)
    assert y.address == x.address
    p.launch(s2, [y])
    return x, y, s1, s2


def test_planted_free_without_fence_is_caught(programs, monkeypatch):
    control = programs(arena=True)
    _legacy_reuse_program(control)
    assert_clean(control)

    monkeypatch.setattr(arena_module, "gate", gate_without_quarantine)
    p = programs(arena=True)
    x, y, s1, s2 = _legacy_reuse_program(p)
    assert_caught(p, [(x.id, stream_text(p, s1)), (y.id, stream_text(p, s2))])


def _fence_before_snapshot(self, at, limit, deferral):
    if not self.waiting:
        return
    cu = self.fences._cu
    event = check(cu.cuEventCreate(EVENT_FLAGS), "cuEventCreate")
    check(cu.cuEventRecord(event, LEGACY_REF.handle), "cuEventRecord (fence)")
    taken = self.waiting.take()  # the bug: what was freed since the record is taken too
    self.fences.batches.append((event, taken, []))


def test_planted_fence_before_snapshot_is_caught(programs, monkeypatch):
    control = programs(arena=True)
    _barrier_program(control, "miss", "cuEventRecord")
    assert_clean(control)

    monkeypatch.setattr(quarantine_module.Quarantine, "fence_if_due", _fence_before_snapshot)
    p = programs(arena=True)
    x, y, z, s1, s2 = _barrier_program(p, "miss", "cuEventRecord")
    new = y if y.address == x.address else z
    assert_caught(p, [(x.id, stream_text(p, s1)), (new.id, stream_text(p, s2))])


def _takeover_without_wait(self, rounded, stream):
    self._publish_released()
    domain = self._domains.of_stream(stream)
    block = self._carve(domain, rounded, stream)
    if block is not None:
        return block
    for other in self._domains:  # the bug: another stream's block, no event wait
        if other is not domain:
            block = self._carve(other, rounded, stream)
            if block is not None:
                return block
    self._domains.add_slab(domain, stream, rounded)
    return self._carve(domain, rounded, stream)


def _takeover_program(p: Program):
    a, b = p.create_stream(False), p.create_stream(False)
    x = p.allocate(1000, stream=a)
    p.launch(a, [x])
    p.drop(x)
    y = p.allocate(1000, stream=b)  # b's domain is new and empty
    p.launch(b, [y])
    return x, y, a, b


def test_planted_takeover_without_wait_is_caught(programs, monkeypatch):
    control = programs(arena=True)
    x, y, _, _ = _takeover_program(control)
    assert y.address != x.address
    assert_clean(control)

    monkeypatch.setattr(arena_module.ArenaBlocks, "_take_scoped", _takeover_without_wait)
    p = programs(arena=True)
    x, y, a, b = _takeover_program(p)
    assert y.address == x.address
    assert_caught(p, [(x.id, stream_text(p, a)), (y.id, stream_text(p, b))])


# ------------------------------------------------------------------------------------------
# 5. Holds: a release waits for what keeps its block outside CUDA's streams (IPC exports).


@MODES
def test_a_held_block_is_reused_only_after_the_hold_lets_go(programs, arena):
    p = programs(arena=arena)
    eager(p)
    size = 1000 if arena else 100_000  # an arena block, or a mempool block
    x = p.allocate(size)
    p.launch(LEGACY, [x])
    hold = Hold()
    assert p.mm.allocator.hold(x.address, hold)
    p.drop(x)
    assert hold.kept and p.mm.statistics().blocks_in_use == 0  # freed for the statistics, kept for the pool
    y = p.allocate(size)
    assert y.address != x.address
    hold.let_go()
    z = p.allocate(size)
    assert z.address == x.address  # reused once let go
    p.launch(LEGACY, [y, z])
    assert_clean(p)
    p.finish()


@MODES
def test_a_reset_releases_a_held_block_once(programs, arena):
    p = programs(arena=arena)
    x = p.allocate(1000 if arena else 100_000)
    hold = Hold()
    assert p.mm.allocator.hold(x.address, hold)
    p.drop(x)
    p.reset()  # frees it with the rest, before the pool goes
    assert p.model.stats()["live_allocations"] == 0
    hold.let_go()  # the importer closes later: nothing left to release
    assert_clean(p)
    p.finish()


def test_a_held_scratch_array_keeps_its_block(programs):
    p = programs(arena=False)
    a, b = p.scratch([100, 200], 4096)
    hold = Hold()
    assert p.mm.allocator.hold(a.address, hold)
    block = p.mm.allocator.scratch_blocks[min(a.address, b.address) // 256 * 256]
    p.drop(a)
    p.drop(b)
    waits = p.mm.allocator.waits
    assert block.live_arrays == 0 and [b.address for b in waits.held.keys()] == [block.base]  # a's hold passed to the block: it is kept
    hold.let_go()
    assert not len(waits.held) and not p.mm.allocator.scratch_blocks
    assert_clean(p)
    p.finish()


@MODES
def test_a_released_block_cannot_be_held_even_while_a_hold_keeps_it(programs, arena):
    p = programs(arena=arena)
    x = p.allocate(1000)
    address = x.address
    hold = Hold()
    assert p.mm.allocator.hold(address, hold)
    p.drop(x)
    assert not p.mm.allocator.hold(address, Hold())  # released: its next owner is not exported
    assert not p.mm.allocator.record_stream(address, LEGACY_REF)
    hold.let_go()
    assert not p.mm.allocator.hold(address, Hold())
    p.finish()
