"""Bytes held over time by allocation site, from a snapshot's recorded events
(``device_traces``), for ``numba-pool-tools snapshot plot``.

An ``alloc`` adds its size at its site (the innermost frame outside numba_pool and Numba, as
:func:`numba_pool.observe.snapshot.summarize` names sites); its ``free_completed`` takes it
away; a ``free_requested`` alone changes nothing (the memory is held until the release
completes: a ``defer_cleanup`` block, a fence).  A free whose allocation fell out of the
history's ring (or came before the recording) is ignored, so the curves start from what the
history saw: nothing before its first event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from numba_pool.observe.snapshot import site_of_frames as site_of

#: Events drawn as vertical lines, with how they are named.
MARKED = {"oom": "out of memory", "trim": "trim", "reset": "reset"}


@dataclass
class DeviceTimeline:
    """One device's curves: ``times`` (seconds since the first event of the snapshot, any
    device), ``held[i][k]`` the bytes site ``sites[k]`` holds right after event ``i`` (the last
    "site", when present, is the other sites together), ``peaks[k]`` its highest value, and the
    marked events as ``(seconds, action)``."""

    device: int
    times: list[float] = field(default_factory=list)
    sites: list[str] = field(default_factory=list)
    held: list[list[int]] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)
    peak_total: int = 0
    allocations: int = 0
    marks: list[tuple[float, str]] = field(default_factory=list)


OTHER = "other sites"


def timelines(traces: list[list[dict]], top: int) -> list[DeviceTimeline]:
    """One :class:`DeviceTimeline` per device with events, its ``top`` sites by peak bytes held
    (the rest as :data:`OTHER`); empty when no device has an event."""
    starts = [event["time_us"] for events in traces for event in events]
    if not starts:
        return []
    start = min(starts)
    return [_timeline(device, events, start, top) for device, events in enumerate(traces) if events]


def _timeline(device: int, events: list[dict], start_us: int, top: int) -> DeviceTimeline:
    events = sorted(events, key=lambda e: e["time_us"])  # stable: the ring's order within a microsecond
    changes, peaks, peak_total, allocations = _changes(events)
    ranked = sorted(peaks, key=lambda site: (-peaks[site], site))
    shown = ranked[:top]
    column = {site: k for k, site in enumerate(shown)}
    other = len(shown) if len(ranked) > top else None
    width = len(shown) + (other is not None)
    line = DeviceTimeline(device, sites=shown + ([OTHER] if other is not None else []),
                          peak_total=peak_total, allocations=allocations)
    current = [0] * width
    for event, change in zip(events, changes):
        seconds = (event["time_us"] - start_us) / 1e6
        if event["action"] in MARKED:
            line.marks.append((seconds, event["action"]))
        for site, delta in change:
            current[column.get(site, other)] += delta
        line.times.append(seconds)
        line.held.append(list(current))
    line.peaks = [max(row[k] for row in line.held) for k in range(width)]
    return line


def _changes(events: list[dict]) -> tuple[list[list[tuple[str, int]]], dict[str, int], int, int]:
    """Each event's changes, ``[(site, bytes)]``, every site's peak, the peak of all the sites
    together and the count of allocations."""
    held: dict[int, tuple[str, int]] = {}  # address -> (site, size)
    by_site: dict[str, int] = {}
    peaks: dict[str, int] = {}
    total = peak_total = allocations = 0
    changes = []
    for event in events:
        if "addr" not in event:  # PyTorch's oom events have device_free in its place, and change nothing
            changes.append([])
            continue
        action, address = event["action"], event["addr"]
        change = []
        if action in ("alloc", "free_completed") and address in held:
            # freed; or, for an alloc, its free fell out of the ring and the address came back
            site, size = held.pop(address)
            change.append((site, -size))
        if action == "alloc":
            allocations += 1
            held[address] = (site_of(event["frames"]), event["size"])
            change.append(held[address])
        for site, delta in change:
            by_site[site] = by_site.get(site, 0) + delta
            total += delta
            peaks[site] = max(peaks.get(site, 0), by_site[site])
        peak_total = max(peak_total, total)
        changes.append(change)
    return changes, peaks, peak_total, allocations
