"""The arena's bookkeeping against host memory: unit tests and a hypothesis state machine."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from host_upstream import HostUpstream, fill, holds
from numba_pool.arena import ALIGNMENT, Arena, ArenaError, round_up

LEGACY = 1
SLAB = 64 << 10


def make(**kw):
    upstream = kw.pop("upstream", None) or HostUpstream()
    options = {"slab_size": SLAB, "max_block": SLAB // 2, "fenced_stream": LEGACY, **kw}
    return Arena(upstream, **options), upstream


def test_blocks_are_aligned_and_rounded():
    arena, _ = make()
    addresses = [arena.allocate(n, "s") for n in (1, 255, 256, 257, 1000)]
    assert all(a % ALIGNMENT == 0 for a in addresses)
    assert [arena.block_size(a) for a in addresses] == [256, 256, 256, 512, 1024]
    assert round_up(0) == 256
    arena.check_invariants()


def test_split_then_coalesce_back_into_one_slab_block():
    arena, _ = make()
    a, b, c = (arena.allocate(1024, "s") for _ in range(3))
    assert b == a + 1024 and c == b + 1024  # split off the front of the slab in turn
    arena.free(b, "s")
    arena.free(a, "s")  # merges with b's block
    arena.free(c, "s")  # merges with a+b and with the rest of the slab
    s = arena.statistics()
    assert s.free_blocks == 1 and s.largest_free_block == SLAB and s.in_use == 0
    arena.check_invariants()


def test_best_fit_picks_the_smallest_block_that_fits():
    arena, _ = make()
    blocks = [arena.allocate(n, "s") for n in (4096, 256, 1024, 256, 2048, 256)]
    for i in (0, 2, 4):  # free 4096, 1024, 2048: separated by live 256-byte blocks
        arena.free(blocks[i], "s")
    assert arena.allocate(1000, "s") == blocks[2]
    assert arena.allocate(1500, "s") == blocks[4]
    arena.check_invariants()


def test_same_stream_reuse_is_immediate_and_needs_no_ordering():
    arena, up = make()
    a = arena.allocate(512, "s")
    arena.free(a, "s")
    assert arena.allocate(512, "s") == a
    assert up.orders == [] and up.fences == 0


def test_legacy_frees_wait_in_quarantine_until_a_fence():
    arena, up = make()
    a = arena.allocate(512, LEGACY)
    arena.free(a, LEGACY)
    b = arena.allocate(512, LEGACY)
    assert b != a and up.fences == 0  # the rest of the slab fits: no fence needed yet
    assert arena.statistics().quarantined == 512
    while up.fences == 0:  # exhaust the slab: the arena fences rather than take a new slab
        arena.allocate(SLAB // 2, LEGACY)
    assert len(up.sizes) == 1 or up.fences == 1
    arena.check_invariants()


def test_quarantine_limit_triggers_a_fence():
    arena, up = make(slab_size=1 << 20)
    blocks = [arena.allocate(256, LEGACY) for _ in range(300)]
    for b in blocks:
        arena.release(b, LEGACY)  # the finalizers' lock-free path
    assert up.fences == 0 and arena.statistics().quarantined == 300 * 256
    arena.allocate(256, LEGACY)
    assert up.fences == 1 and arena.statistics().quarantined == 0


def test_other_stream_takes_blocks_only_after_ordering():
    arena, up = make()
    a = arena.allocate(SLAB // 2, "s1")
    b = arena.allocate(SLAB // 2, "s1")  # s1's slab is now full
    arena.free(a, "s1")
    c = arena.allocate(SLAB // 2, "s2")
    assert c == a and up.orders == [("s1", "s2")]
    assert len(up.sizes) == 1  # reused rather than a new slab
    arena.free(b, "s1")
    arena.check_invariants()


def test_double_free_and_foreign_free_are_errors_and_change_nothing():
    arena, _ = make()
    a = arena.allocate(256, "s")
    arena.free(a, "s")
    before = arena.statistics()
    with pytest.raises(ArenaError, match="not a live block"):
        arena.free(a, "s")
    with pytest.raises(ArenaError, match="not a live block"):
        arena.free(12345 * 256, "s")
    assert arena.statistics() == before
    arena.check_invariants()


def test_requests_above_max_block_are_refused():
    arena, _ = make()
    with pytest.raises(ArenaError, match="largest block"):
        arena.allocate(SLAB // 2 + 1, "s")


def test_trim_returns_every_empty_slab_and_keeps_used_ones():
    arena, up = make()
    blocks = [arena.allocate(SLAB // 2, "s") for _ in range(6)]  # 3 slabs
    for b in blocks[:4]:
        arena.free(b, "s")
    released = arena.trim()
    assert released == 2 * SLAB and len(up.sizes) == 1
    arena.check_invariants()


def test_release_threshold_gives_empty_slabs_back_at_once():
    arena, up = make(release_threshold=SLAB)
    blocks = [arena.allocate(SLAB // 2, "s") for _ in range(4)]  # 2 slabs
    for b in blocks:
        arena.free(b, "s")
    assert len(up.sizes) == 1 and arena.statistics().reserved == SLAB


def test_upstream_failure_leaves_the_arena_consistent():
    arena, _ = make(upstream=HostUpstream(limit_bytes=SLAB))
    a = arena.allocate(SLAB // 2, "s")
    arena.allocate(SLAB // 2, "s")
    with pytest.raises(MemoryError):
        arena.allocate(256, "s")
    arena.check_invariants()
    arena.free(a, "s")
    assert arena.allocate(256, "s") == a


def test_release_from_finalizers_applies_at_the_next_operation():
    arena, _ = make()
    a = arena.allocate(256, "s")
    arena.release(a, "s")
    assert arena.allocate(256, "s") == a


def test_consolidate_merges_domains_so_trim_finds_empty_slabs():
    arena, up = make()
    a = arena.allocate(1024, "s1")
    b = arena.allocate(1024, "s1")
    arena.free(a, "s1")
    arena.free(b, LEGACY)  # its neighbours are in another domain: the slab is split
    assert arena.trim() == 0
    arena.consolidate()
    assert arena.trim() == SLAB and up.sizes == {}


class ArenaMachine(RuleBasedStateMachine):
    """Random allocate/free/release/trim sequences; every live block carries a byte pattern in
    host memory, checked when it is freed, so an overlap shows up as corruption."""

    blocks = Bundle("blocks")

    def __init__(self):
        super().__init__()
        self.upstream = HostUpstream()
        self.arena = Arena(self.upstream, slab_size=16 << 10, max_block=4 << 10, fenced_stream=LEGACY)
        self.live: dict[int, tuple[int, int, object]] = {}  # address -> (requested, pattern, stream)
        self.counter = 0

    @rule(target=blocks, nbytes=st.integers(0, 4 << 10), stream=st.sampled_from([LEGACY, "a", "b"]))
    def allocate(self, nbytes, stream):
        address = self.arena.allocate(nbytes, stream)
        assert address not in self.live
        size = self.arena.block_size(address)
        assert size >= nbytes and size == round_up(nbytes)
        self.counter = self.counter % 250 + 1
        fill(address, size, self.counter)
        self.live[address] = (size, self.counter, stream)
        return address

    @rule(address=consumes(blocks), now=st.booleans(), other_stream=st.booleans())
    def free(self, address, now, other_stream):
        size, pattern, stream = self.live.pop(address)
        assert holds(address, size, pattern), "a live block was overwritten: blocks overlap"
        stream = "b" if other_stream else stream
        if now:
            self.arena.free(address, stream)
        else:
            self.arena.release(address, stream)

    @rule()
    def trim(self):
        self.arena.consolidate()
        self.arena.trim()

    @invariant()
    def consistent(self):
        self.arena.check_invariants()
        s = self.arena.statistics()
        assert s.in_use == sum(size for size, _, _ in self.live.values())
        assert s.in_use + s.cached + s.free == s.reserved == sum(self.upstream.sizes.values())
        for address, (size, _, _) in self.live.items():
            assert any(a <= address and address + size <= a + n for a, n in self.upstream.sizes.items())


ArenaMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestArenaStateMachine = ArenaMachine.TestCase
