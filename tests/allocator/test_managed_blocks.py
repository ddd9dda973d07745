"""Managed memory (``cuda.managed_array``, ``NUMBA_POOL_MANAGED``) run for real on the CUDA model:
the host rule, rule 9 of numba_pool/allocator ("a released block is handed out again only after
the host has observed every event of its release complete") holds for managed blocks, no block goes
back to the driver (``cuMemFree``, after which the next ``cuMemAllocManaged`` may return it at once)
before the host has seen its last use finish, and planted bugs that break it are caught.

The new owner of a managed block is the host: every allocation here is written by the host at
once (``Program.allocate_managed``), which the model checks against the previous owner's kernels.
"""

from __future__ import annotations

import gc
import weakref

import numba_pool
import pytest
from cuda.bindings import driver as real_cu

from cuda_model.harness import LEGACY, Program
from numba_pool.allocator.host_blocks import HostBlocks
from numba_pool.cuda.errors import CudaAPIError
from numba_pool.observe.summary import format_summary


@pytest.fixture
def prog(request, frontend_name):
    p = Program(arena=False, frontend=frontend_name, **getattr(request, "param", {}))
    yield p
    p.close()


def sync(prog: Program, stream: int) -> None:
    assert prog.model.cuStreamSynchronize(real_cu.CUstream(stream))[0] == 0


def kernel(prog: Program, family, stream: int) -> None:
    prog.launch(stream, [family])


def drop(prog: Program, family) -> int:
    address = family.address
    prog.drop(family, legalize="record")
    gc.collect()
    return address


def fence_at_every_allocation(prog: Program) -> None:
    """An allocation that finds a released block unfenced records its fence at once (not once
    32 wait): Note [A release records nothing on the legacy stream]."""
    prog.mm.managed.fences.fence_blocks = 1


# -- controls: legal programs, no violation, and the cache reuses ---------------------------


def test_a_managed_array_is_the_frontends_managed_memory_from_cu_mem_alloc_managed(prog):
    f = prog.allocate_managed(1000)
    pointer = f.refs[0]
    assert isinstance(pointer, prog.frontend.ManagedMemory) and pointer.size == 1000
    assert pointer._bufptr_ == pointer.device_pointer_value == f.address
    assert prog.model.cuPointerGetAttribute(real_cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                            f.address) == (real_cu.CUresult.CUDA_SUCCESS, True)
    assert prog.model.managed_stats()["allocs"] == 1  # Note [Managed blocks are not from a mempool]
    prog.check()


def test_not_reused_before_the_host_saw_the_kernel_complete(prog):
    fence_at_every_allocation(prog)
    a = prog.allocate_managed(4096)
    kernel(prog, a, LEGACY)
    address = drop(prog, a)
    b = prog.allocate_managed(4096)  # records a's fence; the kernel may still run: another block
    assert b.address != address
    sync(prog, LEGACY)
    c = prog.allocate_managed(4096)  # now the host knows: reused
    assert c.address == address
    prog.check()


def test_a_blocking_stream_kernel_is_covered_by_the_legacy_event(prog):
    fence_at_every_allocation(prog)
    s = prog.create_stream(blocking=True)
    a = prog.allocate_managed(4096)
    kernel(prog, a, s)
    address = drop(prog, a)
    assert prog.allocate_managed(100).address != address  # another size: records a's fence, after s's kernel
    sync(prog, LEGACY)
    assert prog.allocate_managed(4096).address == address
    prog.check()


def test_a_non_blocking_stream_needs_record_stream_or_the_scope(prog):
    fence_at_every_allocation(prog)
    s = prog.create_stream(blocking=False)
    a = prog.allocate_managed(4096)
    kernel(prog, a, s)
    address = drop(prog, a)  # legalize="record": record_stream(a, s)
    assert prog.allocate_managed(4096).address != address  # records a's fence: not complete yet
    sync(prog, LEGACY)
    assert prog.allocate_managed(4096).address != address  # s's event not complete yet
    sync(prog, s)
    assert prog.allocate_managed(4096).address == address
    # Allocated inside using_stream(s): its release waits for s with no record_stream.
    b = prog.allocate_managed(8192, stream=s)
    kernel(prog, b, s)
    address = b.address
    prog.drop(b, legalize="record")
    assert b.recorded == set()  # nothing recorded: s is the allocation stream
    gc.collect()
    assert prog.allocate_managed(8192).address != address  # records b's fence
    sync(prog, LEGACY)
    assert prog.allocate_managed(8192).address != address
    sync(prog, s)
    assert prog.allocate_managed(8192).address == address
    prog.check()


@pytest.mark.parametrize("using", [False, True], ids=["legacy", "using-stream"])
def test_released_in_a_thread_without_a_context(prog, using):
    # Note [A release records nothing on the legacy stream]: a block of the legacy stream is
    # released with no driver call at all, so none is refused for want of a context, and an
    # allocation fences it later in the owner's context.  A using_stream block's release
    # records an event on its stream: rule 10, it pushes the manager's context first (none
    # is refused) and records there.
    fence_at_every_allocation(prog)
    s = prog.create_stream(blocking=False) if using else LEGACY
    a = prog.allocate_managed(4096, stream=s if using else None)
    kernel(prog, a, s)
    before = prog.model.stats()
    address = a.address
    prog.drop(a, legalize="record", how="bare")
    after = prog.model.stats()
    assert after["no_context"] == before["no_context"]
    if using:
        assert after["context_pushes"] > before["context_pushes"]
    else:
        assert after["driver_calls"] == before["driver_calls"]
    assert prog.allocate_managed(4096).address != address  # records the fence: not complete yet
    sync(prog, s)
    sync(prog, LEGACY)
    assert prog.allocate_managed(4096).address == address
    prog.check()
    assert not prog.warnings, [str(w.message) for w in prog.warnings]


@pytest.mark.parametrize("using", [False, True], ids=["legacy", "using-stream"])
def test_held_back_by_defer_cleanup_until_the_block_exits(prog, using):
    # A release inside defer_cleanup: of a legacy-stream block (no driver call), or of a
    # using_stream block (its stream's event recorded at the drop, rule 8a); either way held
    # back, unfenced, until the scope exits; then the next allocation fences it and it is
    # reused once that fence (and its stream's event) completed.
    fence_at_every_allocation(prog)
    cache = prog.mm.managed
    s = prog.create_stream(blocking=False) if using else LEGACY
    a = prog.allocate_managed(4096, stream=s if using else None)
    kernel(prog, a, s)
    address = a.address
    with prog.mm.defer_cleanup():
        drop(prog, a)
        sync(prog, s)
        sync(prog, LEGACY)
        assert prog.allocate_managed(4096).address != address
        assert prog.mm.statistics().managed_in_use_bytes == 2 * 4096  # held back counts as in use
        assert address in [b.ptr for b in cache.held.values()] and cache.fences.recorded == 0
    assert [b.ptr for b in cache.released] == [address] and not cache.released[0].ref.fenced
    assert prog.allocate_managed(4096).address != address  # records its fence: not complete yet
    assert cache.fences.recorded == 1
    sync(prog, LEGACY)
    assert prog.allocate_managed(4096).address == address
    prog.check()


# -- options and figures ----------------------------------------------------------------


@pytest.mark.parametrize("prog", [{"managed_max_size": 8192}], indirect=True)
def test_the_cap_waits_for_cached_blocks_then_refuses_in_one_line(prog):
    a = prog.allocate_managed(4096)
    kernel(prog, a, LEGACY)
    drop(prog, a)
    b = prog.allocate_managed(8192)  # over the cap: waits for a's event, frees it, fits
    assert b is not None
    with pytest.raises(CudaAPIError) as caught:
        prog.mm.memallocmanaged(100, True)
    message = str(caught.value)
    assert "out of managed memory allocating 100 bytes (a block of 512 bytes)" in message and "\n" not in message
    assert "capped at 8192 bytes (NUMBA_POOL_MANAGED_MAX_SIZE)" in message and "8192 in use" in message
    drop(prog, b)
    assert prog.allocate_managed(100) is not None  # usable after the error
    prog.mm.managed.check_invariants()
    prog.check()


def test_trim_gives_cached_blocks_back_to_the_driver(prog):
    # The blocks are not fenced yet (fewer than fence_blocks wait): the trim synchronizes, and
    # they are idle.
    families = [prog.allocate_managed(1 << 16) for _ in range(3)]
    for f in families:
        kernel(prog, f, LEGACY)
        drop(prog, f)
    assert prog.model.managed_stats()["reserved"] == 3 << 16
    prog.mm.trim()
    assert prog.model.managed_stats() == {"live": 0, "reserved": 0, "allocs": 3, "frees": 3}
    s = prog.mm.statistics()
    assert (s.managed_reserved_bytes, s.managed_cached_bytes, s.managed_blocks) == (0, 0, 0)
    prog.check()


def test_statistics_summary_scopes_and_the_log(frontend_name, tmp_path):
    p = Program(arena=True, frontend=frontend_name, adaptors=True)
    try:
        with numba_pool.statistics() as scope:
            f = p.mm.memallocmanaged(1000, True)
            s = p.mm.statistics()
            assert scope.current_bytes == 1000 and scope.current_count == 1  # the counting adaptor
        assert (s.managed_on, s.managed_in_use_bytes, s.managed_blocks) == (True, 1024, 1)
        assert s.bytes_in_use == 0  # device memory's figures are device memory's
        assert "managed in use" in format_summary(s) and "| managed in use " in format_summary(s) and "1 KiB (1024 bytes)" in format_summary(s)
        address = f.device_pointer_value
        del f
        gc.collect()
        p.mm.log.flush()
        rows = [line.split(",") for line in open(p.mm.log.path).read().splitlines()[1:]]
        assert [(r[2], int(r[3], 16), r[4], r[6]) for r in rows if r[6] == "managed"] == [
            ("allocate", address, "1000", "managed"), ("free", address, "1000", "managed")]
        assert p.mm.path.layers == ("counting", "log", "arena")
    finally:
        p.close()


def test_prefetch_at_allocation_is_a_stream_ordered_prefetch(frontend_name):
    from numba_pool import config as pool_config
    p = Program(arena=False, frontend=frontend_name)
    try:
        mm = type(p.mm)(context=p.context, config=pool_config.load(environ={}, managed_prefetch=True))
        mm.initialize()
        before = p.model.stats()["prefetches"]
        pointer = mm.memallocmanaged(4096, True)
        assert p.model.stats()["prefetches"] == before + 1
        del pointer
    finally:
        p.close()


def test_a_device_without_concurrent_managed_access_keeps_numbas_path(frontend_name, monkeypatch):
    from cuda_model import CudaModel
    monkeypatch.setattr(CudaModel, "concurrent_managed_access", 0)
    p = Program(arena=False, frontend=frontend_name)
    try:
        assert p.mm.managed is None and p.mm.path.allocate_managed is None
        assert "no concurrent managed access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS is 0)" in \
            p.mm.managed_off_because
        assert not p.mm.statistics().managed_on
    finally:
        p.close()


def test_a_managed_array_outlives_a_reset(prog):
    keep = prog.allocate_managed(4096)
    kernel(prog, keep, LEGACY)
    prog.reset()
    assert not keep.zombie
    prog.host_access(keep)  # its memory is still there
    kernel(prog, keep, LEGACY)
    s = prog.mm.statistics()
    assert s.managed_in_use_bytes == 4096
    drop(prog, keep)
    prog.check()


# -- planted bugs are caught ---------------------------------------------------------------


def test_planted_reuse_without_the_hosts_observation_is_caught(prog, monkeypatch):
    monkeypatch.setattr(HostBlocks, "_completed", lambda self, block: True)
    a = prog.allocate_managed(4096)
    kernel(prog, a, LEGACY)
    drop(prog, a)
    prog.allocate_managed(4096)  # the host writes it while a's kernel may run
    assert any(v.kind == "unordered reuse of managed memory" for v in prog.model.violations), prog.model.violations


def test_planted_release_that_forgets_the_allocation_stream_is_caught(prog, monkeypatch):
    s = prog.create_stream(blocking=False)
    allocate = HostBlocks.allocate_block

    def legacy_only(self, size, stream=numba_pool.cuda.streams.LEGACY, flags=0):
        block = allocate(self, size, stream, flags)
        block.stream = numba_pool.cuda.streams.LEGACY  # the bug: its release forgets the allocation stream
        return block

    monkeypatch.setattr(HostBlocks, "allocate_block", legacy_only)
    fence_at_every_allocation(prog)
    a = prog.allocate_managed(4096, stream=s)
    kernel(prog, a, s)
    address = drop(prog, a)
    assert prog.allocate_managed(4096).address != address  # records the fence, its only event now
    sync(prog, LEGACY)
    assert prog.allocate_managed(4096).address == address
    assert any(v.kind == "unordered reuse of managed memory" for v in prog.model.violations), prog.model.violations


def test_the_model_refuses_what_the_driver_refuses():
    from cuda_model import CudaModel
    model = CudaModel()
    props = real_cu.CUmemPoolProps()
    props.allocType = real_cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED
    props.maxSize = 1 << 20
    assert model.cuMemPoolCreate(props)[0] == real_cu.CUresult.CUDA_ERROR_INVALID_VALUE  # no cap on managed pools
    props.maxSize = 0
    err, pool = model.cuMemPoolCreate(props)
    assert err == 0
    err, device = model.cuMemAllocFromPoolAsync(4096, pool, 0)
    other = real_cu.CUmemPoolProps()
    other.allocType = real_cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    _, plain = model.cuMemPoolCreate(other)
    _, not_managed = model.cuMemAllocFromPoolAsync(4096, plain, 0)
    model.host_use(int(not_managed), 256, "a")
    assert [v.kind for v in model.violations] == ["host use of device memory"]
    location = real_cu.CUmemLocation()
    location.type = real_cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    assert model.cuMemPrefetchAsync(device, 4096, location, 0, 0) == (real_cu.CUresult.CUDA_SUCCESS,)
    assert model.cuMemPrefetchAsync(not_managed, 4096, location, 0, 0)[0] == real_cu.CUresult.CUDA_ERROR_INVALID_VALUE
    invalid = real_cu.CUresult.CUDA_ERROR_INVALID_VALUE
    assert model.cuMemAllocManaged(0, 1)[0] == invalid and model.cuMemAllocManaged(4096, 4)[0] == invalid
    err, managed = model.cuMemAllocManaged(4096, 1)
    assert err == 0 and model.cuMemPrefetchAsync(managed, 4096, location, 0, 0)[0] == 0
    model.violations.clear()
    assert model.cuMemFree(not_managed)[0] == invalid  # cuMemFree frees cuMemAllocManaged memory only, here
    assert model.cuMemFree(managed)[0] == 0 and model.cuMemFree(managed)[0] == invalid
    assert [v.kind for v in model.violations] == ["free of unknown pointer / double free"] * 2


# -- the paths where a block goes back to the driver (whose next cuMemAllocManaged may return it at once) ---


@pytest.mark.parametrize("prog", [{"managed_release_threshold": 0}], indirect=True)
def test_over_the_release_threshold_only_complete_blocks_go_back_to_the_pool(prog):
    fence_at_every_allocation(prog)
    a = prog.allocate_managed(4096)
    kernel(prog, a, LEGACY)
    address = drop(prog, a)
    b = prog.allocate_managed(8192)  # the threshold frees complete cached blocks: a's is not fenced yet
    assert prog.mm.managed.fences.recorded == 1  # this allocation fenced it, after the threshold's pass
    assert b.address != address and prog.mm.statistics().managed_cached_bytes == 4096
    sync(prog, LEGACY)
    c = prog.allocate_managed(8192)  # a's block is complete now: back to the driver
    assert prog.mm.statistics().managed_cached_bytes == 0 and c is not None
    prog.check()


@pytest.mark.parametrize("prog", [{"managed_max_size": 8192}], indirect=True)
def test_over_the_cap_a_block_waits_for_its_events_before_the_pool_gets_it(prog):
    a = prog.allocate_managed(8192)
    kernel(prog, a, LEGACY)
    address = drop(prog, a)
    b = prog.allocate_managed(8192)  # over the cap: waits for a's kernel, frees it; the driver hands it out again
    assert b.address == address
    prog.check()


@pytest.mark.parametrize("prog", [{"managed_release_threshold": 0}], indirect=True)
def test_planted_threshold_free_without_the_hosts_observation_is_caught(prog, monkeypatch):
    def free_every_cached(self, keep):  # the bug: no _completed check before giving blocks back
        freed = 0
        for block in self._cached_oldest_first():
            if self.cached <= keep:
                break
            freed += block.size
            self._free_cached(block)
        return freed

    monkeypatch.setattr(HostBlocks, "_free_completed", free_every_cached)
    a = prog.allocate_managed(4096)
    kernel(prog, a, LEGACY)
    drop(prog, a)
    prog.allocate_managed(4096)  # the driver hands a's block out while its kernel may run
    prog.allocate_managed(4096)
    assert any(v.kind == "unordered reuse of managed memory" for v in prog.model.violations), prog.model.violations


@pytest.mark.parametrize("prog", [{"managed_max_size": 8192}], indirect=True)
def test_planted_cap_free_without_waiting_is_caught(prog, monkeypatch):
    def free_oldest_without_waiting(self, down_to):  # the bug: no cuEventSynchronize first
        for block in self._cached_oldest_first():
            if self.reserved <= down_to:
                return
            self._free_cached(block)

    monkeypatch.setattr(HostBlocks, "_free_oldest", free_oldest_without_waiting)
    a = prog.allocate_managed(8192)
    kernel(prog, a, LEGACY)
    drop(prog, a)
    prog.allocate_managed(8192)
    assert any(v.kind == "unordered reuse of managed memory" for v in prog.model.violations), prog.model.violations


def test_a_cached_block_keeps_no_stream_alive(prog):
    import weakref
    s = prog.create_stream(blocking=False)
    a = prog.allocate_managed(4096, stream=s)
    owner = weakref.ref(prog.stream_objects[s])
    kernel(prog, a, s)
    drop(prog, a)
    sync(prog, s)
    assert prog.destroy_stream(s)
    gc.collect()
    assert owner() is None  # the released block's StreamRef let the stream's object go


def test_a_driver_without_managed_pools_still_serves_managed_arrays(frontend_name, monkeypatch):
    # Note [Managed blocks are not from a mempool]: the cache needs cuMemAllocManaged alone.
    from cuda_model import CudaModel
    real = CudaModel.cuMemPoolCreate

    def refuse_managed(self, props):
        if props.allocType == real_cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED:
            return real_cu.CUresult.CUDA_ERROR_NOT_SUPPORTED, None
        return real(self, props)

    monkeypatch.setattr(CudaModel, "cuMemPoolCreate", refuse_managed)
    p = Program(arena=False, frontend=frontend_name)
    try:
        assert p.mm.managed is not None and p.mm.managed_off_because == ""
        f = p.allocate_managed(4096)
        assert f is not None and p.allocate(4096) is not None
        assert p.model.managed_stats()["live"] == 1
        p.check()
    finally:
        p.close()


def test_a_reset_with_no_current_context_frees_the_cached_blocks(prog):
    a = prog.allocate_managed(4096)
    drop(prog, a)
    prog.bare.submit(prog.mm.reset).result()  # cuda.close() resets with no context current
    assert prog.mm.statistics().managed_cached_bytes == 0
    assert prog.model.managed_stats()["live"] == 0  # the driver got the block back: nothing leaked


@pytest.mark.parametrize("blocking", [False, True], ids=["non-blocking", "blocking"])
def test_a_managed_array_allocated_in_a_scratch_scope_keeps_no_scratch_block(prog, blocking):
    """The managed door takes the scope's own stream, not its scratch-carrying copy: the scratch block object goes
    once its scope exits and its carved arrays are gone, the managed array alive (as the EMM doors: Note [Released
    beside a capture]'s scratch-scope fix)."""
    s = prog.create_stream(blocking=blocking)

    def body():
        with prog.using_stream(s), numba_pool.scratch(4096, manager=prog.mm) as block:
            carved = prog.mm.memalloc(100)
            managed = prog.mm.memallocmanaged(1000, True)
        return weakref.ref(block), carved, managed

    scratch_block, carved, managed = prog.run(0, body)
    prog.model.host_use(managed.device_pointer_value, 1000, -1)
    del carved
    gc.collect()
    assert scratch_block() is None, "the managed array's record keeps the scratch block"
    assert not prog.mm.allocator.scratch_blocks
    managed.free()
    sync(prog, s)
