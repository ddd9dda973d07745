"""The allocation history (numba_pool/observe/history.py), snapshots and the debugging glue, run
for real on the CUDA model: what is recorded, its bound, threads and finalizers, defer_cleanup,
out of memory, live allocations and the leak report."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

import numba_pool
from cuda_model.harness import LEGACY, Program
from numba_pool.allocator.block import make_block
from numba_pool.cuda.errors import CudaAPIError
from numba_pool.observe import history
from numba_pool.plugin import debugging
from numba_pool.plugin.state import process


@pytest.fixture
def recording():
    numba_pool.record_history()
    yield process.recording
    numba_pool.record_history(False)


def allocate_here(prog: Program, size: int):
    return prog.mm.memalloc(size)  # the line the frames must name


LINE = allocate_here.__code__.co_firstlineno + 1


def actions(h: history.History) -> list[str]:
    return [e.action for e in h.entries]


def test_off_means_no_adaptor_in_the_path(frontend_name):
    p = Program(arena=True, frontend=frontend_name)
    try:
        assert "history" not in p.mm.path.layers
        assert p.mm.memalloc == p.mm.allocator.source.allocate  # nothing in between
        numba_pool.record_history()
        assert p.mm.path.layers[0] == "history"
        numba_pool.record_history(False)
        assert "history" not in p.mm.path.layers and process.recording is None
    finally:
        numba_pool.record_history(False)
        p.close()


def test_an_allocation_and_its_release_are_recorded_with_the_callers_line(recording, frontend_name):
    p = Program(arena=False, frontend=frontend_name)
    try:
        pointer = allocate_here(p, 1000)
        address = pointer.device_pointer_value
        (key, entry), = recording.live.items()
        assert key == (0, address) and (entry.action, entry.size, entry.kind, entry.stream) == ("alloc", 1000, "device", 1)
        frames = history.resolve(entry.frames)
        assert frames[0] == {"filename": __file__, "line": LINE, "name": "allocate_here"}  # innermost first
        assert frames[1]["name"] == "test_an_allocation_and_its_release_are_recorded_with_the_callers_line"
        assert history.site_of(entry.frames) == f"{__file__}:{LINE}"
        del pointer
        gc.collect()
        assert actions(recording) == ["alloc", "free"] and not recording.live  # free: requested and completed at once
        assert all(e.address == address and e.size == 1000 for e in recording.entries)
    finally:
        p.close()


def test_kinds_arena_scratch_managed_pinned(recording, frontend_name):
    p = Program(arena=True, host=True, frontend=frontend_name)
    try:
        small, large = p.mm.memalloc(1000), p.mm.memalloc(100_000)
        with numba_pool.scratch(8192, manager=p.mm):
            carved = p.mm.memalloc(100)
        managed = p.mm.memallocmanaged(5000, True)
        pinned = p.mm.memhostalloc(3000)
        kinds = [e.kind for e in recording.entries if e.action == "alloc"]
        assert kinds == ["arena", "device", "scratch", "managed", "pinned"]
        assert [e.size for e in recording.entries if e.action == "alloc"] == [1000, 100_000, 100, 5000, 3000]
        del small, large, carved, managed, pinned
    finally:
        p.close()


def test_the_ring_keeps_the_newest_events_and_every_live_allocation(frontend_name):
    numba_pool.record_history(max_entries=10)
    p = Program(arena=True, frontend=frontend_name)
    try:
        kept = [p.mm.memalloc(512) for _ in range(20)]
        for _ in range(20):
            del [p.mm.memalloc(256)][0]
        h = process.recording
        assert len(h.entries) == 10 and len(h.live) == 20  # live ones are kept apart, whatever their age
        assert actions(h)[-2:] == ["alloc", "free"]
        del kept
        gc.collect()
        assert not h.live and len(h.entries) == 10
    finally:
        numba_pool.record_history(False)
        p.close()


def test_bad_arguments_are_refused_in_one_line():
    for call, match in [(lambda: numba_pool.record_history(max_entries=0), "max_entries=0 must be a positive"),
                        (lambda: numba_pool.record_history(stacks="c++"), "stacks='c\\+\\+' must be one of"),
                        (lambda: numba_pool.live_allocations(), "no history is being recorded")]:
        with pytest.raises((ValueError, RuntimeError), match=match):
            call()


def test_threads_and_the_collector_record_every_release(recording, frontend_name):
    """Eight threads allocate and drop, handing some arrays to others and leaving some in
    cycles for the collector: every allocation has exactly one free, nothing is live at the
    end, no release raised."""
    p = Program(arena=True, frontend=frontend_name, max_size=64 << 20)
    handoff: list = []
    lock = threading.Lock()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(seed: int):
        for i in range(200):
            pointer = p.mm.memalloc(256 + 64 * ((seed + i) % 50))
            if i % 3 == 0:
                pointer.cycle = pointer  # freed by the collector
            elif i % 3 == 1:
                with lock:
                    handoff.append(pointer)
            if i % 7 == 0:
                with lock:
                    handoff.clear()

    try:
        workers = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        handoff.clear()
        gc.collect()
        counts = {a: actions(recording).count(a) for a in ("alloc", "free", "free_requested", "free_completed")}
        assert counts == {"alloc": 1600, "free": 1600, "free_requested": 0, "free_completed": 0}, counts
        assert not recording.live and not p.problems
        p.check()
    finally:
        sys.setswitchinterval(interval)
        p.close()


def test_free_completed_waits_for_defer_cleanup(recording, frontend_name):
    p = Program(arena=False, frontend=frontend_name)
    try:
        pointer = p.mm.memalloc(1000)
        with p.mm.defer_cleanup():
            del pointer
            gc.collect()
            assert actions(recording) == ["alloc", "free_requested"]
        assert actions(recording) == ["alloc", "free_requested", "free_completed"]
    finally:
        p.close()


def test_out_of_memory_names_the_largest_holder_calls_observers_once_and_the_pool_works(recording, frontend_name,
                                                                                        tmp_path):
    from numba_pool import config as pool_config
    p = Program(arena=False, frontend=frontend_name, max_size=1 << 20)
    seen = []
    try:
        path = tmp_path / "oom.pickle"
        p.mm.config = pool_config.load(environ={}, max_size=1 << 20, oom_snapshot=str(path))
        p.mm.recompose()
        numba_pool.on_out_of_memory(lambda device, size, snap: seen.append((device, size, snap)))
        big = [allocate_here(p, 300_000) for _ in range(3)]
        with pytest.raises(CudaAPIError) as caught:
            allocate_here(p, 600_000)
        message = str(caught.value)
        assert "out of memory allocating" in message and "\n" not in message
        assert f"largest holders (numba_pool.record_history): {__file__}:{LINE} holds 878.91 KiB (900000 bytes) in 3 arrays" in message
        assert len(seen) == 1 and seen[0][:2] == (0, 600_000)
        snapshot = seen[0][2]  # every manager of the process: other tests' may still hold blocks
        held = [b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"
                and b["frames"] and b["frames"][0]["name"] == "allocate_here"]
        assert [b["requested_size"] for b in held] == [300_000] * 3
        assert [e["action"] for e in snapshot["device_traces"][0]][-1] == "oom"
        assert path.exists() and path.stat().st_size > 0  # NUMBA_POOL_OOM_SNAPSHOT, written once
        del big
        gc.collect()
        assert p.mm.memalloc(600_000) is not None  # usable after
        assert len(seen) == 1
    finally:
        process._observers.clear()
        process._dumped.clear()
        p.close()


def test_live_allocations_by_site_and_the_leak_report(recording, frontend_name):
    p = Program(arena=True, frontend=frontend_name)
    try:
        managed_line = sys._getframe().f_lineno + 1
        kept = [allocate_here(p, 1000) for _ in range(3)] + [p.mm.memallocmanaged(5000, True)]
        rows = numba_pool.live_allocations()
        assert rows[0][1:] == (5000, 1) and rows[1] == (f"{__file__}:{LINE}", 3000, 3)  # most bytes first
        each = numba_pool.live_allocations(group_by=None)
        assert [row[1] for row in each] == [5000, 1000, 1000, 1000] and each[0][4] == "managed"
        with pytest.raises(ValueError, match="group_by='file' must be 'site' or None"):
            numba_pool.live_allocations(group_by="file")
        report = debugging.leak_report()
        assert report.splitlines()[0].startswith("numba_pool: memory still held at exit (NUMBA_POOL_LEAK_REPORT)")
        assert report.splitlines()[1:] == [f"  {__file__}:{managed_line}: 4.88 KiB (5000 bytes) in 1 array",
                                           f"  {__file__}:{LINE}: 2.93 KiB (3000 bytes) in 3 arrays"]
        del kept
        gc.collect()
        assert debugging.leak_report() == ""
    finally:
        p.close()


def test_trim_and_reset_are_events(recording, frontend_name):
    p = Program(arena=True, frontend=frontend_name)
    try:
        p.mm.trim()
        p.reset()
        assert [e.action for e in recording.entries][-2:] == ["trim", "reset"]
    finally:
        p.close()


def test_the_adaptors_hand_back_upstreams_own_pointer_marked_and_released_once(tmp_path):
    # PoolPointer.wrap_release: each adaptor puts its part in front of the release of the
    # pointer upstream made, and hands that same object on: a graph allocation (rule 13) keeps
    # its capture mark through history, log and counting, and the memory is released once, after
    # every adaptor's part.
    from cuda.bindings import driver as cu

    from numba_pool.cuda.frontend import load
    from numba_pool.observe.alloclog import AllocationLog, LoggedAllocations
    from numba_pool.observe.scopes import CountedAllocations

    releases = []
    made = []

    def upstream(size: int):
        pointer = load("numba-cuda").PoolPointer(None, cu.CUdeviceptr(0x7000), size,
                                                 make_block(0x7000, size, None, lambda _: releases.append(size)))
        pointer.captured = 7  # an allocation node of capture 7
        made.append(pointer)
        return pointer

    log = AllocationLog(str(tmp_path / "alloc.csv"))
    h = history.History(100, "python")
    counted = CountedAllocations(LoggedAllocations(upstream, log).allocate)
    path = history.RecordedAllocations(counted.allocate, h, 0, "device").allocate
    pointer = path(4096)
    assert pointer is made[0] and pointer.captured == 7
    assert [(e.action, e.kind, e.address) for e in h.entries] == [("alloc", "graph", 0x7000)]
    pointer.free()
    del pointer
    gc.collect()
    assert releases == [4096]
    assert actions(h) == ["alloc", "free"] and not h.live
    log.close()
    assert (tmp_path / "alloc.csv").read_text().count("graph") == 2  # the allocation and its free


def test_a_manager_that_starts_the_history_as_it_initializes_again_does_not_deadlock(frontend_name, tmp_path):
    """``NUMBA_POOL_OOM_SNAPSHOT`` starts the history when a manager initializes; starting it
    composes every registered manager's path again, this one's included.  After a reset (the
    manager stays registered) and ``record_history(False)``, the next allocation initializes
    again: the history must be started outside the manager's initialization lock, or composing
    this manager's path waits for the lock its own thread holds."""
    from numba_pool import config as pool_config
    from numba_pool.plugin.manager import manager_class
    p = Program(arena=False, frontend=frontend_name)
    config = pool_config.load(environ={}, oom_snapshot=str(tmp_path / "oom.pickle"))
    mm = manager_class(p.frontend)(context=p.context, config=config)
    mm.initialize()
    assert process.recording is not None
    mm.reset()
    numba_pool.record_history(False)
    done = []
    thread = threading.Thread(target=lambda: done.append(mm.memalloc(256)), daemon=True)
    thread.start()
    thread.join(timeout=20)
    # Deadlocked, the manager's lock stays taken: no cleanup through it (the thread is a daemon).
    assert done, "the allocation after the reset never returned: initialization deadlocked"
    try:
        assert process.recording is not None  # the history is on again, and the path records
        assert mm.path.layers[0] == "history"
        done.clear()
    finally:
        numba_pool.record_history(False)
        mm.reset()
        p.close()
