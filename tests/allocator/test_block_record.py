"""One record per block (issue 34, item 2): a block's state and waits live on its
:class:`~numba_pool.allocator.block.Block`, and the arena hands a ready block's record out again
(Note [A ready block is its Block]); the later-queue of things held until a condition ends
(:class:`~numba_pool.allocator.held.Held`) never loses or duplicates what it holds."""

from __future__ import annotations

import sys
import threading

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from cuda_model.checks import assert_clean, eager
from pausing import Paused
from cuda_model.harness import LEGACY
from numba_pool.allocator.held import Held
from numba_pool.allocator.release import Pending
from numba_pool.cuda.streams import LEGACY as LEGACY_REF


def _state_of(p, address: int) -> str | None:
    for _, _, _, blocks in p.mm.allocator.arena.layout():
        for start, _, state in blocks:
            if start == address:
                return state
    return None


def test_an_arena_block_goes_allocated_awaiting_free_free_and_back_as_one_record(programs):
    p = programs(arena=True)  # not eager: the ready cache is on
    allocator = p.mm.allocator
    allocator.arena.quarantine_limit = -1  # fence before every miss: released blocks become ready soon
    nb = p.create_stream(False)
    x = p.allocate(1000)
    record = x.refs[0].block
    assert _state_of(p, x.address) == "allocated" and record.state == "allocated"
    p.model.wait(nb, LEGACY)
    p.launch(nb, [x])
    p.record_stream(x, nb)
    assert record.waits is not None  # the stream is on the record, no table beside it
    p.drop(x)
    assert record.waits is None and _state_of(p, x.address) == "awaiting_free"
    assert not allocator.record_stream(x.address, LEGACY_REF), "a released block is not live: record_stream must not find it"
    p.drop(p.allocate(4096), legalize="sync")  # a miss: fences the released block
    assert p.model.cuCtxSynchronize()[0] == 0
    p.drop(p.allocate(4096), legalize="sync")  # a miss: collects the completed fence into the ready cache
    assert _state_of(p, x.address) == "free"
    y = p.allocate(1000)
    assert y.address == x.address and y.refs[0].block is record  # the ready block's own record
    assert record.state == "allocated" and record.waits is None and record.size == 1000
    p.model.wait(nb, LEGACY)
    p.launch(nb, [y])
    p.drop(y)
    assert_clean(p)
    p.finish()


def test_a_mempool_block_is_its_record_in_the_live_table(programs):
    p = programs(arena=False)
    eager(p)
    x = p.allocate(1 << 20)
    record = x.refs[0].block
    blocks = p.mm.allocator.mempool_blocks.blocks()
    assert record in blocks and record.state == "allocated"
    [segment] = [s for s in p.mm.allocator.segments() if s["address"] == x.address]
    assert segment["blocks"] == [(x.address, 1 << 20, "allocated")]
    p.drop(x)
    assert record.state == "awaiting_free" and record not in p.mm.allocator.mempool_blocks.blocks()
    assert_clean(p)
    p.finish()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=1, max_size=80))
def test_held_things_are_let_go_taken_or_left_exactly_once(ops):
    # Three threads keep things, then let some of them go, while a fourth takes the oldest
    # until they are done: every thing kept ends up exactly once let go, taken or still held.
    held = Held()
    let_go, taken, start, done = [], [], threading.Barrier(4), threading.Event()
    items = [(i, thread, drop) for i, (thread, drop) in enumerate(ops)]

    def keeper(me: int) -> None:
        start.wait()
        mine = [(i, drop) for i, thread, drop in items if thread == me]
        for i, _ in mine:
            held.keep(("thing", i), key=i)
        for i, drop in mine:
            if drop and (what := held.let_go(i)) is not None:
                let_go.append(what)

    def taker() -> None:
        start.wait()
        while not done.is_set() or len(held):
            if (what := next(held.drain(), None)) is not None:
                taken.append(what)
            if done.is_set():
                break

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the races are what is tested
    try:
        keepers = [threading.Thread(target=keeper, args=(me,)) for me in range(3)]
        threads = keepers + [threading.Thread(target=taker)]
        for thread in threads:
            thread.start()
        for thread in keepers:
            thread.join(10)
        done.set()
        threads[-1].join(10)
    finally:
        sys.setswitchinterval(interval)
    left = held.take()
    everything = let_go + taken + left
    assert sorted(everything) == sorted(("thing", i) for i in range(len(items)))
    assert len(held) == 0


@pytest.mark.parametrize("pause_at", [1, 2, 3])
def test_a_let_go_inside_a_take_is_had_by_one_of_them(pause_at):
    # The taker has chosen its key and pauses at its pause_at-th line after; meanwhile a hold
    # lets that thing go.  Exactly one of them has it (a double release otherwise).
    held = Held()
    held.keep("thing", key=1)
    taking = Paused(Held.drain.__code__, pause_at, lambda: next(held.drain(), None),
                    counts=lambda frame: "key" in frame.f_locals)
    let_go = held.let_go(1)
    taking.resume()
    got = [taking.result]
    assert [let_go, *got].count("thing") == 1


def test_a_release_defer_cleanup_holds_back_stays_allocated_until_the_exit(programs):
    # As before the record: the layout, block_size and record_stream see such a block as live
    # (the statistics count it in use) until defer_cleanup's exit makes it free.
    p = programs(arena=True)
    arena = p.mm.allocator.arena
    x = p.allocate(1000)
    record = x.refs[0].block
    with p.mm.defer_cleanup():
        p.drop(x)
        assert record.state == "allocated" and _state_of(p, x.address) == "allocated"
        assert arena.block_size(x.address) == 1024 and arena.containing_block(x.address) is record
    assert record.state == "awaiting_free" and _state_of(p, x.address) == "awaiting_free"
    assert arena.block_size(x.address) is None
    assert_clean(p)
    p.finish()


def test_a_block_just_carved_reads_as_allocated(programs):
    # Between the carve (under the arena's lock) and the hand-out, a snapshot may read it.
    p = programs(arena=True)
    arena = p.mm.allocator.arena
    record = arena._allocate(1024, LEGACY_REF, arena._take_legacy)
    assert (record.start, 1024, "allocated") in [b for _, _, _, blocks in arena.layout() for b in blocks]
    assert arena.containing_block(record.start) is record
    record.size = 1024
    arena._note(1024)  # as the hand-out would have; the release counts its free
    record.release(record)
    p.finish()


def test_a_take_a_finalizer_makes_inside_a_take_gets_what_the_outer_one_does_not():
    # The collector may run a pointer's finalizer inside Pending.take's slice (an allocation),
    # in the same thread; that release may take too (a dropped source's free_after_reset).
    # Neither take may hang, and no block is taken twice or lost.
    pending, got = Pending(), []
    pending.add([_Sized(i) for i in range(5)])
    code = Pending.take.__code__

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None

        def local(frame, event, arg):
            if event == "line" and "taken" in frame.f_locals and not got:
                pending.append(_Sized(5))  # the finalizer's release, then its take
                got.append(pending.take())
            return local
        return local

    def outer():
        sys.settrace(tracer)
        try:
            got.append(pending.take())
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=outer, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "a take inside a take hung"
    taken = [block.n for each in got for block in each] + [block.n for block in pending.take()]
    assert sorted(taken) == list(range(6))


class _Sized:
    def __init__(self, n: int):
        self.n, self.size = n, 100
