"""Tests of the CUDA stream-ordering / mempool model (the package ``cuda_model``), through its own API.

Controls (legal programs) must give no violation; planted ordering bugs must be caught and
named; the pool must never hand a block across streams without ordering; accounting follows
the ``CU_MEMPOOL_ATTR_*`` rules.  A hypothesis property runs random legal programs (0
violations) and the same programs with one needed ordering step removed (>= 1 violation).
"""

from __future__ import annotations

import threading
import time

import pytest
from cuda.bindings import driver as cu
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cuda_model import GRANULE, CudaModel, Op, Violation, op_a_precedes

R = cu.CUresult
ATTR = cu.CUmemPool_attribute
BLOCKING = cu.CUstream_flags.CU_STREAM_DEFAULT
NON_BLOCKING = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
LEGACY = cu.CU_STREAM_LEGACY
PER_THREAD = cu.CU_STREAM_PER_THREAD
KEEP_ALL = (1 << 64) - 1


def ok(result):
    """The value(s) of a successful cuda-python style result tuple."""
    err, *values = result
    assert err == R.CUDA_SUCCESS, err
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def new_stream(m: CudaModel, blocking: bool = True):
    return ok(m.cuStreamCreate(BLOCKING if blocking else NON_BLOCKING))


def default_pool(m: CudaModel):
    return ok(m.cuDeviceGetDefaultMemPool(m.CUdevice(0)))


def alloc(m: CudaModel, nbytes: int, stream, pool=None) -> int:
    return int(ok(m.cuMemAllocFromPoolAsync(nbytes, pool if pool is not None else default_pool(m), stream)))


def free(m: CudaModel, address: int, stream) -> None:
    ok(m.cuMemFreeAsync(m.CUdeviceptr(address), stream))


def use(m: CudaModel, stream, address: int, nbytes: int, owner) -> Op:
    return m.launch(stream, [(address, nbytes, owner)])


def attr(m: CudaModel, pool, which) -> int:
    return int(ok(m.cuMemPoolGetAttribute(pool, which)))


def set_threshold(m: CudaModel, pool, nbytes: int) -> None:
    ok(m.cuMemPoolSetAttribute(pool, ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(nbytes)))


def private_pool(m: CudaModel, max_size: int = 0):
    props = m.CUmemPoolProps()
    props.allocType = m.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = m.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.maxSize = max_size
    return ok(m.cuMemPoolCreate(props))


@pytest.fixture
def m() -> CudaModel:
    return CudaModel()


# --------------------------------------------------------------------------- module surface


def test_types_pass_through_to_the_real_module(m):
    assert m.CUresult is cu.CUresult
    assert m.CUstream(5) == cu.CUstream(5) and int(m.CUstream(5)) == 5
    assert int(m.CUdeviceptr(256)) == 256
    assert int(m.cuuint64_t(7)) == 7
    assert m.CU_STREAM_LEGACY == cu.CU_STREAM_LEGACY
    assert m.CUresult.CUDA_ERROR_OUT_OF_MEMORY == R.CUDA_ERROR_OUT_OF_MEMORY


@pytest.mark.parametrize("name", ["cuMemAlloc", "cuMemAllocHost", "cuLaunchKernel", "cuCtxSetCurrent"])
def test_unmodelled_driver_function_raises(m, name):
    with pytest.raises(AttributeError, match=f"CudaModel does not model {name}"):
        getattr(m, name)
    assert not hasattr(m, name)


def test_results_are_tuples_like_cuda_python(m):
    s = new_stream(m)
    assert isinstance(s, cu.CUstream)
    assert m.cuStreamSynchronize(s) == (R.CUDA_SUCCESS,)
    err, free_bytes, total = m.cuMemGetInfo()
    assert err == R.CUDA_SUCCESS and free_bytes == total == 1 << 30
    ptr = ok(m.cuMemAllocFromPoolAsync(100, default_pool(m), s))
    assert isinstance(ptr, cu.CUdeviceptr) and int(ptr) % GRANULE == 0
    assert m.cuMemFreeAsync(ptr, s) == (R.CUDA_SUCCESS,)  # a CUdeviceptr object is accepted


# --------------------------------------------------------------------------- streams and events


def test_stream_handles_are_reused_lifo_but_ids_are_not(m):
    a, b = new_stream(m), new_stream(m, blocking=False)
    assert int(a) not in (0, 1, 2) and int(a) != int(b)
    ids = {ok(m.cuStreamGetId(a)), ok(m.cuStreamGetId(b)), ok(m.cuStreamGetId(0)), ok(m.cuStreamGetId(PER_THREAD))}
    assert len(ids) == 4
    ok(m.cuStreamDestroy(a))
    ok(m.cuStreamDestroy(b))
    c = new_stream(m)
    assert int(c) == int(b)  # LIFO
    assert ok(m.cuStreamGetId(c)) not in ids
    assert ok(m.cuStreamGetId(0)) == ok(m.cuStreamGetId(LEGACY))


def test_destroyed_stream_handle_is_invalid(m):
    s = new_stream(m)
    ok(m.cuStreamDestroy(s))
    assert m.cuStreamSynchronize(s) == (R.CUDA_ERROR_INVALID_HANDLE,)
    assert m.cuMemAllocFromPoolAsync(256, default_pool(m), s) == (R.CUDA_ERROR_INVALID_HANDLE, None)
    assert m.launch(s, []) is None
    assert [v.kind for v in m.violations] == ["invalid stream"] * 3
    assert f"{int(s):#x}" in str(m.violations[0]) and "test_model.py" in str(m.violations[0])


def test_blocking_streams_order_with_legacy_non_blocking_do_not(m):
    b, n = new_stream(m), new_stream(m, blocking=False)
    tb = use(m, b, 0, 0, "x")
    tn = use(m, n, 0, 0, "x")
    assert m.would_follow(0, tb) and not m.would_follow(0, tn)  # legacy waits for blocking only
    tl = use(m, 0, 0, 0, "x")
    assert m.would_follow(b, tl) and not m.would_follow(n, tl)
    assert m.would_follow(PER_THREAD, tl)  # the per-thread default stream is blocking
    assert not m.would_follow(n, tb)


def test_stream_synchronize_is_conservative_for_legacy(m):
    b, n = new_stream(m), new_stream(m, blocking=False)
    tb = use(m, b, 0, 0, "x")
    ok(m.cuStreamSynchronize(LEGACY))  # nothing on legacy was ordered after b's work yet
    assert not m.would_follow(n, tb)
    use(m, 0, 0, 0, "x")  # an op on legacy waits for b
    ok(m.cuStreamSynchronize(0))
    assert m.would_follow(n, tb)


def test_ctx_synchronize_covers_every_stream(m):
    n1, n2 = new_stream(m, False), new_stream(m, False)
    t1 = use(m, n1, 0, 0, "x")
    ok(m.cuStreamDestroy(n1))  # its work still completes
    assert not m.would_follow(n2, t1)
    ok(m.cuCtxSynchronize())
    assert m.would_follow(n2, t1)


def test_event_semantics(m):
    n1, n2 = new_stream(m, False), new_stream(m, False)
    e = ok(m.cuEventCreate(0))
    ok(m.cuStreamWaitEvent(n2, e, 0))  # never recorded: a no-op
    assert m.cuEventQuery(e) == (R.CUDA_SUCCESS,)
    t1 = use(m, n1, 0, 0, "x")
    ok(m.cuEventRecord(e, n1))
    assert m.cuEventQuery(e) == (R.CUDA_ERROR_NOT_READY,)
    ok(m.cuStreamWaitEvent(n2, e, 0))
    t2 = use(m, n1, 0, 0, "x")
    ok(m.cuEventRecord(e, n1))  # re-recorded: n2's earlier wait is unchanged
    assert m.would_follow(n2, t1) and not m.would_follow(n2, t2)
    ok(m.cuEventDestroy(e))  # the wait keeps its effect
    assert m.would_follow(n2, t1)
    assert m.cuEventRecord(e, n1) == (R.CUDA_ERROR_INVALID_HANDLE,)
    assert m.violations[-1].kind == "invalid event"
    e2 = ok(m.cuEventCreate(0))
    ok(m.cuEventRecord(e2, n1))
    ok(m.cuEventSynchronize(e2))
    assert m.cuEventQuery(e2) == (R.CUDA_SUCCESS,)
    assert m.would_follow(n2, t2)


def test_op_a_precedes_and_tail(m):
    s = new_stream(m, False)
    assert m.tail(s) is None and m.would_follow(s, None)
    op = use(m, s, 0, 0, "x")
    assert m.tail(s) is op and op_a_precedes(op, op.vc) and CudaModel.op_a_precedes(op, {op.stream_id: op.seq})
    assert not op_a_precedes(op, {})


# --------------------------------------------------------------------------- controls: 0 violations


def test_same_stream_reuse(m):
    for s in (new_stream(m, False), new_stream(m), 0, PER_THREAD):
        a = alloc(m, 1000, s)
        use(m, s, a, 1000, ("a", s))
        free(m, a, s)
        b = alloc(m, 1000, s)
        assert b == a
        use(m, s, b, 1000, ("b", s))
        free(m, b, s)
    m.assert_no_violations()
    assert m.stats()["reuse_same_stream"] == 4


def test_legacy_frees_with_blocking_users(m):
    b1 = new_stream(m)
    a = alloc(m, 4096, 0)
    use(m, b1, a, 4096, "a")  # ordered after the allocation on legacy
    free(m, a, 0)  # the free on legacy waits for b1
    b = alloc(m, 4096, 0)
    assert b == a
    use(m, b1, b, 4096, "b")
    use(m, 0, b, 4096, "b")
    m.assert_no_violations()


def test_blocking_user_free_on_legacy_reuse_on_other_blocking_stream(m):
    b1, b2 = new_stream(m), new_stream(m)
    a = alloc(m, 2048, b1)
    use(m, b1, a, 2048, "a")
    free(m, a, LEGACY)
    b = alloc(m, 2048, b2)  # b2's next op is ordered after the free on legacy
    assert b == a
    use(m, b2, b, 2048, "b")
    m.assert_no_violations()
    assert m.stats()["reuse_cross_stream_pending"] == 1


def test_event_ordering_between_non_blocking_streams(m):
    n1, n2 = new_stream(m, False), new_stream(m, False)
    a = alloc(m, 512, n1)
    use(m, n1, a, 512, "a")
    free(m, a, n1)
    m.wait(n2, n1)  # event recorded after the free, waited on by n2
    b = alloc(m, 512, n2)
    assert b == a
    use(m, n2, b, 512, "b")
    # the other way: order the free's stream after the uses, then free there
    m.wait(n1, n2)
    free(m, b, n1)
    c = alloc(m, 512, n1)
    assert c == a
    use(m, n1, c, 512, "c")
    m.assert_no_violations()
    assert m.stats()["reuse_cross_stream"] == 1


@pytest.mark.parametrize("threshold", [0, KEEP_ALL])
@pytest.mark.parametrize("sync", ["stream", "event", "ctx"])
def test_host_synchronize_before_cross_stream_reuse(m, threshold, sync):
    set_threshold(m, default_pool(m), threshold)
    n1, n2 = new_stream(m, False), new_stream(m, False)
    a = alloc(m, 768, n1)
    use(m, n1, a, 768, "a")
    free(m, a, n1)
    if sync == "stream":
        ok(m.cuStreamSynchronize(n1))
    elif sync == "event":
        e = ok(m.cuEventCreate(0))
        ok(m.cuEventRecord(e, n1))
        ok(m.cuEventSynchronize(e))
    else:
        ok(m.cuCtxSynchronize())
    b = alloc(m, 768, n2)
    assert b == a  # from the pool (threshold kept it) or from the unmapped range
    use(m, n2, b, 768, "b")
    m.assert_no_violations()


def test_per_thread_default_stream_is_blocking(m):
    b = new_stream(m)
    a = alloc(m, 1024, PER_THREAD)
    use(m, PER_THREAD, a, 1024, "a")
    free(m, a, LEGACY)  # legacy waits for the per-thread stream
    c = alloc(m, 1024, b)
    assert c == a
    use(m, b, c, 1024, "c")
    use(m, PER_THREAD, c, 1024, "c")
    m.assert_no_violations()


def test_per_thread_streams_differ_between_threads(m):
    ids = []
    worker = threading.Thread(target=lambda: ids.append(ok(m.cuStreamGetId(PER_THREAD))))
    worker.start()
    worker.join()
    assert ids[0] != ok(m.cuStreamGetId(PER_THREAD))


def test_threads_allocating_concurrently(m):
    def work(k):
        for i in range(60):
            a = alloc(m, 256 * (1 + i % 5), PER_THREAD)
            use(m, PER_THREAD, a, 256, (k, i))
            free(m, a, PER_THREAD)
            if i % 20 == 0:
                ok(m.cuStreamSynchronize(PER_THREAD))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m.assert_no_violations()
    assert m.stats()["live_allocations"] == 0 and m.stats()["reuse_same_stream"] > 100


def test_large_arrays_are_cheap(m):
    big = 64 << 20
    s = new_stream(m, False)
    start = time.perf_counter()
    a = alloc(m, big, s)
    for i in range(200):
        use(m, s, a + (i % 7) * 4096, big - 7 * 4096, "a")
    free(m, a, s)
    b = alloc(m, big, s)
    use(m, s, b, big, "b")
    assert time.perf_counter() - start < 1
    assert m.stats()["granule_segments"] <= 3
    m.assert_no_violations()


# --------------------------------------------------------------------------- planted bugs


def only_reuse_violation(m: CudaModel) -> Violation:
    kinds = [v.kind for v in m.violations]
    assert kinds and set(kinds) == {"unordered reuse"}, kinds
    return m.violations[0]


def test_caught_non_blocking_use_free_on_legacy_reuse_elsewhere(m):
    n1, n2 = new_stream(m, False), new_stream(m, False)
    a = alloc(m, 1024, LEGACY)
    m.wait(n1, LEGACY)
    use(m, n1, a, 1024, "a")  # legacy does not wait for the non-blocking n1 ...
    free(m, a, LEGACY)
    b = alloc(m, 1024, LEGACY)  # ... so this same-stream reuse races with the use
    assert b == a
    m.wait(n2, LEGACY)
    use(m, n2, b, 1024, "b")
    v = only_reuse_violation(m)
    text = str(v)
    assert "'a'" in text and "'b'" in text
    assert f"stream {int(n1):#x}" in text and f"stream {int(n2):#x}" in text
    assert v.prev_stream == int(n1) and v.new_stream == int(n2)
    assert v.prev_stream_id == m.stream_id(n1) and v.new_stream_id == m.stream_id(n2)
    assert "test_model.py" in v.prev_site and "test_model.py" in v.new_site
    assert (v.start, v.end) == (a, a + 1024)


def test_caught_wait_on_event_recorded_before_last_use(m):
    n1, n2 = new_stream(m, False), new_stream(m, False)
    e = ok(m.cuEventCreate(0))
    a = alloc(m, 512, n1)
    use(m, n1, a, 512, "a")
    ok(m.cuEventRecord(e, n1))
    use(m, n1, a, 512, "a")  # the last use, after the record
    ok(m.cuStreamWaitEvent(n2, e, 0))
    ok(m.cuEventRecord(e, n1))  # re-recording now does not help the wait already issued
    free(m, a, n2)
    b = alloc(m, 512, n2)
    assert b == a
    use(m, n2, b, 512, "b")
    v = only_reuse_violation(m)
    assert (v.prev_owner, v.new_owner) == ("a", "b") and v.prev_stream == int(n1)


def test_caught_new_stream_on_a_reused_handle_is_not_ordered_after_the_old_one(m):
    old = new_stream(m, False)
    slab = alloc(m, 4096, old)  # a sub-allocator's slab, live throughout
    old_use = use(m, old, slab, 2048, "a")
    a = alloc(m, 2048, old)
    free(m, a, old)
    ok(m.cuStreamDestroy(old))
    new = new_stream(m, False)
    assert int(new) == int(old)
    assert not m.would_follow(new, old_use)
    assert alloc(m, 2048, new) != a  # the pool does not treat the new stream as the old one
    m.assert_no_violations()
    use(m, new, slab, 2048, "b")  # a sub-allocator keyed by handle value would do this
    v = only_reuse_violation(m)
    assert v.prev_stream == v.new_stream == int(old) and v.prev_stream_id != v.new_stream_id
    assert (v.prev_owner, v.new_owner) == ("a", "b")


def test_caught_use_unordered_with_one_of_several_concurrent_uses(m):
    n1, n2, n3 = (new_stream(m, False) for _ in range(3))
    a = alloc(m, 1024, n1)
    m.wait(n2, n1)
    use(m, n1, a, 1024, "a")
    use(m, n2, a, 1024, "a")  # two unordered uses: both stay in the frontier
    use(m, n1, a, 512, "a")
    m.wait(n3, n2)  # n3 follows the use on n2 but not those on n1
    use(m, n3, a + 512, 512, "b")
    v = only_reuse_violation(m)
    assert len(m.violations) == 1 and v.prev_stream == int(n1) and (v.start, v.end) == (a + 512, a + 1024)
    m.wait(n3, n1)
    use(m, n3, a, 512, "c")  # follows every use of "a" now
    assert len(m.violations) == 1


def test_legacy_waits_for_destroyed_streams_only_when_asked():
    for assume_waits in (False, True):
        m = CudaModel(legacy_waits_for_destroyed=assume_waits)
        b = new_stream(m)
        token = use(m, b, 0, 0, "x")
        ok(m.cuStreamDestroy(b))
        assert m.would_follow(0, token) is assume_waits


def test_caught_unallocated_use_double_free_and_unknown_pointer(m):
    s = new_stream(m, False)
    a = alloc(m, 256, s)
    use(m, s, a - 256, 512, "x")
    assert m.violations[0].kind == "use of unallocated memory"
    assert (m.violations[0].start, m.violations[0].end) == (a - 256, a)
    free(m, a, s)
    assert m.cuMemFreeAsync(a, s) == (R.CUDA_ERROR_INVALID_VALUE,)
    assert m.cuMemFreeAsync(12345, s) == (R.CUDA_ERROR_INVALID_VALUE,)
    assert [v.kind for v in m.violations[-2:]] == ["free of unknown pointer / double free"] * 2
    use(m, s, a, 256, "y")
    assert m.violations[-1].kind == "use of unallocated memory"


@pytest.mark.parametrize("threshold", [0, KEEP_ALL])
def test_pool_never_hands_a_block_across_streams_without_ordering(m, threshold):
    set_threshold(m, default_pool(m), threshold)
    f, s = new_stream(m, False), new_stream(m, False)
    a = alloc(m, 4096, f)
    free(m, a, f)
    assert alloc(m, 4096, s) != a
    assert alloc(m, 4096, LEGACY) != a  # legacy does not wait for a non-blocking stream
    ok(m.cuCtxSynchronize())
    assert alloc(m, 4096, s) == a


def test_pool_reuses_the_most_recent_eligible_block_and_splits(m):
    s = new_stream(m, False)
    a, b = alloc(m, 4096, s), alloc(m, 1024, s)
    free(m, a, s)
    free(m, b, s)
    assert alloc(m, 512, s) == b  # most recently freed
    assert alloc(m, 512, s) == b + 512  # the remainder
    assert alloc(m, 3000, s) == a


def test_pool_joins_adjacent_free_blocks(m):
    s = new_stream(m, False)
    blocks = [alloc(m, 1024, s) for _ in range(4)]
    for x in blocks:
        free(m, x, s)
    assert alloc(m, 4096, s) == blocks[0]
    assert m.stats()["fresh_allocs"] == 4


# --------------------------------------------------------------------------- accounting


def test_reserved_used_and_high_watermarks(m):
    pool = default_pool(m)
    set_threshold(m, pool, KEEP_ALL)
    s = new_stream(m, False)
    a = alloc(m, 1000, s, pool)
    b = alloc(m, 3000, s, pool)
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1024 + 3072
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 4096
    free(m, b, s)
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1024
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 4096
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 4096
    for high in (ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH):
        ok(m.cuMemPoolSetAttribute(pool, high, cu.cuuint64_t(0)))
        assert m.cuMemPoolSetAttribute(pool, high, cu.cuuint64_t(5)) == (R.CUDA_ERROR_INVALID_VALUE,)
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 1024
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 4096
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == KEEP_ALL
    assert m.cuMemPoolGetAttribute(pool, ATTR.CU_MEMPOOL_ATTR_LOCATION_ID) == (R.CUDA_ERROR_INVALID_VALUE, None)
    assert ok(m.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a + 10)) == int(pool)
    free_bytes, total = ok(m.cuMemGetInfo())
    assert total - free_bytes == 4096


def test_trim_releases_only_completed_frees(m):
    pool = default_pool(m)
    set_threshold(m, pool, KEEP_ALL)
    s = new_stream(m, False)
    a = alloc(m, 8192, s, pool)
    free(m, a, s)
    ok(m.cuMemPoolTrimTo(pool, 0))
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 8192  # free not known complete
    ok(m.cuStreamSynchronize(s))
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 8192  # threshold keeps it
    ok(m.cuMemPoolTrimTo(pool, 0))
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0
    assert m.stats()["unmapped_bytes"] == 8192
    assert alloc(m, 256, s, pool) == a  # the unmapped range is mapped again


def test_release_threshold_trims_on_sync(m):
    pool = default_pool(m)
    set_threshold(m, pool, 2048)
    s = new_stream(m, False)
    blocks = [alloc(m, 1024, s, pool) for _ in range(4)]
    for x in blocks:
        free(m, x, s)
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 4096
    ok(m.cuStreamSynchronize(s))
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2048
    set_threshold(m, pool, 0)
    ok(m.cuCtxSynchronize())
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0


def test_max_size_out_of_memory(m):
    pool = private_pool(m, max_size=4096)
    s = new_stream(m, False)
    a = alloc(m, 4096, s, pool)
    assert m.cuMemAllocFromPoolAsync(256, pool, s) == (R.CUDA_ERROR_OUT_OF_MEMORY, None)
    free(m, a, s)
    other = new_stream(m, False)
    assert m.cuMemAllocFromPoolAsync(256, pool, other) == (R.CUDA_ERROR_OUT_OF_MEMORY, None)  # free pending
    assert alloc(m, 256, s, pool) == a
    assert m.stats()["oom"] == 2
    m.assert_no_violations()


def test_device_memory_out_of_memory_counts_other_pools():
    m = CudaModel(device_total=1 << 20)
    s = new_stream(m, False)
    p1, p2 = default_pool(m), private_pool(m)
    alloc(m, 768 << 10, s, p1)
    assert m.cuMemAllocFromPoolAsync(512 << 10, p2, s) == (R.CUDA_ERROR_OUT_OF_MEMORY, None)
    alloc(m, 256 << 10, s, p2)
    assert ok(m.cuMemGetInfo()) == (0, 1 << 20)


def test_zero_bytes_and_bad_arguments(m):
    pool = default_pool(m)
    assert m.cuMemAllocFromPoolAsync(0, pool, 0) == (R.CUDA_ERROR_INVALID_VALUE, None)
    assert m.cuDeviceGetDefaultMemPool(m.CUdevice(1)) == (R.CUDA_ERROR_INVALID_DEVICE, None)
    assert m.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, 4096)[0] \
        == R.CUDA_ERROR_INVALID_VALUE
    assert m.cuStreamDestroy(LEGACY) == (R.CUDA_ERROR_INVALID_HANDLE,)
    assert m.stats()["allocs"] == 0


def test_pool_destroy(m):
    pool = private_pool(m)
    s = new_stream(m, False)
    a = alloc(m, 1024, s, pool)
    ok(m.cuMemPoolDestroy(pool))
    assert m.cuMemAllocFromPoolAsync(256, pool, s) == (R.CUDA_ERROR_INVALID_VALUE, None)
    assert m.violations[-1].kind == "invalid pool"
    free(m, a, s)  # allocations outlive their pool
    assert ok(m.cuMemGetInfo())[0] == (1 << 30) - 1024
    ok(m.cuCtxSynchronize())
    assert ok(m.cuMemGetInfo())[0] == 1 << 30
    assert m.cuMemPoolDestroy(default_pool(m)) == (R.CUDA_ERROR_INVALID_VALUE,)


# --------------------------------------------------------------------------- preempt hook


def test_preempt_wraps_each_driver_call_outside_the_lock(m):
    calls = []
    done = []

    def other_thread_call():
        done.append(ok(m.cuStreamGetId(0)))

    def hook(phase, name):
        calls.append((phase, name))
        if phase == "enter" and name == "cuMemFreeAsync":
            m.cuStreamGetId(0)  # nested: no preempt
            worker = threading.Thread(target=other_thread_call)  # the lock is not held here
            worker.start()
            worker.join(5)

    pool = default_pool(m)
    m.preempt = hook
    a = alloc(m, 256, 0, pool)
    free(m, a, 0)
    m.preempt = None
    assert calls == [("enter", "cuMemAllocFromPoolAsync"), ("exit", "cuMemAllocFromPoolAsync"),
                     ("enter", "cuMemFreeAsync"),
                     ("enter", "cuStreamGetId"), ("exit", "cuStreamGetId"),  # the other thread's call
                     ("exit", "cuMemFreeAsync")]
    assert len(done) == 1


# --------------------------------------------------------------------------- random programs

SIZES = (100, 256, 700, 1024, 2048, 4000)
#: Action kinds, weighted towards allocation traffic (syncs and waits make hazards rarer).
KINDS = ("alloc",) * 3 + ("use",) * 4 + ("free",) * 3 + (
    "wait", "sync_stream", "sync_ctx", "event_sync", "recreate", "trim")


class Program:
    """Runs a random program on a fresh model, ordering every reuse as a correct allocator
    client must (record_stream discipline), optionally leaving out the ``skip``-th *needed*
    ordering step and then showing the hazard.

    Legal discipline: before freeing an allocation on F, order F after its allocation and all
    its uses; before using it on T, order T after its allocation (the pool ordered the
    allocation after the previous owner's free).  An ordering step is *needed* when, by the
    relation (``would_follow``), skipping it leaves a previous owner's use unordered before
    the next owner's use: at a free, some use of the freed allocation is not ordered before F
    (the probe right after, a same-size allocation on F, gets the block back at once); at a
    use on T, some use of a previous owner of the same granules is not ordered before T.
    """

    def __init__(self, threshold: int, skip: int | None = None):
        self.m = m = CudaModel()
        self.pool = default_pool(m)
        set_threshold(m, self.pool, threshold)
        # user streams first: hypothesis favours small numbers, and hazards need unordered streams
        self.slots = [new_stream(m, False), new_stream(m, False), new_stream(m), PER_THREAD, 0]
        self.final_events: dict[int, object] = {}  # stream id of a destroyed stream -> event
        self.live: dict[int, tuple] = {}  # owner -> (address, nbytes, alloc op)
        self.uses: dict[int, list[Op]] = {}
        self.shadow: dict[int, int] = {}  # granule -> last owner (the test's own bookkeeping)
        self.skip, self.needed, self.caught_by_probe = skip, 0, None
        self.next_owner = 0

    def run(self, actions) -> None:
        for kind, x, y in actions:
            getattr(self, "do_" + kind)(x, y)
            if self.caught_by_probe is not None:
                return

    # ---- ordering

    def order_after(self, stream, token: Op) -> None:
        if self.m.would_follow(stream, token):
            return
        for handle in self.slots:
            if self.m.stream_id(handle) == token.stream_id:
                self.m.wait(stream, handle)
                return
        ok(self.m.cuStreamWaitEvent(stream, self.final_events[token.stream_id], 0))

    def take_needed_step(self) -> bool:
        """Count a needed step; False when it is the one to leave out."""
        self.needed += 1
        return self.needed - 1 != self.skip

    def granules(self, address: int, nbytes: int) -> range:
        return range(address // GRANULE, (address + nbytes + GRANULE - 1) // GRANULE)

    # ---- actions

    def do_alloc(self, x, y):
        stream, nbytes = self.slots[x % 5], SIZES[y % len(SIZES)]
        address = alloc(self.m, nbytes, stream, self.pool)
        owner, self.next_owner = self.next_owner, self.next_owner + 1
        self.live[owner] = (address, nbytes, self.m.tail(stream))
        self.uses[owner] = []
        self.do_use(0, self.slots.index(stream))  # written at once, on the allocation's stream

    def do_use(self, x, y):
        if not self.live:
            return
        owner = sorted(self.live)[-1 - x % len(self.live)]  # recent first
        address, nbytes, alloc_op = self.live[owner]
        stream = self.slots[y % 5]
        preds = {self.shadow.get(g) for g in self.granules(address, nbytes)} - {None, owner}
        hazard = not self.m.would_follow(stream, alloc_op) and any(
            not self.m.would_follow(stream, u) for p in preds for u in self.uses[p])
        if not hazard or self.take_needed_step():
            self.order_after(stream, alloc_op)
        self.uses[owner].append(use(self.m, stream, address, nbytes, owner))
        for g in self.granules(address, nbytes):
            self.shadow[g] = owner

    def do_free(self, x, y):
        if not self.live:
            return
        owner = sorted(self.live)[-1 - x % len(self.live)]  # recent first
        address, nbytes, alloc_op = self.live.pop(owner)
        stream = self.slots[y % 5]
        hazard = any(not self.m.would_follow(stream, u) for u in self.uses[owner])
        skipped = hazard and not self.take_needed_step()
        if not skipped:
            for token in [alloc_op, *self.uses[owner]]:
                self.order_after(stream, token)
        free(self.m, address, stream)
        if skipped:  # probe: the same-size allocation on the same stream gets the block back
            probe = alloc(self.m, nbytes, stream, self.pool)
            assert probe == address
            use(self.m, stream, probe, nbytes, "probe")
            self.caught_by_probe = owner

    def do_wait(self, x, y):
        self.m.wait(self.slots[x % 5], self.slots[y % 5])

    def do_sync_stream(self, x, y):
        ok(self.m.cuStreamSynchronize(self.slots[x % 5]))

    def do_sync_ctx(self, x, y):
        ok(self.m.cuCtxSynchronize())

    def do_event_sync(self, x, y):
        event = ok(self.m.cuEventCreate(0))
        ok(self.m.cuEventRecord(event, self.slots[x % 5]))
        ok(self.m.cuEventSynchronize(event))
        ok(self.m.cuEventDestroy(event))

    def do_recreate(self, x, y):
        slot = x % 3
        old = self.slots[slot]
        event = ok(self.m.cuEventCreate(0))
        ok(self.m.cuEventRecord(event, old))  # kept: later streams may need to wait for old's work
        self.final_events[self.m.stream_id(old)] = event
        ok(self.m.cuStreamDestroy(old))
        self.slots[slot] = new_stream(self.m, blocking=slot == 2)
        assert int(self.slots[slot]) == int(old)

    def do_trim(self, x, y):
        ok(self.m.cuMemPoolTrimTo(self.pool, (x % 4) * 1024))


programs = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 5), st.integers(0, 5)),
                    min_size=8, max_size=40)
thresholds = st.sampled_from([0, 4096, KEEP_ALL])
fast = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@fast
@given(programs, thresholds)
def test_random_legal_programs_have_no_violation(actions, threshold):
    program = Program(threshold)
    program.run(actions)
    program.m.assert_no_violations()
    m = program.m
    used = attr(m, program.pool, ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    assert used == sum((n + GRANULE - 1) // GRANULE * GRANULE for _, n, _ in program.live.values())
    assert attr(m, program.pool, ATTR.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= used


@fast
@given(programs, thresholds, st.integers(0, 1000))
def test_random_programs_with_one_needed_ordering_step_removed_are_caught(actions, threshold, which):
    legal = Program(threshold)
    legal.run(actions)
    assume(legal.needed > 0)
    buggy = Program(threshold, skip=which % legal.needed)
    buggy.run(actions)
    reuse = [v for v in buggy.m.violations if v.kind == "unordered reuse"]
    assert reuse, f"skipped needed step {buggy.skip} of {legal.needed} went unnoticed"
    assert {v.kind for v in buggy.m.violations} == {"unordered reuse"}


def test_random_program_machinery_reaches_cross_stream_reuse_and_needed_steps():
    """The generator's building blocks do reach the interesting cases (against a vacuous
    property): a reuse through an event dependency, and a needed ordering step."""
    program = Program(0)
    program.run([("alloc", 0, 2), ("use", 0, 1), ("free", 0, 2), ("wait", 0, 2), ("alloc", 0, 2), ("use", 0, 1)])
    program.m.assert_no_violations()
    stats = program.m.stats()
    assert stats["reuse_cross_stream_pending"] == 1 and program.needed >= 1, (stats, program.needed)


def test_a_thread_without_a_context_is_refused_until_it_pushes_one(m):
    # The model's current context: a thread that left it gets CUDA_ERROR_INVALID_CONTEXT from
    # every call but the context stack's, and changes nothing; pushing the context restores it.
    from concurrent.futures import ThreadPoolExecutor

    from cuda_model import CONTEXT

    def in_bare_thread():
        m.leave_context()
        seen = [m.cuCtxGetCurrent(), m.cuEventCreate(0), m.cuMemFreeAsync(cu.CUdeviceptr(0x10), 0)]
        assert m.cuCtxPushCurrent(CONTEXT) == (cu.CUresult.CUDA_SUCCESS,)
        err, event = m.cuEventCreate(0)
        popped = m.cuCtxPopCurrent()
        return seen, err, popped, m.cuEventCreate(0)

    with ThreadPoolExecutor(1) as pool:
        (current, refused, free), err, popped, again = pool.submit(in_bare_thread).result()
    assert current[0] == cu.CUresult.CUDA_SUCCESS and int(current[1]) == 0
    assert refused == (cu.CUresult.CUDA_ERROR_INVALID_CONTEXT, None)
    assert free == (cu.CUresult.CUDA_ERROR_INVALID_CONTEXT,)
    assert err == cu.CUresult.CUDA_SUCCESS and int(popped[1]) == int(CONTEXT)
    assert again == (cu.CUresult.CUDA_ERROR_INVALID_CONTEXT, None)
    assert int(m.cuCtxGetCurrent()[1]) == int(CONTEXT)  # other threads keep theirs
    assert m.stats()["no_context"] == 3 and m.violations == []


# --------------------------------------------------------------------------- stream capture

MODE = cu.CUstreamCaptureMode
STATUS = cu.CUstreamCaptureStatus
AUTO_FREE = cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH


def exportable_pool(m: CudaModel):
    props = m.CUmemPoolProps()
    props.allocType = m.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = m.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.handleTypes = m.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return ok(m.cuMemPoolCreate(props))


def invalidations(m: CudaModel) -> list:
    return [v for v in m.violations if v.kind == "capture invalidated"]


def in_thread(fn, *args):
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)))
    t.start()
    t.join()
    return out[0]


def test_capture_status_and_unique_ids(m):
    s, t = new_stream(m), new_stream(m, blocking=False)
    assert ok(m.cuStreamIsCapturing(s)) == STATUS.CU_STREAM_CAPTURE_STATUS_NONE
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ok(m.cuStreamBeginCapture(t, MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    assert ok(m.cuStreamIsCapturing(s)) == STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE
    info_s, info_t = m.cuStreamGetCaptureInfo(s), m.cuStreamGetCaptureInfo(t)
    assert info_s[0] == R.CUDA_SUCCESS and info_s[1] == STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE
    assert int(info_s[2]) and int(info_s[2]) != int(info_t[2])
    ok(m.cuStreamEndCapture(s))
    ok(m.cuStreamEndCapture(t))
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    assert int(m.cuStreamGetCaptureInfo(s)[2]) not in (int(info_s[2]), int(info_t[2]))  # never reused
    assert ok(m.cuStreamEndCapture(s)) is not None and m.violations == []


def test_the_legacy_stream_cannot_be_captured(m):
    assert m.cuStreamBeginCapture(LEGACY, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL)[0] == R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED


def test_captured_allocation_from_an_exportable_pool_is_not_supported_and_the_capture_survives(m):
    s = new_stream(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    assert m.cuMemAllocFromPoolAsync(1024, exportable_pool(m), s)[0] == R.CUDA_ERROR_NOT_SUPPORTED
    assert ok(m.cuStreamIsCapturing(s)) == STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE
    ok(m.cuStreamEndCapture(s))
    assert m.violations == []


def test_captured_allocation_is_graph_memory_allocated_at_each_launch_at_the_same_address(m):
    s = new_stream(m)
    pool = default_pool(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    a = alloc(m, 1024, s, pool)
    assert use(m, s, a, 1024, "a") is None  # a kernel node: nothing runs
    free(m, a, s)  # a free node
    graph = ok(m.cuStreamEndCapture(s))
    assert attr(m, pool, ATTR.CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0  # not the pool's memory
    assert m.stats()["live_allocations"] == 0
    other = alloc(m, 1024, s, pool)
    assert not (other <= a < other + 1024)
    exe = ok(m.cuGraphInstantiate(graph, 0))
    for _ in range(3):
        ok(m.cuGraphLaunch(exe, s))
    assert m.violations == [] and m.stats()["launches"] == 0 and m.graph_memory_live() == 0


def test_graph_allocations_left_live_are_freed_outside_and_block_a_relaunch(m):
    s, t = new_stream(m), new_stream(m, blocking=False)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    a = alloc(m, 512, s)
    use(m, s, a, 512, "a")
    graph = ok(m.cuStreamEndCapture(s))
    assert m.cuMemFreeAsync(m.CUdeviceptr(a), s)[0] == R.CUDA_ERROR_INVALID_VALUE  # never launched
    exe = ok(m.cuGraphInstantiate(graph, 0))
    ok(m.cuGraphLaunch(exe, s))
    assert m.graph_memory_live() == 512
    use(m, s, a, 512, "a")  # the program uses it after the launch, on the launch stream
    assert m.cuGraphLaunch(exe, s)[0] == R.CUDA_ERROR_INVALID_VALUE  # outstanding
    free(m, a, s)
    assert m.cuMemFreeAsync(m.CUdeviceptr(a), s)[0] == R.CUDA_ERROR_INVALID_VALUE  # freed already
    ok(m.cuGraphLaunch(exe, s))
    m.wait(t, s)
    free(m, a, t)
    assert m.violations == []


def test_auto_free_on_launch_frees_the_previous_launchs_allocations_first(m):
    s = new_stream(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    a = alloc(m, 512, s)
    use(m, s, a, 512, "a")
    exe = ok(m.cuGraphInstantiate(ok(m.cuStreamEndCapture(s)), AUTO_FREE))
    for _ in range(3):
        ok(m.cuGraphLaunch(exe, s))
    assert m.graph_memory_live() == 512 and m.violations == []
    assert m.stats()["frees"] == 0


def test_a_graph_with_memory_nodes_has_one_executable_at_a_time(m):
    s = new_stream(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    free(m, alloc(m, 512, s), s)
    graph = ok(m.cuStreamEndCapture(s))
    exe = ok(m.cuGraphInstantiate(graph, 0))
    assert m.cuGraphInstantiate(graph, 0)[0] == R.CUDA_ERROR_NOT_SUPPORTED
    ok(m.cuGraphExecDestroy(exe))
    ok(m.cuGraphInstantiate(graph, 0))


def test_caught_kernel_node_on_memory_handed_to_another_owner_since_the_capture(m):
    """A block carved from pool memory allocated before the capture (as an arena would), used
    by a kernel node, then given to another owner: the replay writes the new owner's memory,
    even in stream order."""
    s = new_stream(m)
    slab = alloc(m, 4096, s)
    use(m, s, slab, 256, "old")
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    use(m, s, slab, 256, "carved")
    exe = ok(m.cuGraphInstantiate(ok(m.cuStreamEndCapture(s)), 0))
    ok(m.cuGraphLaunch(exe, s))
    assert m.violations[0].kind == "graph kernel on memory of another owner"
    assert m.violations[0].prev_owner == "old" and m.violations[0].new_owner == "carved"


def test_captured_free_of_memory_not_allocated_in_the_capture_is_caught(m):
    s = new_stream(m)
    a = alloc(m, 512, s)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    assert m.cuMemFreeAsync(m.CUdeviceptr(a), s)[0] == R.CUDA_ERROR_INVALID_VALUE
    assert m.violations[0].kind == "free in a capture of memory not allocated in it"


def test_capture_event_record_is_allowed_and_waits_inside_the_capture_too(m):
    s = new_stream(m)
    ev = ok(m.cuEventCreate(0))
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ok(m.cuEventRecord(ev, s))
    ok(m.cuStreamWaitEvent(s, ev, 0))
    ok(m.cuStreamEndCapture(s))
    assert m.violations == []


def test_waiting_on_an_event_recorded_outside_the_capture_invalidates_it(m):
    s, t = new_stream(m), new_stream(m, blocking=False)
    ev = ok(m.cuEventCreate(0))
    ok(m.cuEventRecord(ev, t))
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    assert m.cuStreamWaitEvent(s, ev, 0)[0] == R.CUDA_ERROR_STREAM_CAPTURE_ISOLATION
    assert ok(m.cuStreamIsCapturing(s)) == STATUS.CU_STREAM_CAPTURE_STATUS_INVALIDATED
    assert m.cuStreamEndCapture(s)[0] == R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    assert "cuStreamWaitEvent" in invalidations(m)[0].detail


def test_stream_get_id_of_the_capturing_stream_invalidates_it_others_are_fine(m):
    s, t = new_stream(m), new_stream(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    ok(m.cuStreamGetId(t))
    assert m.violations == []
    assert m.cuStreamGetId(s)[0] == R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert len(invalidations(m)) == 1


@pytest.mark.parametrize("mode", ["GLOBAL", "THREAD_LOCAL", "RELAXED"])
@pytest.mark.parametrize("op", ["alloc", "free", "record", "wait"])
def test_the_legacy_stream_beside_a_blocking_capture_is_refused_and_invalidates_it(m, mode, op):
    s = new_stream(m)
    a = alloc(m, 512, LEGACY)
    ev = ok(m.cuEventCreate(0))
    ok(m.cuStreamBeginCapture(s, getattr(MODE, f"CU_STREAM_CAPTURE_MODE_{mode}")))
    assert m.cuStreamIsCapturing(LEGACY)[0] == R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    assert m.violations == []  # the query invalidates nothing

    def run():
        if op == "alloc":
            return m.cuMemAllocFromPoolAsync(512, default_pool(m), LEGACY)[0]
        if op == "free":
            return m.cuMemFreeAsync(m.CUdeviceptr(a), LEGACY)[0]
        if op == "record":
            return m.cuEventRecord(ev, LEGACY)[0]
        return m.cuStreamWaitEvent(LEGACY, ev, 0)[0]

    assert in_thread(run) == R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT  # from any thread
    assert len(invalidations(m)) == 1


def test_the_legacy_stream_beside_a_non_blocking_relaxed_capture_is_usable(m):
    s = new_stream(m, blocking=False)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    assert ok(m.cuStreamIsCapturing(LEGACY)) == STATUS.CU_STREAM_CAPTURE_STATUS_NONE
    a = alloc(m, 512, LEGACY)
    use(m, LEGACY, a, 512, "a")
    free(m, a, LEGACY)
    ok(m.cuStreamEndCapture(s))
    assert m.violations == []


@pytest.mark.parametrize("mode", ["GLOBAL", "THREAD_LOCAL", "RELAXED"])
def test_ctx_synchronize_invalidates_any_capture_from_any_thread(m, mode):
    s = new_stream(m, blocking=False)
    ok(m.cuStreamBeginCapture(s, getattr(MODE, f"CU_STREAM_CAPTURE_MODE_{mode}")))
    assert in_thread(lambda: m.cuCtxSynchronize()[0]) == R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert len(invalidations(m)) == 1


def test_pool_trim_invalidates_a_capture_unless_the_thread_is_relaxed(m):
    s = new_stream(m, blocking=False)
    pool = default_pool(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    previous = ok(m.cuThreadExchangeStreamCaptureMode(MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    ok(m.cuMemPoolTrimTo(pool, 0))
    m.cuThreadExchangeStreamCaptureMode(previous)
    assert m.violations == []
    assert m.cuMemPoolTrimTo(pool, 0)[0] == R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    assert len(invalidations(m)) == 1


UNSAFE = ["alloc", "free", "query", "event sync", "stream sync", "host alloc"]


def _unsafe_call(m: CudaModel, which: str, other, ptr: int, ev):
    if which == "alloc":
        return m.cuMemAllocFromPoolAsync(256, default_pool(m), other)[0]
    if which == "free":
        return m.cuMemFreeAsync(m.CUdeviceptr(ptr), other)[0]
    if which == "query":
        return m.cuEventQuery(ev)[0]
    if which == "event sync":
        return m.cuEventSynchronize(ev)[0]
    if which == "stream sync":
        return m.cuStreamSynchronize(other)[0]
    return m.cuMemHostAlloc(256, 0)[0]


@pytest.mark.parametrize("which", UNSAFE)
@pytest.mark.parametrize("mode, same_thread, refused", [
    ("GLOBAL", True, True), ("GLOBAL", False, True),
    ("THREAD_LOCAL", True, True), ("THREAD_LOCAL", False, False),
    ("RELAXED", True, False), ("RELAXED", False, False)])
def test_potentially_unsafe_calls_follow_the_threads_capture_mode(m, which, mode, same_thread, refused):
    s, other = new_stream(m, blocking=False), new_stream(m, blocking=False)
    ptr = alloc(m, 512, other)
    ev = ok(m.cuEventCreate(0))
    ok(m.cuEventRecord(ev, other))
    ok(m.cuStreamBeginCapture(s, getattr(MODE, f"CU_STREAM_CAPTURE_MODE_{mode}")))
    err = _unsafe_call(m, which, other, ptr, ev) if same_thread else in_thread(_unsafe_call, m, which, other, ptr, ev)
    assert (err == R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) == refused, err
    assert len(invalidations(m)) == int(refused)


@pytest.mark.parametrize("which", UNSAFE)
@pytest.mark.parametrize("same_thread", [True, False])
def test_a_relaxed_thread_may_make_potentially_unsafe_calls_beside_a_global_capture(m, which, same_thread):
    s, other = new_stream(m, blocking=False), new_stream(m, blocking=False)
    ptr = alloc(m, 512, other)
    ev = ok(m.cuEventCreate(0))
    ok(m.cuEventRecord(ev, other))
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))

    def relaxed():
        previous = ok(m.cuThreadExchangeStreamCaptureMode(MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
        try:
            return _unsafe_call(m, which, other, ptr, ev)
        finally:
            m.cuThreadExchangeStreamCaptureMode(previous)

    assert (relaxed() if same_thread else in_thread(relaxed)) in (R.CUDA_SUCCESS, R.CUDA_ERROR_NOT_READY)
    assert ok(m.cuStreamIsCapturing(s)) == STATUS.CU_STREAM_CAPTURE_STATUS_ACTIVE and m.violations == []


def test_a_thread_local_thread_is_not_refused_beside_another_threads_global_capture(m):
    s, other = new_stream(m, blocking=False), new_stream(m, blocking=False)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))

    def thread_local():
        ok(m.cuThreadExchangeStreamCaptureMode(MODE.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        return m.cuMemAllocFromPoolAsync(256, default_pool(m), other)[0]

    assert in_thread(thread_local) == R.CUDA_SUCCESS and m.violations == []


def test_always_allowed_beside_a_global_capture(m):
    s, other = new_stream(m), new_stream(m, blocking=False)
    ev = ok(m.cuEventCreate(0))
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ok(m.cuEventRecord(ev, other))
    ok(m.cuStreamWaitEvent(other, ev, 0))
    ok(m.cuStreamGetId(other))
    ok(m.cuMemGetInfo())
    ok(m.cuEventDestroy(ok(m.cuEventCreate(0))))
    ok(m.cuStreamDestroy(new_stream(m, blocking=False)))
    ok(m.cuStreamEndCapture(s))
    assert m.violations == []


def test_a_global_capture_is_ended_by_its_thread_a_relaxed_one_by_any(m):
    s, t = new_stream(m), new_stream(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ok(m.cuStreamBeginCapture(t, MODE.CU_STREAM_CAPTURE_MODE_RELAXED))
    assert in_thread(lambda: m.cuStreamEndCapture(s)[0]) == R.CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    assert in_thread(lambda: m.cuStreamEndCapture(t)[0]) == R.CUDA_SUCCESS
    ok(m.cuStreamEndCapture(s))


def test_graph_memory_attributes_and_trim(m):
    s = new_stream(m)
    ok(m.cuStreamBeginCapture(s, MODE.CU_STREAM_CAPTURE_MODE_GLOBAL))
    a = alloc(m, 1000, s)
    exe = ok(m.cuGraphInstantiate(ok(m.cuStreamEndCapture(s)), 0))
    ok(m.cuGraphLaunch(exe, s))
    GA = cu.CUgraphMem_attribute
    assert int(ok(m.cuDeviceGetGraphMemAttribute(m.CUdevice(0), GA.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT))) == 1024
    free(m, a, s)
    assert int(ok(m.cuDeviceGetGraphMemAttribute(m.CUdevice(0), GA.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT))) == 0
    assert int(ok(m.cuDeviceGetGraphMemAttribute(m.CUdevice(0), GA.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT))) == 1024
    ok(m.cuDeviceGraphMemTrim(m.CUdevice(0)))
    assert int(ok(m.cuDeviceGetGraphMemAttribute(m.CUdevice(0), GA.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT))) == 0
    assert int(ok(m.cuDeviceGetGraphMemAttribute(m.CUdevice(0), GA.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH))) == 1024
