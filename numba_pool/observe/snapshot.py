"""Snapshots in the schema of PyTorch's ``torch.cuda.memory._snapshot()``, which its memory viewer reads
(pytorch.org/memory_viz, ``python -m torch.cuda._memory_viz``); the mapping (docs/guide.md, "Snapshots", for users):

=========================  =============================================================================================
PyTorch                    numba_pool
=========================  =============================================================================================
segment                    an arena slab; a mempool allocation (one block; the pool is opaque below); a scratch block
                           (its carved arrays from the history); the mempool reserve (reserved minus the rest, with the
                           driver's rounding: one free block at address 0); a pinned or managed block (one block)
segment ``kind``           ours: ``arena slab``, ``mempool``, ``scratch``, ``mempool reserve``, ``pinned``, ``managed``
block ``active_allocated`` an array holds it (or ``defer_cleanup`` holds it back)
``active_awaiting_free``   released, not yet reusable: an arena block waiting for its fence or an IPC hold, a cached
                           pinned or managed block whose events the host has not seen complete
``inactive``               free: reusable now
block ``requested_size``   the size Numba asked for (from the history; without it, the block)
block ``frames``           the stack at the allocation (from the history; empty without it)
``device_traces[d]``       the history's events on device ``d`` (``alloc``, ``free_requested``, ``free_completed``,
                           ``oom``, ``trim``, ``reset``), oldest first, with our ``kind`` and ``thread`` (0 on a free)
=========================  =============================================================================================

Totals: segments sum to the mempool's reserved bytes plus the caches' (:class:`~.statistics.PoolStatistics`);
with the history, active blocks' requested sizes sum to the bytes in use (a scratch block's: its carved arrays)."""

from __future__ import annotations

import pickle
from typing import Iterable

from ..allocator.free_list import ALIGNMENT as ALIGN_ARRAYS  # scratch carving's alignment too
from .history import History, is_library_frame, resolve

#: numba_pool's block states -> PyTorch's.
STATES = {"allocated": "active_allocated", "awaiting_free": "active_awaiting_free", "free": "inactive"}
LARGE = 1 << 20  #: PyTorch's split between small and large segments (bytes).


def build(segments_by_device: dict[int, list[dict]], history: History | None) -> dict:
    """The snapshot dict (``segments`` tagged ``device``; ``device_traces``, a list per ordinal to the highest) from
    ``segments_by_device`` (ordinal -> segments: ``kind``, ``address``, ``size``, ``stream``, ``blocks`` of
    ``(address, size, state)``) and ``history`` (or None: no frames or traces; requested sizes = block sizes)."""
    live = dict(history.live) if history is not None else {}
    segments = [_segment(device, segment, live) for device, segs in sorted(segments_by_device.items())
                for segment in segs]
    entries = history.entries if history is not None else []
    devices = max([*segments_by_device, *(e.device for e in entries)], default=-1) + 1
    traces: list[list[dict]] = [[] for _ in range(devices)]
    for entry in entries:
        traces[entry.device].extend(_trace(entry))
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"allocator": "numba_pool"}}


def dump(snapshot: dict, path) -> None:
    """Write ``snapshot`` to ``path`` as a pickle (what PyTorch's viewer reads)."""
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)


def _segment(device: int, segment: dict, live: dict) -> dict:
    blocks = _blocks(device, segment, live)
    allocated = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": segment["address"], "total_size": segment["size"],
            "stream": segment["stream"], "segment_type": "large" if segment["size"] >= LARGE else "small",
            "segment_pool_id": (0, 0), "allocated_size": allocated, "active_size": active,
            "requested_size": allocated, "kind": segment["kind"], "blocks": blocks}


def _blocks(device: int, segment: dict, live: dict) -> list[dict]:
    if segment["kind"] == "scratch":
        return _carved(device, segment, live)
    blocks = []
    for address, size, state in segment["blocks"]:
        entry = live.get((device, address)) if state == "allocated" else None
        blocks.append(_block(address, size, STATES[state], entry))
    return blocks


def _carved(device: int, segment: dict, live: dict) -> list[dict]:
    """A scratch block's arrays (live history entries, rounded to the carving alignment), gaps free; else one block."""
    start, end = segment["address"], segment["address"] + segment["size"]
    arrays = sorted((address, entry) for (dev, address), entry in live.items()
                    if dev == device and start <= address < end)
    if not arrays:
        return [_block(start, segment["size"], "active_allocated", None)]
    blocks, position = [], start
    for address, entry in arrays:
        if address > position:
            blocks.append(_block(position, address - position, "inactive", None))
        size = min(-(-entry.size // ALIGN_ARRAYS) * ALIGN_ARRAYS, end - address)
        blocks.append(_block(address, size, "active_allocated", entry))
        position = address + size
    if position < end:
        blocks.append(_block(position, end - position, "inactive", None))
    return blocks


def _block(address: int, size: int, state: str, entry) -> dict:
    requested = min(entry.size, size) if entry is not None else (size if state == "active_allocated" else 0)
    return {"address": address, "size": size, "requested_size": requested, "state": state,
            "frames": resolve(entry.frames) if entry is not None else []}


def _trace(entry) -> list[dict]:
    """The trace entries of a history entry: a ``free`` is both ``free_requested`` and ``free_completed``."""
    out = {"action": entry.action, "addr": entry.address, "size": entry.size, "stream": entry.stream,
           "time_us": entry.time_ns // 1000, "frames": resolve(entry.frames), "kind": entry.kind,
           "thread": entry.thread}
    if entry.action == "oom":
        out["device_free"] = entry.device_free
    if entry.action == "free":
        return [{**out, "action": "free_requested"}, {**out, "action": "free_completed"}]
    return [out]


def summarize(snapshot: dict, limit: int = 10) -> dict:
    """What ``numba-pool-tools snapshot summarize`` tabulates, in bytes: ``sites`` (``(site, bytes, blocks)``,
    at most ``limit``), ``kinds`` (``(kind, segments, reserved, allocated)``), totals ``reserved``, ``allocated``."""
    sites: dict[str, list[int]] = {}
    kinds: dict[str, list[int]] = {}
    reserved = allocated = 0
    for segment in snapshot["segments"]:
        reserved += segment["total_size"]
        row = kinds.setdefault(segment.get("kind", "segment"), [0, 0, 0])
        row[0] += 1
        row[1] += segment["total_size"]
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            allocated += block["requested_size"]
            row[2] += block["requested_size"]
            site = site_of_frames(block["frames"])
            entry = sites.setdefault(site, [0, 0])
            entry[0] += block["requested_size"]
            entry[1] += 1
    top = sorted(((s, b, n) for s, (b, n) in sites.items()), key=lambda r: (-r[1], r[0]))[:limit]
    return {"sites": top, "kinds": sorted(((k, *v) for k, v in kinds.items()), key=lambda r: -r[2]),
            "reserved": reserved, "allocated": allocated}


def site_of_frames(frames: Iterable[dict]) -> str:
    """``file:line``: innermost resolved frame outside numba_pool and Numba, else the innermost, or ``"<no stack>"``."""
    frames = list(frames)
    for frame in frames:
        if not is_library_frame(frame["filename"]):
            return f"{frame['filename']}:{frame['line']}"
    return f"{frames[0]['filename']}:{frames[0]['line']}" if frames else "<no stack>"
