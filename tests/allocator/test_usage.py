"""The allocator's usage events replayed into bytes and blocks in use, peaks and totals: exact
against a reference model for any batching, and across threads appending while one drains."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from numba_pool.allocator.usage import DRAIN_AT, UsageTracker


def reference(events: list[int]) -> dict:
    """The statistics of an event sequence, the slow and obvious way."""
    in_use = peak = blocks = peak_blocks = allocations = frees = total = 0
    for event in events:
        if event >= 0:
            in_use, blocks, allocations, total = in_use + event, blocks + 1, allocations + 1, total + event
        else:
            in_use, blocks, frees = in_use - ~event, blocks - 1, frees + 1
        peak, peak_blocks = max(peak, in_use), max(peak_blocks, blocks)
    return {"bytes_in_use": in_use, "peak_bytes_in_use": peak, "blocks_in_use": blocks,
            "peak_blocks_in_use": peak_blocks, "total_allocations": allocations, "total_frees": frees,
            "total_bytes": total}


def observed(tracker: UsageTracker) -> dict:
    return {name: getattr(tracker, name) for name in reference([])}


@st.composite
def usage(draw):
    """A valid event sequence (a free only of a live allocation, sizes from 0 bytes up) and the
    points after which statistics are drained."""
    live, events, drains = [], [], []
    for _ in range(draw(st.integers(0, 200))):
        if live and draw(st.booleans()):
            events.append(~live.pop(draw(st.integers(0, len(live) - 1))))
        else:
            size = draw(st.sampled_from([0, 1, 255, 256, 4096, 1 << 30]))
            live.append(size)
            events.append(size)
        if draw(st.integers(0, 9)) == 0:
            drains.append(len(events))
    return events, drains


@settings(max_examples=300, deadline=None)
@given(usage())
def test_replay_in_any_batches_matches_the_reference(case):
    events, drains = case
    tracker = UsageTracker()
    done = 0
    for point in drains + [len(events)]:
        tracker.events.extend(events[done:point])
        tracker.drain()
        done = point
        assert observed(tracker) == reference(events[:point])
    assert tracker.events == []


def test_zero_byte_allocations_count_as_blocks():
    tracker = UsageTracker()
    tracker.events.extend([0, 0, ~0])
    tracker.drain()
    assert (tracker.blocks_in_use, tracker.peak_blocks_in_use, tracker.bytes_in_use) == (1, 2, 0)


def test_threads_appending_while_another_drains_lose_nothing():
    tracker = UsageTracker()
    note = tracker.events.append
    per_thread, stop = 20_000, threading.Event()

    def allocate_and_free(size):
        for _ in range(per_thread):
            note(size)
            note(~size)

    def drain_repeatedly():
        while not stop.is_set():
            tracker.drain()

    drainer = threading.Thread(target=drain_repeatedly)
    drainer.start()
    workers = [threading.Thread(target=allocate_and_free, args=(256 * (i + 1),)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    drainer.join()
    tracker.drain()
    assert tracker.total_allocations == tracker.total_frees == 4 * per_thread
    assert tracker.bytes_in_use == tracker.blocks_in_use == 0
    assert 1024 <= tracker.peak_bytes_in_use <= 256 + 512 + 768 + 1024
    assert 1 <= tracker.peak_blocks_in_use <= 4


def test_drain_if_due_replays_only_past_the_threshold():
    tracker = UsageTracker()
    tracker.events.extend([8] * DRAIN_AT)
    tracker.drain_if_due()
    assert len(tracker.events) == DRAIN_AT and tracker.total_allocations == 0
    tracker.events.append(8)
    tracker.drain_if_due()
    assert tracker.events == [] and tracker.total_allocations == DRAIN_AT + 1
    assert tracker.bytes_in_use == 8 * (DRAIN_AT + 1)


def test_close_replays_what_is_pending_and_ignores_later_events():
    class Sink(list):
        def append(self, event):
            pass

    tracker = UsageTracker()
    tracker.events.extend([100, 200, ~100])
    tracker.close(Sink())
    tracker.events.append(~200)
    tracker.drain()
    assert observed(tracker) == reference([100, 200, ~100])
