"""The pinned host cache (numba_pool/allocator/host_blocks.py) run for real on the CUDA model: the
host rule, rule 9 of numba_pool/allocator ("a freed host block is handed out again only after the
host has observed every event of its last release complete") holds, and planted bugs that break
it are caught.

The new owner of a pinned block is the host: each test writes a freshly allocated block at once
(``model.host_use``), which the model checks against the previous owner's async copies."""

from __future__ import annotations

import gc
import itertools

import pytest
from cuda.bindings import driver as real_cu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from cuda_model import CudaModel
from cuda_model.harness import LEGACY, Program
from numba_pool.allocator.host_blocks import DEVICEMAP, HostBlocks
from numba_pool.cuda.errors import CudaAPIError
from numba_pool.cuda.streams import LEGACY as LEGACY_REF
from numba_pool.cuda.streams import StreamRef
from numba_pool.observe.summary import format_summary

_owners = itertools.count(1)


class Pinned:
    """One pinned (or mapped) buffer from the manager, with its model owner."""

    def __init__(self, prog: Program, size: int, mapped: bool = False, write: bool = True):
        self.prog, self.size = prog, size
        self.mem = prog.mm.memhostalloc(size, mapped=mapped)
        self.address = self.mem.host_pointer
        self.owner = f"pinned#{next(_owners)}"
        if write:  # the new owner is the host: it writes the buffer at once
            prog.model.host_use(self.address, size, self.owner)

    def copy(self, stream: int) -> None:
        """``to_device``/``copy_to_host`` through this buffer on ``stream``."""
        self.prog.model.copy_async(stream, self.address, self.size, self.owner)

    def record(self, stream: int) -> None:
        self.prog.mm.record_stream(self.mem, stream)

    def drop(self) -> None:
        self.mem = None
        gc.collect()


@pytest.fixture
def prog(request, frontend_name):
    """A manager with the host cache on, on each frontend's classes in turn."""
    p = Program(arena=False, host=True, frontend=frontend_name, **getattr(request, "param", {}))
    yield p
    p.close()


def sync(prog: Program, stream: int) -> None:
    assert prog.model.cuStreamSynchronize(real_cu.CUstream(stream))[0] == 0


def fence_at_every_allocation(prog: Program) -> None:
    """An allocation that finds a released block unfenced records its fence at once (not once
    32 wait): Note [A release records nothing on the legacy stream]."""
    prog.mm.host.fences.fence_blocks = 1


# -- controls: legal programs, no violation, and the cache does reuse --------------------


def test_objects_are_the_frontends(prog):
    PinnedMemory, MappedMemory = prog.frontend.PinnedMemory, prog.frontend.driver.MappedMemory
    a = Pinned(prog, 1000)
    assert isinstance(a.mem, PinnedMemory) and a.mem.size == 1000
    m = Pinned(prog, 1000, mapped=True)
    assert isinstance(m.mem._mem, MappedMemory) if hasattr(m.mem, "_mem") else isinstance(m.mem, MappedMemory)
    assert m.mem.device_pointer_value == m.address  # unified addressing in the model
    assert m.address in prog.mm.allocations
    m.drop()
    assert m.address not in prog.mm.allocations
    prog.check()


def test_not_reused_before_the_host_saw_the_copy_complete(prog):
    fence_at_every_allocation(prog)
    a = Pinned(prog, 4096)
    a.copy(LEGACY)
    address = a.address
    a.drop()
    b = Pinned(prog, 4096)  # records a's fence; the copy may still run: a new block
    assert b.address != address
    sync(prog, LEGACY)
    c = Pinned(prog, 4096)  # now the host knows: reused
    assert c.address == address
    prog.check()


def test_blocking_stream_copy_is_covered_by_the_legacy_event(prog):
    s = prog.create_stream(blocking=True)
    a = Pinned(prog, 4096)
    a.copy(s)
    address = a.address
    a.drop()
    fence_at_every_allocation(prog)
    other = Pinned(prog, 100)  # another bin: records a's fence, which follows s's copy
    assert other.address != address
    sync(prog, LEGACY)
    b = Pinned(prog, 4096)
    assert b.address == address
    prog.check()


def test_non_blocking_stream_needs_record_stream(prog):
    fence_at_every_allocation(prog)
    s = prog.create_stream(blocking=False)
    a = Pinned(prog, 4096)
    a.copy(s)
    a.record(s)
    address = a.address
    a.drop()
    assert Pinned(prog, 4096).address != address  # records a's fence; not complete yet
    sync(prog, LEGACY)
    b = Pinned(prog, 4096)
    assert b.address != address  # the fence completed, s's event not yet
    sync(prog, s)
    c = Pinned(prog, 4096)
    assert c.address == address
    prog.check()


def assert_reused_once_synchronized(prog, stream: int, address: int) -> None:
    """The next 4 KiB allocation records the fence of the released block at ``address`` and
    takes another (the fence has not completed); after ``stream`` and the legacy stream are
    synchronized, the next is that block; the model saw no violation and numba_pool warned of
    nothing."""
    fence_at_every_allocation(prog)
    assert Pinned(prog, 4096).address != address
    sync(prog, stream)
    sync(prog, LEGACY)
    assert Pinned(prog, 4096).address == address
    prog.check()
    assert not prog.warnings, [str(w.message) for w in prog.warnings]


def test_released_in_a_thread_without_a_context(prog):
    # Rule 10: the release finds no context current, pushes the manager's before any other
    # driver call (none is refused), records its event, and the block is cached, not lost.
    s = prog.create_stream(blocking=False)
    a = Pinned(prog, 4096)
    a.copy(s)
    a.record(s)
    before = prog.model.stats()
    address = a.address
    holder, a.mem = [a.mem], None
    prog.bare.submit(holder.clear).result()
    after = prog.model.stats()
    assert after["context_pushes"] > before["context_pushes"] and after["no_context"] == before["no_context"]
    assert_reused_once_synchronized(prog, s, address)


@pytest.mark.parametrize("thread", ["foreign", "bare"])
def test_a_legacy_release_in_another_thread_makes_no_driver_call(prog, thread):
    # Note [A release records nothing on the legacy stream]: a block allocated outside
    # using_stream, with no record_stream, is released with no driver call at all (none asks
    # which context is current, none pushes the owner's, nothing on any legacy stream), even
    # in a thread where another context is current (whose legacy stream orders nothing of the
    # owner's) or none is.  It is reused only after an allocation, in the owner's context,
    # recorded its fence after the blocking stream's copy, and once the host saw that complete:
    # the foreign context's synchronize does not make it look complete.
    s = prog.create_stream(blocking=True)
    a = Pinned(prog, 4096)
    a.copy(s)
    address = a.address
    holder, a.mem = [a.mem], None
    before = prog.model.stats()
    getattr(prog, thread).submit(holder.clear).result()
    after = prog.model.stats()
    assert after["driver_calls"] == before["driver_calls"]
    assert after["legacy_ops_elsewhere"] == before["legacy_ops_elsewhere"]
    host = prog.mm.host
    assert [b.ptr for b in host.released] == [address] and not host.released[0].ref.fenced
    if thread == "foreign":
        prog.foreign.submit(prog.model.cuCtxSynchronize).result()
    fence_at_every_allocation(prog)
    b = Pinned(prog, 4096)  # records the fence (in the owner's context); the copy may still run
    assert b.address != address and host.fences.recorded == 1
    if thread == "foreign":
        prog.foreign.submit(prog.model.cuCtxSynchronize).result()
    assert Pinned(prog, 4096).address != address  # fenced, not yet seen complete
    sync(prog, LEGACY)  # the fence follows s's copy: s need not be synchronized
    assert Pinned(prog, 4096).address == address
    prog.check()
    assert not prog.warnings, [str(w.message) for w in prog.warnings]


def test_bins_keep_mapped_and_pinned_apart(prog):
    fence_at_every_allocation(prog)
    m = Pinned(prog, 4096, mapped=True)
    m.copy(LEGACY)  # a kernel reading the mapped memory
    address = m.address
    m.drop()
    fencing = Pinned(prog, 100)  # another size: records m's fence
    prog.model.cuCtxSynchronize()
    p = Pinned(prog, 4096)  # m's block is complete, but mapped: not this bin
    assert p.address != address and fencing.address != address
    m2 = Pinned(prog, 3000, mapped=True)  # 4096-byte block: same bin
    assert m2.address == address
    prog.check()


def test_defer_cleanup_holds_host_releases_back(prog):
    a = Pinned(prog, 4096)
    address = a.address
    with prog.mm.defer_cleanup():
        a.drop()
        prog.model.cuCtxSynchronize()
        assert Pinned(prog, 4096).address != address
        assert prog.mm.statistics().host_cached_bytes == 0
    assert prog.mm.statistics().host_cached_bytes == 2 * 4096  # both released at the exit
    prog.check()


def test_stats_trim_and_summary(prog):
    a, b = Pinned(prog, 100), Pinned(prog, 5000)
    s = prog.mm.statistics()
    assert (s.host_on, s.host_reserved_bytes, s.host_in_use_bytes, s.host_cached_bytes, s.host_blocks) == \
        (True, 512 + 8192, 512 + 8192, 0, 2)
    b.copy(LEGACY)
    b.drop()
    s = prog.mm.statistics()
    assert (s.host_in_use_bytes, s.host_cached_bytes, s.host_blocks) == (512, 8192, 2)
    assert "host pinned cached" in format_summary(s)
    prog.mm.trim()  # b is not fenced yet: the trim synchronizes, b's block is idle, freed
    s = prog.mm.statistics()
    assert (s.host_reserved_bytes, s.host_cached_bytes, s.host_blocks) == (512, 0, 1)
    assert prog.model.host_stats()["live"] == 1
    del a
    prog.check()


@pytest.mark.parametrize("prog", [{"host_release_threshold": 0}], indirect=True)
def test_release_threshold_frees_completed_blocks(prog):
    fence_at_every_allocation(prog)
    a = Pinned(prog, 4096)
    a.copy(LEGACY)
    a.drop()
    b = Pinned(prog, 100)  # records a's fence, not complete: kept
    assert prog.mm.statistics().host_cached_bytes == 4096
    sync(prog, LEGACY)
    c = Pinned(prog, 100)
    assert (b.address != c.address) and prog.mm.statistics().host_cached_bytes == 0
    assert prog.model.host_stats()["frees"] == 1
    prog.check()


@pytest.mark.parametrize("prog", [{"host_max_size": 8192}], indirect=True)
def test_cap_waits_for_cached_blocks_then_raises_and_stays_usable(prog):
    a, b = Pinned(prog, 4096), Pinned(prog, 4096)
    with pytest.raises(CudaAPIError) as err:
        prog.mm.memhostalloc(100)
    text = str(err.value)
    assert err.value.code == real_cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    assert "out of pinned host memory allocating 100 bytes (a block of 512 bytes" in text
    assert "capped at 8192 bytes (NUMBA_POOL_HOST_MAX_SIZE) reserves 8192 bytes, 8192 in use, 0 cached" in text
    a.copy(LEGACY)
    a.drop()  # cached, its copy pending: the next allocation waits for it (cuEventSynchronize)
    c = Pinned(prog, 2000)
    s = prog.mm.statistics()
    assert (s.host_reserved_bytes, s.host_in_use_bytes, s.host_cached_bytes) == (4096 + 2048, 4096 + 2048, 0)
    del b, c
    prog.check()


@pytest.mark.parametrize("prog", [{"host_total": 8192}], indirect=True)
def test_host_out_of_memory(prog):
    a = Pinned(prog, 8192)
    with pytest.raises(CudaAPIError, match="refused by the host \\(cuMemHostAlloc\\)"):
        prog.mm.memhostalloc(1)
    a.drop()
    Pinned(prog, 1)  # after freeing the cached block (no work pending): fits
    prog.check()


def test_reset_frees_cache_and_orphans_live_blocks(prog):
    a, b = Pinned(prog, 4096), Pinned(prog, 4096)
    a.drop()
    prog.mm.reset()
    assert prog.model.host_stats()["live"] == 1  # b still owned by its array
    b.drop()  # its release frees it (cuMemFreeHost), as Numba would
    assert prog.model.host_stats()["live"] == 0
    Pinned(prog, 4096)  # usable after reset
    prog.check()


def test_off_by_default_keeps_numbas_path():
    p = Program(arena=False)
    try:
        assert p.mm.host is None and not p.mm.statistics().host_on
    finally:
        p.close()


# -- planted bugs: the model must catch each ------------------------------------------------


def _violation_text(prog) -> str:
    return "\n".join(map(str, prog.model.violations))


def test_planted_reuse_without_waiting_is_caught(prog, monkeypatch):
    monkeypatch.setattr(HostBlocks, "_completed", lambda self, block: True)
    a = Pinned(prog, 4096)
    a.copy(LEGACY)
    a.drop()
    b = Pinned(prog, 4096)  # reused while a's copy may run, and written by the host
    text = _violation_text(prog)
    assert "unordered reuse of host memory" in text, text
    assert a.owner in text and b.owner in text and "the host (CPU)" in text
    with pytest.raises(AssertionError):
        prog.check()
    prog.model.violations.clear()


def test_planted_legacy_event_only_is_caught(prog, monkeypatch):
    record_release = HostBlocks._record_release

    def legacy_only(self, block, streams, retry):
        streams = [s for s in streams if s is block.stream]  # the bug: record_stream's streams forgotten
        record_release(self, block, streams, retry)

    monkeypatch.setattr(HostBlocks, "_record_release", legacy_only)
    fence_at_every_allocation(prog)
    s = prog.create_stream(blocking=False)
    a = Pinned(prog, 4096)
    a.copy(s)
    a.record(s)
    a.drop()
    fencing = Pinned(prog, 4096)  # records the fence, the block's only event now
    sync(prog, LEGACY)
    assert Pinned(prog, 4096).address == a.address and fencing.address != a.address
    text = _violation_text(prog)
    assert "unordered reuse of host memory" in text and "stream 0x" in text, text
    prog.model.violations.clear()


def test_model_catches_a_host_write_before_completion():
    """The model itself: a host write after an unobserved copy by another owner is reported."""
    model = CudaModel()
    _, base = model.cuMemHostAlloc(4096, 0)
    model.copy_async(0, base, 4096, "old")
    model.host_use(base, 4096, "new")
    assert [v.kind for v in model.violations] == ["unordered reuse of host memory"]
    model2 = CudaModel()
    _, base = model2.cuMemHostAlloc(4096, 0)
    model2.copy_async(0, base, 4096, "old")
    model2.cuStreamSynchronize(0)
    model2.host_use(base, 4096, "new")
    model2.assert_no_violations()


# -- HostBlocks' invariants on the model (hypothesis) ----------------------------------------

_SIZES = st.sampled_from([1, 512, 4000, 4096, 70000])
# Allocations and frees weighted up, so that most examples reuse blocks (a planted reuse bug
# fails this test within its examples).
_ACTIONS = st.lists(st.tuples(st.sampled_from(["alloc"] * 4 + ["free"] * 3 + ["copy", "record", "sync_stream",
                                                                              "sync_ctx", "trim"]),
                              st.integers(0, 7), _SIZES, st.booleans()),
                    min_size=8, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=_ACTIONS, cap=st.sampled_from([None, 1 << 16, 1 << 18]),
       threshold=st.sampled_from([None, 0, 8192]))
def test_host_blocks_invariants(actions, cap, threshold):
    model = CudaModel(host_total=1 << 20)
    blocks = HostBlocks(model, max_size=cap, release_threshold=threshold)
    streams = [LEGACY_REF] + [StreamRef(model.cuStreamCreate(f)[1]) for f in (0, 1)]  # blocking, non-blocking
    live: dict[int, tuple] = {}  # host address -> (block, owner)
    owners = itertools.count(1)
    for action, k, size, mapped in actions:
        stream = streams[k % len(streams)]
        if action == "alloc":
            try:
                handed = blocks.allocate_block(size, flags=DEVICEMAP if mapped else 0)
            except CudaAPIError as err:
                assert "out of pinned host memory" in str(err)
                continue
            block = handed.ref
            assert block.host not in live, "a block handed out twice"
            assert block.size >= size and (block.device is not None) == mapped
            owner = next(owners)
            live[block.host] = (block, owner, {stream}, handed)
            model.host_use(block.host, size, owner)  # the host writes it at once,
            model.copy_async(stream.handle, block.host, size, owner)  # then stages it to the device
        elif live:
            block, owner, used, handed = list(live.values())[k % len(live)]
            if action == "copy":
                model.copy_async(stream.handle, block.host, block.size, owner)
                used.add(stream)
            elif action == "record":
                assert blocks.record_stream(block.host + 1, stream)
            elif action == "free":
                # legal as the README asks: each non-blocking stream that copied was recorded
                del live[block.host]
                if streams[2] in used:
                    blocks.record_stream(block.host, streams[2])
                handed.release(handed)
        if action == "sync_stream":
            model.cuStreamSynchronize(stream.handle)
        elif action == "sync_ctx":
            model.cuCtxSynchronize()
        elif action == "trim":
            blocks.trim()
        blocks.check_invariants()
        model.assert_no_violations()
    assert blocks.reserved <= (cap or blocks.reserved)
    assert model.host_stats()["reserved"] == blocks.reserved
