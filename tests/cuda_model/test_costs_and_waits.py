"""The model's count of the library's legacy-stream operations (:mod:`cuda_model.costs`) and its
deadlock check for waiting kernels (:mod:`cuda_model.deadlock`), with the harness's side of both
(:mod:`cuda_model.harness_waits`).  "The library" is a stand-in module made here, passed as
``CudaModel(library=...)``: what it calls is the library's, what the test calls is the
program's."""

from __future__ import annotations

import importlib.util

import pytest
from cuda.bindings import driver as cu

from cuda_model import CudaModel, LegacyCost
from cuda_model.checks import FENCE_BLOCKS, legacy_cost_problems
from cuda_model.costs import CallFigures
from cuda_model.harness import LEGACY as HARNESS_LEGACY
from cuda_model.harness import Program

R = cu.CUresult
LEGACY = cu.CU_STREAM_LEGACY
NOT_READY = R.CUDA_ERROR_NOT_READY

LIBRARY = '''
def record(m, stream):
    """An event recorded on ``stream`` (and destroyed), as an allocator's fence does."""
    event = m.cuEventCreate(0)[1]
    m.cuEventRecord(event, stream)
    m.cuEventDestroy(event)

def synchronize(m):
    m.cuCtxSynchronize()

def synchronize_stream(m, stream):
    m.cuStreamSynchronize(stream)
'''


@pytest.fixture
def lib(tmp_path):
    """The stand-in library, a module in its own folder."""
    folder = tmp_path / "library"
    folder.mkdir()
    (folder / "fake.py").write_text(LIBRARY)
    spec = importlib.util.spec_from_file_location("fake_library", folder / "fake.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.folder = str(folder)
    return module


@pytest.fixture
def m(lib) -> CudaModel:
    return CudaModel(library=lib.folder)


def ok(result):
    err, *values = result
    assert err == R.CUDA_SUCCESS, err
    return values[0] if values else None


def stream(m: CudaModel, blocking: bool):
    return ok(m.cuStreamCreate(0 if blocking else cu.CUstream_flags.CU_STREAM_NON_BLOCKING))


def event_on(m: CudaModel, s):
    event = ok(m.cuEventCreate(0))
    ok(m.cuEventRecord(event, s))
    return event


def deadlocks(m: CudaModel) -> list:
    return [v for v in m.violations if v.kind == "deadlock"]


# --------------------------------------------------------------------------- deadlocks


def test_a_library_event_record_on_the_legacy_stream_during_a_wait_deadlocks_the_copy(m, lib):
    a, b = stream(m, True), stream(m, True)
    kernel = m.launch_waiting(a)
    lib.record(m, LEGACY)  # waits for the kernel (a blocking stream's); the copy on b waits for it
    m.release_waiting(kernel, b)
    [found] = m.violations
    text = str(found)
    assert found.kind == "deadlock"
    assert "the copy that releases the waiting kernel on the stream" in text, text
    assert "through event record on the legacy stream" in text and "that numba_pool queued at" in text, text
    assert m.waiting_kernels() == [] and m.stats()["deadlocks"] == 1


def test_the_programs_own_legacy_record_is_named_as_the_programs(m):
    a, b = stream(m, True), stream(m, True)
    kernel = m.launch_waiting(a)
    m.cuEventDestroy(event_on(m, LEGACY))
    m.release_waiting(kernel, b)
    [found] = deadlocks(m)
    assert "that the program queued at" in str(found) and "test_costs_and_waits.py" in str(found), str(found)


def test_the_library_is_named_before_the_program_when_both_order_the_copy(m, lib):
    a, b = stream(m, True), stream(m, True)
    kernel = m.launch_waiting(a)
    m.cuEventDestroy(event_on(m, LEGACY))  # the program's, first
    lib.record(m, LEGACY)
    m.release_waiting(kernel, b)
    assert "numba_pool queued" in str(deadlocks(m)[0])


@pytest.mark.parametrize("a_blocking, b_blocking", [(False, False), (False, True), (True, False)])
def test_no_deadlock_when_the_legacy_stream_cannot_reach_the_copy(m, lib, a_blocking, b_blocking):
    """A non-blocking stream orders nothing with the legacy stream: a legacy-stream operation
    during the wait reaches the copy only when both streams are blocking."""
    a, b = stream(m, a_blocking), stream(m, b_blocking)
    private = stream(m, False)
    kernel = m.launch_waiting(a)
    lib.record(m, LEGACY)
    lib.record(m, private)
    lib.synchronize_stream(m, private)  # the host waits for something clear of the kernel
    m.release_waiting(kernel, b)
    ok(m.cuStreamSynchronize(a))  # released: the kernel completes
    assert m.violations == [] and m.stats()["waiting_kernels"] == 1


def test_a_copy_on_the_legacy_stream_beside_a_non_blocking_waiting_kernel_is_fine(m, lib):
    a = stream(m, False)
    kernel = m.launch_waiting(a)
    lib.record(m, LEGACY)
    m.release_waiting(kernel, LEGACY)
    assert m.violations == []


def test_a_stream_wait_on_an_event_after_the_kernel_deadlocks_the_copy(m):
    a, b = stream(m, False), stream(m, False)
    kernel = m.launch_waiting(a)
    ok(m.cuStreamWaitEvent(b, event_on(m, a), 0))
    m.release_waiting(kernel, b)
    assert "through stream wait on the stream" in str(deadlocks(m)[0])


@pytest.mark.parametrize("how", ["context", "kernel's stream", "event after the kernel", "legacy event",
                                 "legacy stream after it"])
def test_the_host_blocking_on_the_waiting_kernel_deadlocks(m, lib, how):
    a, b = stream(m, True), stream(m, True)
    kernel = m.launch_waiting(a)
    if how == "context":
        lib.synchronize(m)
    elif how == "kernel's stream":
        lib.synchronize_stream(m, a)
    elif how == "event after the kernel":
        ok(m.cuEventSynchronize(event_on(m, a)))
    elif how == "legacy event":  # the legacy stream waits for the kernel, a blocking stream's
        ok(m.cuEventSynchronize(event_on(m, LEGACY)))
    else:
        lib.record(m, LEGACY)
        m.cuEventDestroy(event_on(m, b))  # b follows the legacy stream's record
        ok(m.cuStreamSynchronize(b))
    [found] = deadlocks(m)
    assert "until the waiting kernel on the stream" in str(found), str(found)
    if how == "context":
        assert "the host blocks in cuCtxSynchronize (numba_pool)" in str(found), str(found)
    if how == "legacy stream after it":
        assert "the host blocks in cuStreamSynchronize (the program)" in str(found), str(found)
        assert "through event record on the legacy stream" in str(found) and "numba_pool queued" in str(found)
    m.release_waiting(kernel, b)  # reported once: the wait ended with the report
    assert len(deadlocks(m)) == 1


def test_the_host_may_wait_for_work_clear_of_the_waiting_kernel(m):
    a, b = stream(m, True), stream(m, False)
    before = event_on(m, a)
    kernel = m.launch_waiting(a)
    ok(m.cuEventSynchronize(before))  # recorded before the kernel
    ok(m.cuEventSynchronize(event_on(m, b)))
    ok(m.cuStreamSynchronize(LEGACY))  # nothing on it since the kernel
    m.release_waiting(kernel, b)
    ok(m.cuCtxSynchronize())
    assert m.violations == []


def test_queries_answer_not_ready_for_work_after_a_waiting_kernel_until_it_is_released(m):
    a, b = stream(m, True), stream(m, False)
    before = event_on(m, a)
    ok(m.cuEventSynchronize(before))
    kernel = m.launch_waiting(a)
    after, legacy = event_on(m, a), event_on(m, LEGACY)
    assert m.cuEventQuery(before) == (R.CUDA_SUCCESS,)
    for _ in range(3):  # polling never completes it
        assert m.cuEventQuery(after) == (NOT_READY,) and m.cuEventQuery(legacy) == (NOT_READY,)
        assert m.cuStreamQuery(a) == (NOT_READY,) and m.cuStreamQuery(LEGACY) == (NOT_READY,)
    assert m.cuStreamQuery(b) == (R.CUDA_SUCCESS,)  # nothing on it yet
    m.release_waiting(kernel, b)
    assert m.cuEventQuery(after) == (NOT_READY,)  # released, not yet seen complete
    ok(m.cuStreamSynchronize(a))
    assert m.cuEventQuery(after) == (R.CUDA_SUCCESS,) and m.cuStreamQuery(a) == (R.CUDA_SUCCESS,)
    assert m.violations == []


# --------------------------------------------------------------------------- costs


def test_only_the_librarys_legacy_operations_count_for_the_call_they_happen_in(m, lib):
    s = stream(m, True)
    with m.attributed("allocation"):
        lib.record(m, LEGACY)
        lib.record(m, LEGACY)
        lib.record(m, s)  # not the legacy stream
        m.launch(LEGACY, [])  # the program's
    with m.attributed("allocation", deferred=True):
        pass
    with m.attributed("release"):
        m.cuEventDestroy(event_on(m, LEGACY))  # the program's own ordering of a drop
    lib.record(m, LEGACY)  # outside every call
    cost = m.legacy_cost()
    allocations = cost.figures("allocation")
    assert (allocations.calls, allocations.ops, allocations.calls_with_ops, allocations.most) == (2, 2, 1, 2)
    assert cost.figures("allocation", deferred=True).calls == 1 and cost.figures("allocation", deferred=True).ops == 0
    assert cost.figures("release").calls == 1 and cost.figures("release").ops == 0 and cost.elsewhere == 1
    [example] = allocations.examples
    assert len(example) == 2 and "event record on the legacy stream" in example[0], example
    stats = m.stats()
    assert (stats["allocation_calls"], stats["legacy_ops_at_allocations"], stats["most_legacy_ops_per_allocation"],
            stats["release_calls"], stats["legacy_ops_at_releases"],
            stats["legacy_ops_elsewhere"]) == (2, 2, 2, 1, 0, 1)


def test_a_call_in_which_the_library_synchronized_the_context_is_excused(m, lib):
    with m.attributed("release"):
        lib.synchronize(m)
        lib.record(m, LEGACY)  # rule 8's fallback frees on the legacy stream after its synchronize
    with m.attributed("release"):
        ok(m.cuCtxSynchronize())  # the program's synchronize excuses nothing
        lib.record(m, LEGACY)
    releases = m.legacy_cost().figures("release")
    assert (releases.calls, releases.ops, releases.excused_calls, releases.excused_ops) == (2, 1, 1, 1)


def test_another_contexts_legacy_stream_counts_too(m, lib):
    other = m.create_context()
    ok(m.cuCtxPushCurrent(other))
    with m.attributed("release"):
        lib.record(m, LEGACY)
    assert m.legacy_cost().figures("release").ops == 1


def cost_with(**calls) -> LegacyCost:
    """A LegacyCost with one CallFigures per ``group=(calls, calls_with_ops, ops)``."""
    cost = LegacyCost()
    for key, (calls, with_ops, ops) in calls.items():
        group, _, deferred = key.partition("_")
        cost.by_call[(group, "", bool(deferred))] = CallFigures(calls=calls, calls_with_ops=with_ops, ops=ops,
                                                               most=ops, examples=[["an op"]] if ops else [])
    return cost


def test_the_issue_33_bounds_read_the_figures():
    fine = cost_with(release=(64, 0, 0), allocation=(100, 2, 2), allocation_deferred=(10, 0, 0))
    assert legacy_cost_problems(fine) == []
    [release] = legacy_cost_problems(cost_with(release=(64, 1, 1)))
    assert release.startswith("1 of 64 releases issued 1 legacy-stream operation(s)")
    [deferred] = legacy_cost_problems(cost_with(release=(64, 0, 0), allocation_deferred=(10, 1, 1)))
    assert "allocations inside defer_cleanup" in deferred
    fences = cost_with(release=(2 * FENCE_BLOCKS - 1, 0, 0), allocation=(100, 2, 2))
    [bound] = legacy_cost_problems(fences)
    assert "more fences than one per 32 released blocks" in bound and "at most 1" in bound, bound
    assert legacy_cost_problems(fences, fences=False) == []
    assert "release in defer_cleanup" in str(cost_with(release_deferred=(1, 0, 0)))


# --------------------------------------------------------------------------- the harness


def test_the_harness_counts_each_allocation_and_release_and_not_its_own_ordering():
    p = Program(arena=False)
    try:
        non_blocking = p.create_stream(False)
        family = p.allocate(1000)
        p.launch(non_blocking, [family])
        with p.defer_cleanup():
            assert p.deferred
            inside = p.allocate(1000)
        # The program's own event, waited for by the legacy stream: not numba_pool's.
        p.drop(family, legalize="wait")
        p.drop(inside)
        cost = p.model.legacy_cost()
        assert cost.figures("allocation").calls == 2 and cost.figures("allocation", deferred=True).calls == 1
        assert cost.figures("release").calls == 2 and cost.figures("release").ops == 0, cost
        stats = p.finish()
        assert stats["allocation_calls"] == 2 and stats["release_calls"] == 2, stats
        assert p.legacy_cost.figures("release").calls == 2
    finally:
        p.close()


def test_the_harness_keeps_a_waiting_programs_own_work_clear_of_the_kernel():
    p = Program(arena=False)
    try:
        a, b, c = p.create_stream(True), p.create_stream(True), p.create_stream(False)
        on_a = p.allocate(1000, a)
        on_c = p.allocate(1000, c)
        used_on_a = p.allocate(1000, c)
        p.launch(a, [on_a, used_on_a])
        assert p.may_enqueue(HARNESS_LEGACY) and p.headroom() > 0
        p.launch_waiting(a)
        assert not p.may_enqueue(a) and not p.may_enqueue(HARNESS_LEGACY)  # the legacy stream follows a
        assert p.may_enqueue(b) and p.may_enqueue(c)
        # Legalized by record_stream(a), whose event would follow the kernel; not inside defer_cleanup.
        assert not p.may_drop_while_waiting(used_on_a, "record") and p.may_drop_while_waiting(used_on_a, "scope")
        assert p.may_drop_while_waiting(on_a, "record") and p.may_drop_while_waiting(on_c, "record")
        assert p.may_launch_while_waiting(c, on_c) and not p.may_launch_while_waiting(b, on_a)
        p.launch(c, [on_c])
        p.release_waiting(b, synchronize=True)
        assert p.waiting is None and p.may_enqueue(a)
        p.check()
        p.finish()
    finally:
        p.close()


# --------------------------------------------------------------------------- opportunistic reuse


def pool(m: CudaModel):
    return ok(m.cuDeviceGetDefaultMemPool(m.CUdevice(0)))


def test_opportunistic_reuse_hands_a_completable_free_to_another_stream_after_it(m):
    """The execution where every free that can complete has: the pool reuses it on any stream,
    and the host learns the free complete (the driver saw it so at the call): later work on any
    stream follows it, and what it was ordered after."""
    m.opportunistic_reuse = True
    x, s = stream(m, False), stream(m, False)
    address = int(ok(m.cuMemAllocFromPoolAsync(1024, pool(m), x)))
    m.launch(x, [(address, 1024, "first")])
    ok(m.cuMemFreeAsync(address, x))
    again = int(ok(m.cuMemAllocFromPoolAsync(1024, pool(m), s)))
    assert again == address and m.stats()["reuse_cross_stream"] == 1
    assert m.cuStreamQuery(x) == (R.CUDA_SUCCESS,)  # the host knows the free and the use complete
    m.launch(s, [(again, 1024, "second")])
    m.launch(LEGACY, [(again, 1024, "second")])
    assert m.violations == []


def test_opportunistic_reuse_of_a_free_not_ordered_after_the_last_use_is_caught(m):
    """A free issued on another stream than the use, before the use is known complete (the
    planted fence bug's shape): the next owner races the use."""
    m.opportunistic_reuse = True
    x, private, s = stream(m, False), stream(m, False), stream(m, False)
    address = int(ok(m.cuMemAllocFromPoolAsync(1024, pool(m), private)))
    m.wait(x, private)
    m.launch(x, [(address, 1024, "first")])
    ok(m.cuMemFreeAsync(address, private))  # nothing orders it after the use on x
    again = int(ok(m.cuMemAllocFromPoolAsync(1024, pool(m), s)))
    m.launch(s, [(again, 1024, "second")])
    [found] = m.violations
    assert found.kind == "unordered reuse" and found.prev_owner == "first" and found.new_owner == "second"


def test_a_free_behind_a_waiting_kernel_is_not_reused_opportunistically(m):
    m.opportunistic_reuse = True
    a, s = stream(m, False), stream(m, False)
    address = int(ok(m.cuMemAllocFromPoolAsync(1024, pool(m), a)))
    kernel = m.launch_waiting(a)
    ok(m.cuMemFreeAsync(address, a))  # cannot complete before the copy
    assert int(ok(m.cuMemAllocFromPoolAsync(1024, pool(m), s))) != address
    m.release_waiting(kernel, s)
    assert int(ok(m.cuMemAllocFromPoolAsync(1024, pool(m), s))) == address
    assert m.violations == []


def test_queries_of_work_after_a_waiting_kernel_answer_not_ready_on_an_eager_device(m):
    """``gpu_eager`` (a device that has finished all it can when the host asks): still nothing
    after the waiting kernel completes before its copy."""
    m.gpu_eager = True
    a, b = stream(m, True), stream(m, False)
    kernel = m.launch_waiting(a)
    after = event_on(m, a)
    assert m.cuEventQuery(after) == (NOT_READY,) and m.cuStreamQuery(a) == (NOT_READY,)
    assert m.cuStreamQuery(LEGACY) == (R.CUDA_SUCCESS,)  # nothing on it since the kernel
    m.cuEventDestroy(event_on(m, b))
    assert m.cuStreamQuery(b) == (R.CUDA_SUCCESS,)  # can complete: the host learns it
    m.release_waiting(kernel, b)
    assert m.cuStreamQuery(a) == (R.CUDA_SUCCESS,) and m.violations == []
