"""Snapshots (numba_pool/observe/snapshot.py) in PyTorch's schema, on the CUDA model: the schema
checked field by field and against a recorded expectation (tests/data/snapshot-expectation.json,
a fixed program's snapshot with addresses, times and threads left out), the totals against
``stats()``, and, wherever torch is importable, PyTorch's own viewer reading the dump."""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys

import pytest

import numba_pool
from cuda_model.harness import Program
from helpers import DATA
from numba_pool.plugin.debugging import snapshot_of

EXPECTATION = os.path.join(DATA, "snapshot-expectation.json")
SEGMENT_KEYS = {"device", "address", "total_size", "stream", "segment_type", "segment_pool_id", "allocated_size",
                "active_size", "requested_size", "kind", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames", "kind", "thread"}


def fixed_program(arena: bool):
    """The same allocations every time: device arrays (arena and mempool), a scratch scope's
    arrays, a managed and a pinned array, one dropped; returns (snapshot, statistics)."""
    numba_pool.record_history()
    p = Program(arena=arena, host=True)
    try:
        kept = [p.mm.memalloc(1000), p.mm.memalloc(100_000)]
        dropped = p.mm.memalloc(2000)
        with numba_pool.scratch(8192, manager=p.mm):
            kept.append(p.mm.memalloc(300))
            kept.append(p.mm.memalloc(700))
            kept += [p.mm.memallocmanaged(5000, True), p.mm.memhostalloc(3000)]
            del dropped
            gc.collect()
            return snapshot_of([p.mm]), p.mm.statistics()
    finally:
        p.close()
        numba_pool.record_history(False)


def normalized(snapshot: dict) -> dict:
    """What stays the same from run to run: no addresses, times, threads or line numbers."""
    def frame(frames):
        return [os.path.basename(frames[0]["filename"]), frames[0]["name"]] if frames else None

    segments = [{"kind": s["kind"], "total_size": s["total_size"], "allocated_size": s["allocated_size"],
                 "blocks": [[b["size"], b["requested_size"], b["state"], frame(b["frames"])] for b in s["blocks"]]}
                for s in snapshot["segments"]]
    traces = [[[e["action"], e["size"], e["kind"], frame(e["frames"])] for e in d] for d in snapshot["device_traces"]]
    return {"segments": segments, "device_traces": traces}


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_the_schema_is_pytorchs(arena):
    snapshot, _ = fixed_program(arena)
    assert set(snapshot) >= {"segments", "device_traces"}
    for segment in snapshot["segments"]:
        assert set(segment) == SEGMENT_KEYS, segment
        assert sum(b["size"] for b in segment["blocks"]) == segment["total_size"], segment  # blocks tile it
        for block in segment["blocks"]:
            assert set(block) == BLOCK_KEYS and block["state"] in ("active_allocated", "active_awaiting_free", "inactive")
            assert 0 <= block["requested_size"] <= block["size"]
            assert all(set(f) == {"filename", "line", "name"} for f in block["frames"])
    for entry in snapshot["device_traces"][0]:
        assert set(entry) == TRACE_KEYS and isinstance(entry["time_us"], int)


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_the_snapshot_matches_the_recorded_expectation(arena):
    recorded = json.load(open(EXPECTATION))["arena" if arena else "mempool"]
    assert normalized(fixed_program(arena)[0]) == recorded


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_the_totals_agree_with_stats(arena):
    snapshot, s = fixed_program(arena)
    reserved = sum(seg["total_size"] for seg in snapshot["segments"])
    active = [b for seg in snapshot["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert reserved == s.pool_reserved_bytes + s.host_reserved_bytes + s.managed_reserved_bytes
    # stats() counts the scratch block (8192 bytes) as in use, the snapshot the arrays carved
    # from it (300 and 700); the managed and pinned arrays come on top.
    assert sum(b["requested_size"] for b in active) == s.bytes_in_use - 8192 + 1000 + 5000 + 3000
    kinds = {seg["kind"] for seg in snapshot["segments"]}
    assert {"scratch", "managed", "pinned"} <= kinds and ("arena slab" in kinds) == arena
    scratch = next(seg for seg in snapshot["segments"] if seg["kind"] == "scratch")
    assert [b["requested_size"] for b in scratch["blocks"] if b["state"] == "active_allocated"] == [300, 700]


def test_without_history_there_are_segments_but_no_frames_or_traces():
    p = Program(arena=True)
    try:
        kept = p.mm.memalloc(1000)
        snapshot = snapshot_of([p.mm])
        assert snapshot["device_traces"] == [[]]
        blocks = [b for seg in snapshot["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"]
        assert len(blocks) == 1 and blocks[0]["frames"] == [] and blocks[0]["requested_size"] == blocks[0]["size"] == 1024
        del kept
    finally:
        p.close()


torch_viz = pytest.importorskip("torch.cuda._memory_viz", reason="torch is not installed: PyTorch's viewer not run")


@pytest.mark.parametrize("arena", [False, True], ids=["mempool", "arena"])
def test_pytorchs_viewer_reads_the_dump(arena, tmp_path):
    snapshot, s = fixed_program(arena)
    path = tmp_path / "dump.pickle"
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    stats = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)], capture_output=True,
                           text=True, timeout=120)
    assert stats.returncode == 0, stats.stderr
    reserved = s.pool_reserved_bytes + s.host_reserved_bytes + s.managed_reserved_bytes
    assert f"total_reserved: {torch_viz.Bytes(reserved)}" in stats.stdout
    assert f"total_allocated: {torch_viz.Bytes(s.bytes_in_use - 8192 + 1000 + 8000)}" in stats.stdout
    trace = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace", str(path)], capture_output=True,
                           text=True, timeout=120)
    assert trace.returncode == 0 and "Device 0" in trace.stdout, trace.stderr
    html = tmp_path / "out.html"
    plot = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o", str(html)],
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0 and "MemoryViz.js" in html.read_text(), plot.stderr
