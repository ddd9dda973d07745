"""The fuzzer can fail: with one rule of the stream rule broken on purpose (rule 9 among them:
managed blocks reused before the host observed their kernels finish), the fuzzer's own state
machine (tests/allocator/test_fuzz.py), narrowed to the streams and sizes where the broken rule
matters, finds a violation the model names.  A clean run of the fuzzer then means something.

Each planted bug is a copy of the allocator's function with the one step that keeps the rule
left out.  The run is derandomized and stops at the first failure (no shrinking); its budget is
far above what finding each bug takes (tens to a few hundred examples, measured).
"""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule, run_state_machine_as_test

from numba_pool.allocator import arena as arena_module
from numba_pool.allocator import captures as captures_module
from numba_pool.allocator import device as device_module
from numba_pool.allocator import mempool_blocks as mempool_blocks_module
from numba_pool.allocator import host_blocks as host_blocks_module
from numba_pool.allocator import release as release_module
from numba_pool.allocator import stream_idle as stream_idle_module
from numba_pool.allocator import waits as waits_module
from numba_pool.allocator.release import Pending
from numba_pool.cuda import driver
from numba_pool.cuda.capture import NOT_CAPTURING
from numba_pool.cuda.streams import LEGACY, StreamRef
from helpers import AnyStreamsIdleBlocks
from test_fuzz import CAPTURE_MODES, LegalPrograms

BUDGET = settings(max_examples=3000, stateful_step_count=30, deadline=None, derandomize=True, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)


class ReadyAtOnce(Pending):
    """Rule 4 broken: the release gate's legacy fast action makes the arena's block ready for
    reuse at once, with no fence (planted as the arena's pending list)."""

    def __init__(self, arena):
        super().__init__()
        self.arena = arena

    def append(self, block):
        self.arena.ready.setdefault(block.rounded, []).append(block)


def gate_without_quarantine(source, cu, **parts):
    """The arena's release gate, built over :class:`ReadyAtOnce` instead of its quarantine."""
    parts["pending"] = ReadyAtOnce(source)
    return release_module.gate(source, cu, **parts)


def take_another_streams_block(self, rounded, stream):
    """Rule 1 broken: a stream with no free block takes another stream's, without waiting."""
    self._publish_released()
    domain = self._domains.of_stream(stream)
    block = self._carve(domain, rounded, stream)
    if block is not None:
        return block
    for other in self._domains:
        if other is not domain and other is not self._legacy:
            block = self._carve(other, rounded, stream)
            if block is not None:
                return block
    self._domains.add_slab(domain, stream, rounded)
    return self._carve(domain, rounded, stream)


def see_no_recorded_stream(self, stream, recorded):
    """Rule 2 broken: a release records no event on the streams recorded for its block (``Fenced``), so the host
    sees nothing of their work before the block goes back (the legacy stream's wait, the fence's, kept)."""
    if any(ref is LEGACY for ref in recorded):
        self.fence_waits.append(self._record(stream))
    return []


def reuse_without_the_hosts_observation(self, block):
    """Rule 9 broken: a cached managed block counts as complete at once, before the host has
    observed its last uses finish (its events are never queried)."""
    return True


def ignore_holds(waiting):
    """Rule 2 broken for holds: a release does not wait for an IPC export's importers."""
    streams = [w for w in (waiting or []) if isinstance(w, StreamRef)]
    return streams, []


class Narrowed(LegalPrograms):
    """The fuzzer's rules (allocate, launch, record_stream, drop) on streams made up front, one
    size; the arena fences at every miss and keeps no ready cache (``eager``)."""

    view = deferred_drops = collect_garbage = synchronize = destroy_stream = None
    scratch = trim = reset = create_stream = park = hold = let_go = None
    open_defer = close_defer = reset_inside = allocate_managed = host_access = allocate_door = door_handoff = None
    legacy_reuse = stream_reuse = None
    capture = launch_graph = drop_graph_array = wait_for_a_copy = None
    costs = False  # the rules of reuse only (the legacy stream's cost: the waiting-kernel plants below)
    blocking: tuple = (True, True, False)
    size = 1000
    holds = False  # True: the fuzzer's hold and let_go rules too
    managed = False  # True: managed arrays (the host writes each at its allocation) instead of device ones
    door = False  # True: a door's buffers (allocate(size, stream), deallocate(block, stream)) instead
    fenced = False  # True: checks.eager's knobs (a fence per released block, gpu_eager), opportunistic reuse

    @initialize()
    def start_narrowed(self):
        LegalPrograms.start(self, preempt=0, eager=self.fenced, opportunistic=self.fenced)
        if not self.fenced:  # the arena fences at every miss and keeps no ready cache
            arena = self.p.mm.allocator.arena
            if arena is not None:
                arena.quarantine_limit, arena.quarantine.cache_limit = -1, 0
        for blocking in self.blocking:
            self.streams.append(self.p.create_stream(blocking))

    start = None

    @precondition(lambda self: self.holds and self.families())
    @rule(data=st.data())
    def hold_one(self, data):
        LegalPrograms.hold(self, data)

    @precondition(lambda self: self.holds and self.p.holds)
    @rule(data=st.data(), bare=st.booleans())
    def let_one_go(self, data, bare):
        LegalPrograms.let_go(self, data, bare)

    @rule(data=st.data(), scoped=st.booleans())
    def allocate(self, data, scoped):
        stream = data.draw(st.sampled_from(self.streams)) if scoped else None
        if self.managed:
            self.p.allocate_managed(self.size, stream)
        elif self.door:
            self.p.allocate_door(self.size, stream)
        else:
            self.p.allocate(self.size, stream)

    @precondition(lambda self: self.families())
    @rule(data=st.data())
    def launch(self, data):
        self.p.launch(data.draw(st.sampled_from(self.streams)), [data.draw(st.sampled_from(self.families()))])

    @precondition(lambda self: self.p.families)
    @rule(data=st.data(), legalize=st.sampled_from(["record", "wait"]))
    def drop(self, data, legalize):
        self.p.drop(data.draw(st.sampled_from(list(self.p.families.values()))), legalize=legalize)


def test_the_fuzzer_finds_a_managed_block_reused_before_the_host_saw_its_kernels_finish(monkeypatch):
    monkeypatch.setattr(host_blocks_module.HostBlocks, "_completed", reuse_without_the_hosts_observation)
    machine = type("Planted", (Narrowed,), {"arena": False, "threads": 1, "blocking": (True, False), "managed": True})
    with pytest.raises(AssertionError, match="unordered reuse of managed memory") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert "new owner" in str(caught.value) and "the host (CPU)" in str(caught.value)


@pytest.mark.parametrize("owner, function, planted, arena, streams, holds", [
    (arena_module, "gate", gate_without_quarantine, True, (True, True), False),
    (arena_module.ArenaBlocks, "_take_scoped", take_another_streams_block, True, (False, False), False),
    (waits_module, "split_waiting", ignore_holds, False, (True,), True),
    (waits_module, "split_waiting", ignore_holds, True, (True,), True),
], ids=["arena: no quarantine", "arena: another stream's block", "mempool: holds ignored", "arena: holds ignored"])
def test_the_fuzzer_finds_a_planted_bug(monkeypatch, owner, function, planted, arena, streams, holds):
    monkeypatch.setattr(owner, function, planted)
    machine = type("Planted", (Narrowed,), {"arena": arena, "threads": 1, "blocking": streams, "holds": holds})
    # The importer's use at let-go: racing the block's next owner, or on memory freed already.
    with pytest.raises(AssertionError, match="unordered reuse|use of unallocated memory") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert "new owner" in str(caught.value)


def deallocate_on_the_allocation_stream(self, block, stream=None):
    """Rule 14 broken: a door's deallocate ignores the stream it names (cuda.core's ``Buffer.close(stream)``)
    and frees the block on its allocation stream only."""
    block.release(block)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_the_fuzzer_finds_a_release_that_sees_nothing_of_its_recorded_streams(monkeypatch, arena):
    """A ``record_stream`` stream is not waited for by the block's stream (Note [A named stream is not waited for]):
    the host sees its work done.  Planted: no event on it, so the block goes back after the next fence alone; the
    model completes what it can at each query (``fenced``), as a GPU does."""
    monkeypatch.setattr(waits_module.StreamWaits, "_after_fence_events", see_no_recorded_stream)
    machine = type("Planted", (Narrowed,), {"arena": arena, "threads": 1, "blocking": (True, False), "fenced": True})
    with pytest.raises(AssertionError, match="unordered reuse|use of unallocated memory") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert "new owner" in str(caught.value)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_the_fuzzer_finds_a_door_that_ignores_the_deallocation_stream(monkeypatch, arena):
    monkeypatch.setattr(device_module.DeviceAllocator, "deallocate", deallocate_on_the_allocation_stream)
    machine = type("Planted", (Narrowed,), {"arena": arena, "threads": 1, "blocking": (True, False, False),
                                            "door": True})
    with pytest.raises(AssertionError, match="unordered reuse") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert "new owner" in str(caught.value)


def test_the_fuzzer_finds_a_cuda_core_door_taking_any_stream_for_the_allocations(monkeypatch):
    """The door's own test of the stream cuda.core names at ``deallocate`` broken (numba_pool.MemoryResource, the
    fuzzer's door): any stream taken for the allocation's."""
    from numba_pool.plugin import resource

    monkeypatch.setattr(resource, "_named_at_free", lambda stream, ref, named: None)
    machine = type("Planted", (Narrowed,), {"arena": False, "threads": 1, "blocking": (True, False, False),
                                            "door": True})
    with pytest.raises(AssertionError, match="unordered reuse"):
        run_state_machine_as_test(machine, settings=BUDGET)


def test_the_fuzzer_finds_another_streams_idle_block_handed_out(monkeypatch):
    """(Rule 7a's blocking-stream exclusion: tests/allocator/test_stream_idle.py, found by the full fuzzer's
    threads; this narrowed machine does not reach it within its budget.)"""
    init = stream_idle_module.StreamIdle.__init__

    def planted(self, cu):  # rule 7a broken: an allocation takes any stream's idle block of its size
        init(self, cu)
        self.lists = AnyStreamsIdleBlocks()
    monkeypatch.setattr(stream_idle_module.StreamIdle, "__init__", planted)
    machine = type("Planted", (Narrowed,), {"arena": False, "threads": 1, "blocking": (False, False)})
    with pytest.raises(AssertionError, match="unordered reuse") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert "new owner" in str(caught.value)


def test_the_narrowed_fuzzer_passes_on_the_real_allocator():
    """The control: the same machines, nothing planted, a shorter run."""
    for arena, streams in ((True, (True, True)), (True, (False, False)), (False, (True, False))):
        machine = type("Real", (Narrowed,), {"arena": arena, "threads": 1, "blocking": streams, "holds": True})
        run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=100))
    machine = type("RealManaged", (Narrowed,), {"arena": False, "threads": 1, "blocking": (True, False), "managed": True})
    run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=100))
    for arena in (False, True):
        machine = type("RealDoor", (Narrowed,), {"arena": arena, "threads": 1, "blocking": (True, False, False),
                                                 "door": True})
        run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=100))


# --------------------------------------------------------------------------- rule 13 (captures)


def never_capturing(cu, handle):
    """Rule 13 broken: the allocator never sees that its scope's stream is being captured."""
    return False


def mempool_never_capturing(monkeypatch):
    """:func:`never_capturing` for the mempool blocks, which ask the driver inline."""
    init = mempool_blocks_module.PooledBlocks.__init__

    def planted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._capture_status = lambda handle: (driver.SUCCESS, NOT_CAPTURING)
    monkeypatch.setattr(mempool_blocks_module.PooledBlocks, "__init__", planted)


def capture_over(cu):
    """Rule 13 broken where the release gate asks (``still_capturing``, bound in
    :mod:`numba_pool.allocator.release`): it never holds back, and the mempool's release issues
    its driver calls while a capture is under way."""
    return False


def not_relaxed(cu):
    """Rule 13 broken in Note [Released beside a capture]: the release made at the drop in the thread's own capture
    mode (global by default), where the driver refuses a free on another stream and invalidates the capture."""
    return contextlib.nullcontext()


class Captures(LegalPrograms):
    """The fuzzer's capture rule (with allocate, launch and drop to fill the pool beside it)."""

    view = deferred_drops = collect_garbage = synchronize = destroy_stream = None
    scratch = trim = reset = park = hold = let_go = record_stream = None
    open_defer = close_defer = reset_inside = allocate_managed = host_access = wait_for_a_copy = None
    allocate_door = door_handoff = None
    costs = False


@pytest.mark.parametrize("plant, arena", [
    (lambda monkeypatch: monkeypatch.setattr(arena_module, "is_capturing", never_capturing), True),
    (mempool_never_capturing, False),
    (lambda monkeypatch: monkeypatch.setattr(release_module, "still_capturing", capture_over), False),
    (lambda monkeypatch: monkeypatch.setattr(release_module, "relaxed", not_relaxed), False),
], ids=["arena: capture not seen", "mempool: capture not seen", "mempool: release not held back",
        "mempool: released beside a capture, not in relaxed mode"])
def test_the_fuzzer_finds_a_planted_capture_bug(monkeypatch, plant, arena):
    plant(monkeypatch)
    machine = type("Planted", (Captures,), {"arena": arena, "threads": 1})
    # The capture broken (the model's "capture invalidated": cuStreamGetId of the capturing
    # stream, the legacy stream beside it, an unsafe call), the driver's refusal raised to the
    # program (an exportable pool's allocation node: NOT_SUPPORTED), or the capture rule's own
    # check that an array allocated in a capture is the graph's (an arena block carved there).
    with pytest.raises(Exception) as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    chain = _messages(caught.value)
    assert any(re.search("capture invalidated|STREAM_CAPTURE|NOT_SUPPORTED|allocated in a capture is not the graph's",
                         text) for text in chain), chain


def _messages(error: BaseException | None) -> list[str]:
    """The messages of ``error`` and the errors it was raised while handling."""
    chain = []
    while error is not None:
        chain.append(str(error))
        error = error.__context__
    return chain


def query_even_in_a_capture(self, block, event, publish, seen, retry):
    """Rule 13 broken at ``defer_cleanup``'s exit: the release asks ``cuEventQuery`` of its event while a capture
    is known to be under way (a global-mode capture is invalidated by it, from any thread)."""
    underway = list(captures_module.underway)
    captures_module.underway.clear()
    try:
        REAL_PUBLISH_AFTER(self, block, event, publish, seen, retry)
    finally:
        captures_module.underway.extend(underway)


REAL_PUBLISH_AFTER = waits_module.StreamWaits._publish_after


class CapturesBesideDefer(Captures):
    """The capture rule with ``defer_cleanup`` blocks opened before it (its ``close defer`` step exits them)."""

    open_defer = LegalPrograms.open_defer


def test_the_fuzzer_finds_a_defer_cleanup_exit_that_queries_an_event_in_a_capture(monkeypatch):
    monkeypatch.setattr(waits_module.StreamWaits, "_publish_after", query_even_in_a_capture)
    machine = type("Planted", (CapturesBesideDefer,), {"arena": False, "threads": 1})
    with pytest.raises(Exception) as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    chain = _messages(caught.value)
    assert any("cuEventQuery (potentially unsafe" in text for text in chain), chain


def test_the_capture_fuzzer_passes_on_the_real_allocator():
    for arena in (False, True):
        for capturing in (Captures, CapturesBesideDefer):
            machine = type("Real", (capturing,), {"arena": arena, "threads": 1})
            run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=100))


# --------------------------------------------------------------------------- issue 33 (no barrier)


REAL_DEFER = waits_module.Deferral.defer


def defer_after_a_legacy_record(self, release):
    """Issue 33 broken: a release that ``defer_cleanup`` holds back records an event on the
    legacy stream at the drop, the barrier that made an ODE solver's test hang (a kernel spinning
    on one stream until a copy on another)."""
    if self.depth:
        cu = driver.cu  # the model, while a Program runs
        event = cu.cuEventCreate(0)[1]
        cu.cuEventRecord(event, LEGACY.handle)
        cu.cuEventDestroy(event)
    return REAL_DEFER(self, release)


class Waiting(Narrowed):
    """The fuzzer's waiting-kernel rule (``fuzz_waits``) beside allocate, launch and drop, on
    blocking streams: a kernel spins on one until a copy on another, with arrays dropped inside
    a ``defer_cleanup`` block opened before it."""

    wait_for_a_copy = LegalPrograms.wait_for_a_copy
    wait_steps = ("drop",)
    wait_scopes = ("before",)
    record_stream = None
    blocking = (True, True)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_the_fuzzer_finds_a_release_put_back_on_the_legacy_stream_inside_defer_cleanup(monkeypatch, arena):
    monkeypatch.setattr(waits_module.Deferral, "defer", defer_after_a_legacy_record)
    machine = type("Planted", (Waiting,), {"arena": arena, "threads": 1})
    with pytest.raises(AssertionError, match="deadlock") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    text = str(caught.value)
    assert "event record on the legacy stream" in text and "numba_pool queued" in text, text
    assert "the waiting kernel on the stream" in text, text


def scratch_stream_waits_at_the_drop(self, carved):
    """Rule 2 broken for a carved scratch array (the code before the fix): its drop makes the scratch block's stream
    wait for each recorded stream, where the host must see their work done instead (Note [A named stream is not
    waited for] in numba_pool.allocator.device)."""
    from numba_pool.allocator.block import take_waits
    streams, holds = waits_module.split_waiting(take_waits(carved))
    allocator = self._allocator
    if allocator is not None:
        waits = allocator.waits
        streams = [ref for ref in streams if not ref.same_stream(self.stream)]
        if streams:
            waits.owner.enter(lambda retry: waits._wait_on_streams(streams, self.stream))
        for hold in holds:
            waits.add_wait(self._parent, hold)
    self._outstanding.pop(carved.start, None)
    if not self._scope_open and not self._outstanding:
        self._release()


class ScratchWaiting(Waiting):
    """The waiting-kernel rule with scratch arrays recorded on other streams, dropped outside ``defer_cleanup``."""

    scratch = LegalPrograms.scratch
    record_stream = LegalPrograms.record_stream
    wait_scopes = ("none",)
    blocking = (False, False)


def test_the_fuzzer_finds_a_scratch_arrays_stream_made_to_wait_for_its_recorded_stream(monkeypatch):
    from numba_pool.allocator import scratch as scratch_module
    monkeypatch.setattr(scratch_module.ScratchBlock, "_drop", scratch_stream_waits_at_the_drop)
    machine = type("Planted", (ScratchWaiting,), {"arena": False, "threads": 1})
    with pytest.raises(AssertionError, match="deadlock") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert "stream wait" in str(caught.value) and "numba_pool queued" in str(caught.value), str(caught.value)


def test_the_waiting_fuzzer_passes_on_the_real_allocator():
    """The control: nothing planted, a shorter run."""
    for arena in (False, True):
        for waiting in (Waiting, ScratchWaiting):
            machine = type("Real", (waiting,), {"arena": arena, "threads": 1})
            run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=100))


def hand_out_every_batch(self):
    """Rule 4 broken (issue 33's fences): every fenced batch is handed back as complete, fence
    recorded or not, without asking whether the host has seen it complete (``cuEventQuery``)."""
    from numba_pool.allocator.fences import run_releases
    releases: list = []
    batches = self.take_all(releases)
    run_releases(releases)
    return batches


#: The planted fence bug's machines: blocking and non-blocking streams, fences after every
#: released block that complete when the host asks, and the pool's opportunistic reuse (a block
#: freed back to the mempool goes to any stream once the free can complete); in arena mode,
#: blocks above the arena's largest (4 KiB), which the mempool serves: the arena's own legacy
#: blocks go only to the legacy stream's owners, whose work follows the fence anyway.
FENCED = [{"arena": False, "size": 1000}, {"arena": True, "size": 6000}]


@pytest.mark.parametrize("options", FENCED, ids=["mempool", "arena"])
def test_the_fuzzer_finds_a_block_handed_out_before_its_fence_completed(monkeypatch, options):
    from numba_pool.allocator import mempool_blocks
    from numba_pool.allocator.fences import Fences  # issue 33's module
    monkeypatch.setattr(Fences, "completed", hand_out_every_batch)
    # No idle cache: the batches go back to the mempool, whose opportunistic reuse hands them to
    # any stream (an idle block kept by size goes only to the legacy stream's owners, whose
    # work on blocking streams follows the fence anyway: the model cannot tell it early).
    monkeypatch.setattr(mempool_blocks, "IDLE_BLOCKS", 0)
    machine = type("Planted", (Narrowed,), {"threads": 1, "blocking": (True, False), "fenced": True, **options})
    with pytest.raises(AssertionError, match="unordered reuse") as caught:
        run_state_machine_as_test(machine, settings=BUDGET)
    assert "new owner" in str(caught.value)


def test_the_fenced_fuzzer_passes_on_the_real_allocator():
    """The control of the planted fence bug: the same machines, nothing planted."""
    for options in FENCED:
        machine = type("Real", (Narrowed,), {"threads": 1, "blocking": (True, False), "fenced": True, **options})
        run_state_machine_as_test(machine, settings=settings(BUDGET, max_examples=100))
