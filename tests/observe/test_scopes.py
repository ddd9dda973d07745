"""Scoped statistics (``numba_pool.statistics()``) on the CUDA model: the real manager, real
threads.  What a scope counts (its thread's allocations inside it, nested scopes included, the
frees of those allocations until it exits), that the allocation path is the plain one whenever
no scope is open, and random programs of nested scopes, allocations and frees over several
threads against a reference model (hypothesis).
"""

from __future__ import annotations

import gc
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numba_pool
from numba_pool.cuda.errors import CudaAPIError
from numba_pool.observe.scopes import ScopedStatistics
from numba_pool.plugin.manager import manager_class
from numba_pool.plugin.state import process

from cuda_model.harness import Program

KEYS = ("current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes", "total_count", "total_frees")


def reference(events: list[int]) -> dict:
    """A scope's figures from its events (``n`` allocated, ``~n`` freed), the obvious way."""
    current = count = peak = peak_count = total = total_count = frees = 0
    for e in events:
        if e >= 0:
            current, count, total, total_count = current + e, count + 1, total + e, total_count + 1
        else:
            current, count, frees = current + e + 1, count - 1, frees + 1
        peak, peak_count = max(peak, current), max(peak_count, count)
    return dict(zip(KEYS, (current, count, peak, peak_count, total, total_count, frees)))


def is_counting(mm) -> bool:
    """Whether the manager's allocation path has the counting adaptor (and Numba calls it)."""
    assert mm.memalloc == mm.path.allocate, "memalloc is not the composed path"
    return mm.path.layers[0] == "counting"


@pytest.fixture(params=[False, True], ids=["mempool", "arena"])
def program(request):
    p = Program(arena=request.param, threads=4)
    yield p
    p.close()
    assert p.problems == [], p.problems
    assert not process.counting(), "a test left a scope open"


# -- the path: nothing on the hot path without a scope -------------------------------------

def test_the_block_source_is_the_path_unless_a_scope_is_open(program):
    mm = program.mm
    assert not is_counting(mm) and mm.path.layers == (("arena",) if mm.config.arena else ("mempool",))
    assert mm.memalloc == mm.allocator.source.allocate  # the block source itself: no layer in between
    with numba_pool.statistics():
        assert is_counting(mm)
        with numba_pool.statistics():
            assert is_counting(mm)
        assert is_counting(mm)  # the outer one is still open
    assert not is_counting(mm) and mm.memalloc == mm.allocator.source.allocate


def test_a_scope_in_another_thread_keeps_the_wrapper_until_it_exits(program):
    mm = program.mm
    other = numba_pool.statistics()
    program.run(1, other.__enter__)
    with numba_pool.statistics():
        pass
    assert is_counting(mm)
    program.run(1, other.__exit__, None, None, None)
    assert not is_counting(mm)


def test_a_manager_initialized_while_a_scope_is_open_counts(program):
    mm = program.mm
    with numba_pool.statistics() as s:
        mm.reset()  # unbinds the path: the next memalloc initializes and composes it again
        assert mm.path is None and mm.allocator is None
        a = mm.memalloc(1000)
        assert is_counting(mm) and s.total_bytes == 1000
        del a
    assert not is_counting(mm)
    b = mm.memalloc(10)
    del b
    assert s.total_count == 1


def test_exit_after_a_reset_leaves_the_path_unbound(program):
    mm = program.mm
    with numba_pool.statistics():
        mm.reset()
    assert mm.path is None  # the next allocation initializes (it must not skip that)
    mm.memalloc(256).free()
    assert not is_counting(mm) and mm.allocator is not None


def test_counting_wraps_the_logged_path_and_both_see_the_free(program, tmp_path):
    from numba_pool import config as pool_config

    log = tmp_path / "alloc.csv"
    source = "arena" if program.mm.config.arena else "mempool"
    mm = manager_class(program.frontend)(context=program.context,
                                                  config=pool_config.load(environ={}, arena=program.mm.config.arena, log=str(log)))
    mm.initialize()
    assert mm.path.layers == ("log", source)
    with numba_pool.statistics() as s:
        mm.memalloc(3000).free()
        assert is_counting(mm) and mm.path.layers == ("counting", "log", source)
    assert mm.path.layers == ("log", source) and not is_counting(mm)  # the logged path, unwrapped
    mm.reset()  # flushes the log
    actions = [line.split(",")[2] for line in log.read_text().splitlines()[1:]]
    assert actions == ["allocate", "free"] and s.to_dict() == reference([3000, ~3000])


# -- what a scope counts ------------------------------------------------------------------

def test_only_allocations_inside_count_and_figures_freeze_at_exit(program):
    mm = program.mm
    before = mm.memalloc(100)
    with numba_pool.statistics() as s:
        a = mm.memalloc(1000)
        b = mm.memalloc(3000)
        before.free()  # allocated outside: not counted
        a.free()
        assert s.to_dict() == {"current_bytes": 3000, "current_count": 1, "peak_bytes": 4000, "peak_count": 2,
                               "total_bytes": 4000, "total_count": 2, "total_frees": 1}
    after = mm.memalloc(50)
    b.free()  # after the exit: the figures are frozen
    after.free()
    assert (s.current_bytes, s.current_count, s.total_frees) == (3000, 1, 1)
    assert "closed" in repr(s)


def test_nested_scopes_count_in_every_open_scope(program):
    mm = program.mm
    with numba_pool.statistics() as outer:
        a = mm.memalloc(100)
        with numba_pool.statistics() as inner:
            b = mm.memalloc(200)
            a.free()  # counted by outer only
        c = mm.memalloc(400)
        b.free()  # inner has exited: outer only
    assert inner.to_dict() == reference([200])
    assert outer.to_dict() == reference([100, 200, ~100, 400, ~200])
    del c


def test_frees_in_other_threads_count_where_the_allocation_counted(program):
    mm = program.mm
    with numba_pool.statistics() as s:
        pointers = [mm.memalloc(512) for _ in range(3)]
        program.run(2, pointers.clear)  # freed (collected) in another thread, scope still open
        assert (s.current_count, s.total_frees, s.peak_count) == (0, 3, 3)


def test_a_failed_allocation_does_not_count(program):
    mm = program.mm
    with numba_pool.statistics() as s:
        with pytest.raises(CudaAPIError):
            mm.memalloc(1 << 40)  # far beyond the model's device
    assert s.total_count == 0 and s.current_bytes == 0


def test_scratch_arrays_count_and_the_block_does_not(program):
    mm = program.mm
    with numba_pool.statistics() as s:
        with numba_pool.scratch(1 << 14, manager=mm):
            arrays = [mm.memalloc(1000) for _ in range(4)]
            big = mm.memalloc(1 << 15)  # does not fit: the normal path, counted once
        del arrays, big
    assert s.to_dict() == reference([1000] * 4 + [1 << 15] + [~1000] * 4 + [~(1 << 15)])
    assert s.total_bytes == 4000 + (1 << 15)


def test_profile_records_call_sites(program):
    mm = program.mm
    with numba_pool.statistics(profile=True) as s:
        for _ in range(3):
            mm.memalloc(100).free()
        mm.memalloc(5000).free()
    sites = s.sites
    assert sorted(sites.values()) == [(1, 5000), (3, 300)]
    assert all(f == __file__ and function == "test_profile_records_call_sites" for f, _, function in sites)
    report = s.report().splitlines()
    assert "test_scopes.py" in report[2] and "5000 bytes" in report[2]  # most bytes first
    with numba_pool.statistics() as plain:
        pass
    with pytest.raises(RuntimeError, match="profile=True"):
        plain.sites


def test_misuse_raises(program):
    s = numba_pool.statistics()
    with pytest.raises(RuntimeError, match="not open"):
        s.__exit__(None, None, None)
    with s:
        with pytest.raises(RuntimeError, match="only once"):
            s.__enter__()
        with pytest.raises(RuntimeError, match="thread that entered"):
            program.run(1, s.__exit__, None, None, None)
    with pytest.raises(RuntimeError, match="only once"):
        s.__enter__()
    assert isinstance(s, ScopedStatistics)


# -- threads, truly concurrent ------------------------------------------------------------

def test_concurrent_threads_count_only_their_own(program):
    mm = program.mm
    rounds, threads = 300, 4
    start = threading.Barrier(threads + 1)
    results: dict[int, dict] = {}
    errors = []

    def work(k: int) -> None:
        try:
            size = 256 * (k + 1)
            if k == threads - 1:  # no scope: must not show up anywhere
                start.wait()
                for _ in range(rounds):
                    mm.memalloc(size + 1).free()
                return
            with numba_pool.statistics() as s:
                start.wait()
                kept = []
                for i in range(rounds):
                    p = mm.memalloc(size)
                    if i % 3 == 0:
                        kept.append(p)
                    else:
                        p.free()
            results[k] = s.to_dict()
            kept.clear()
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    for w in workers:
        w.join()
    assert errors == []
    kept = (rounds + 2) // 3
    for k in range(threads - 1):
        size = 256 * (k + 1)
        assert results[k] == {"current_bytes": kept * size, "current_count": kept, "peak_bytes": (kept + 1) * size,
                              "peak_count": kept + 1, "total_bytes": rounds * size, "total_count": rounds,
                              "total_frees": rounds - kept}, k
    assert not is_counting(mm)
    gc.collect()


# -- random programs against the reference ------------------------------------------------

SIZES = [0, 1, 256, 1000, 4096, 4097, 20000]
THREADS = 3


@st.composite
def scoped_programs(draw):
    """Actions, each run in one of the program's threads in turn: ("enter", t), ("exit", t)
    (the thread's innermost scope), ("alloc", t, size), ("free", t, index into the live
    allocations: any thread frees any allocation)."""
    actions, depth, live = [], [0] * THREADS, 0
    for _ in range(draw(st.integers(1, 60))):
        t = draw(st.integers(0, THREADS - 1))
        kind = draw(st.sampled_from(["enter", "exit", "alloc", "alloc", "free", "free"]))
        if kind == "exit" and depth[t] == 0 or kind == "free" and live == 0:
            kind = "alloc"
        if kind == "enter":
            depth[t] += 1
            actions.append(("enter", t))
        elif kind == "exit":
            depth[t] -= 1
            actions.append(("exit", t))
        elif kind == "alloc":
            live += 1
            actions.append(("alloc", t, draw(st.sampled_from(SIZES))))
        else:
            actions.append(("free", t, draw(st.integers(0, live - 1))))
            live -= 1
    return actions


@pytest.fixture(scope="module", params=[False, True], ids=["mempool", "arena"])
def shared_program(request):
    p = Program(arena=request.param, threads=THREADS)
    yield p
    p.close()
    assert p.problems == [], p.problems


def _enter(scope):
    scope.__enter__()


def _exit(scope):
    scope.__exit__(None, None, None)


def _alloc(mm, size):
    try:
        return mm.memalloc(size)
    except CudaAPIError:  # cuMemAlloc(0) in mempool mode, as under Numba's default manager
        assert size == 0
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=scoped_programs())
def test_random_scoped_programs_match_the_reference(shared_program, actions):
    p, mm = shared_program, shared_program.mm
    open_scopes: list[list] = [[] for _ in range(THREADS)]  # per thread: [scope, events], outermost first
    closed, nested = [], []  # nested: (outer, inner) scopes
    live: list[tuple] = []  # (pointer, size, the [scope, events] entries that counted it)
    for action in actions:
        kind, t = action[0], action[1]
        if kind == "enter":
            entry = [numba_pool.statistics(), []]
            p.run(t, _enter, entry[0])
            nested += [(outer[0], entry[0]) for outer in open_scopes[t]]
            open_scopes[t].append(entry)
        elif kind == "exit":
            entry = open_scopes[t].pop()
            p.run(t, _exit, entry[0])
            closed.append(entry)
        elif kind == "alloc":
            pointer = p.run(t, _alloc, mm, action[2])
            if pointer is not None:
                counted = list(open_scopes[t])
                for entry in counted:
                    entry[1].append(action[2])
                live.append((pointer, action[2], counted))
        else:
            if action[2] >= len(live):
                continue  # its allocation failed
            pointer, size, counted = live.pop(action[2])
            p.run(t, pointer.free)
            for entry in counted:
                if any(entry is e for scopes in open_scopes for e in scopes):
                    entry[1].append(~size)
        for scopes in open_scopes:
            for scope, events in scopes:
                figures = scope.to_dict()
                assert figures == reference(events)
                assert 0 <= figures["current_bytes"] <= figures["peak_bytes"] <= figures["total_bytes"]
                assert 0 <= figures["current_count"] <= figures["peak_count"] <= figures["total_count"]
    for t, scopes in enumerate(open_scopes):
        while scopes:
            entry = scopes.pop()
            p.run(t, _exit, entry[0])
            closed.append(entry)
    for scope, events in closed:
        assert scope.to_dict() == reference(events)
    for outer, inner in nested:  # an outer scope counted whatever its inner scopes counted
        assert outer.total_bytes >= inner.total_bytes and outer.total_count >= inner.total_count
        assert outer.peak_bytes >= inner.peak_bytes
    for pointer, size, counted in live:
        pointer.free()
    assert not process.counting() and not is_counting(mm)
    p.check()


# -- adaptors and the collector ------------------------------------------------------------

@pytest.mark.parametrize("log", [False, True], ids=["counting", "counting+log"])
def test_pointers_in_reference_cycles_are_released_once_through_the_adaptors(program, tmp_path, log):
    """The collector finalizes an adaptor's pointer and the one below it in any order: the
    adaptor took the release over, so each block is released once (a second release would put
    an arena block in the quarantine twice, and hand it to two owners)."""
    from numba_pool import config as pool_config

    options = {"arena": program.mm.config.arena, **({"log": str(tmp_path / "alloc.csv")} if log else {})}
    mm = manager_class(program.frontend)(context=program.context, config=pool_config.load(environ={}, **options))
    mm.initialize()
    with numba_pool.statistics() as s:
        for _ in range(50):
            pointer = mm.memalloc(1000)
            pointer.cycle = pointer  # only the collector frees it
            del pointer
        gc.collect()
    stats = mm.statistics()
    assert (stats.total_allocations, stats.total_frees, stats.blocks_in_use) == (50, 50, 0)
    assert s.total_frees == 50
    if mm.allocator.arena is not None:
        mm.allocator.arena.check_invariants()
    mm.reset()
    if log:
        rows = (tmp_path / "alloc.csv").read_text().splitlines()[1:]
        assert sum(r.split(",")[2] == "free" for r in rows) == 50
