"""Snapshot files that unpickle to plain data but not to a snapshot the readers can use: the wrong
kinds of values, values out of range, nesting too deep to repr, references shared so that a tiny
file describes a huge structure. ``numba-pool-tools snapshot summarize`` and ``plot`` answer each
with one short line naming the file and the field, and exit status 2: never a traceback, a line of
megabytes or a walk that does not end.  Then the same promise for pickles hypothesis makes: plain
data of any shape, and valid snapshots with fields replaced or removed."""

from __future__ import annotations

import copy
import pickle
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import check_one_line_error
from numba_pool_tools.snapshot import load
from test_snapshot_cli import invoke, make_dump

#: The longest error line a command may print, and the longest a file may take to be read.
LINE, SECONDS = 500, 2.0


def frame(filename="/user/train.py", line=12) -> dict:
    return {"filename": filename, "line": line, "name": "step"}


def event(action="alloc", size=1000, time_us=10, **fields) -> dict:
    return {"action": action, "addr": 4096, "size": size, "stream": 0, "time_us": time_us, "frames": [frame()],
            **fields}


def snapshot(block: dict | None = None, segment: dict | None = None, events: list | None = None) -> dict:
    """A valid snapshot of one segment of two blocks and the events of one device, with the
    fields in ``block`` (the first block's), ``segment`` and ``events`` changed."""
    blocks = [{"address": 4096, "size": 1024, "requested_size": 1000, "state": "active_allocated",
               "frames": [frame()], **(block or {})},
              {"address": 5120, "size": 1024, "requested_size": 0, "state": "inactive", "frames": []}]
    return {"segments": [{"device": 0, "address": 4096, "total_size": 2048, "stream": 0, "kind": "arena slab",
                          "blocks": blocks, **(segment or {})}],
            "device_traces": [events if events is not None else
                              [event(), event("free_requested", time_us=20), event("free_completed", time_us=30)]]}


def with_raw(data: dict, **raw: bytes) -> bytes:
    """``data`` pickled, each string value ``"RAW:name"`` replaced by the pickle opcodes
    ``raw[name]``: a value too deep for the pickler itself to write."""
    pickled = pickle.dumps(data, protocol=2)  # no frames (protocol 4's), so bytes can be spliced in
    for name, ops in raw.items():
        text = f"RAW:{name}".encode()
        marker = b"X" + len(text).to_bytes(4, "little") + text  # BINUNICODE
        assert pickled.count(marker) == 1
        pickled = pickled.replace(marker, ops)
    return pickled


def run(tmp_path, command: str, data: bytes):
    """``numba-pool-tools snapshot COMMAND`` on a file of ``data``: the result (nothing escaped)
    and the seconds it took."""
    path = tmp_path / "snap.pickle"
    path.write_bytes(data)
    extra = []
    if command == "plot":
        pytest.importorskip("matplotlib")
        extra = ["-o", str(tmp_path / "out.png")]
    start = time.perf_counter()
    result = invoke(command, str(path), *extra)
    return result, time.perf_counter() - start


def rejected(tmp_path, command: str, data: bytes, field: str, *words: str) -> str:
    """Assert that ``command`` refuses the file of ``data`` in one line under :data:`LINE`
    characters naming the file, ``field`` and ``words``; return the line."""
    result, _ = run(tmp_path, command, data)
    assert result.exit_code == 2, result.output[:LINE]
    assert len(result.stderr) < LINE, f"{len(result.stderr):,} characters: {result.stderr[:LINE]}"
    line = check_one_line_error(result.stderr, result.stdout, f"{tmp_path / 'snap.pickle'}: ")
    assert field in line and all(word in line for word in words), line
    assert not (tmp_path / "out.png").exists()
    return line


@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_the_hand_made_snapshot_is_read(tmp_path, command):
    result, _ = run(tmp_path, command, pickle.dumps(snapshot()))
    assert result.exit_code == 0, result.output


# -- the wrong kinds of values ---------------------------------------------------------------------

@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_a_frame_filename_that_is_an_int(tmp_path, command):
    data = snapshot(block={"frames": [frame(filename=7)]}, events=[event(frames=[frame(filename=7)])])
    field = "segments[0]['blocks'][0]" if command == "summarize" else "device_traces[0][0]"
    rejected(tmp_path, command, pickle.dumps(data), f"{field}['frames'][0]['filename'] is an int (7)", "a string")


def test_a_segment_kind_that_is_a_list(tmp_path):
    rejected(tmp_path, "summarize", pickle.dumps(snapshot(segment={"kind": ["arena", "slab"]})),
             "segments[0]['kind'] is a list (['arena', 'slab'])", "a string")


def test_an_event_action_that_is_a_list(tmp_path):
    rejected(tmp_path, "plot", pickle.dumps(snapshot(events=[event(action=["alloc"])])),
             "device_traces[0][0]['action'] is a list (['alloc'])", "alloc, free_requested")


def test_a_list_nested_200_000_deep(tmp_path):
    depth = 200_000
    deep = b"(" * depth + b"]" + b"l" * depth  # MARK ... EMPTY_LIST, then LIST: each wraps the last in a list
    data = with_raw(snapshot(segment={"total_size": "RAW:deep"}), deep=deep)
    line = rejected(tmp_path, "summarize", data, "segments[0]['total_size'] is a list ([[...]])", "whole number")
    assert "RecursionError" not in line


def test_ten_million_shared_empty_lists_in_a_tiny_file(tmp_path):
    shared: list = []
    for _ in range(23):  # 2**23 empty lists, and as many lists above them, all shared: a repr of tens of megabytes
        shared = [shared, shared]
    data = pickle.dumps({"segments": [{"device": 0, "total_size": shared, "blocks": []}]})
    assert len(data) < 300
    rejected(tmp_path, "summarize", data, "segments[0]['total_size'] is a list ([[...], [...]])")


def test_shared_blocks_and_frames_stop_at_the_bound_on_values(tmp_path):
    """A thousand references to a segment of a thousand references to a block of a thousand
    references to a frame: a few kilobytes, a billion frames to read. The bound counts each
    reference, and a list read once is not read again to count it, so the check stops at once."""
    block = {"size": 8, "requested_size": 8, "state": "active_allocated", "frames": [frame()] * 1000}
    segment = {"device": 0, "total_size": 8_000, "blocks": [block] * 1000}
    data = pickle.dumps({"segments": [segment] * 1000})
    assert len(data) < 10_000
    start = time.perf_counter()
    rejected(tmp_path, "summarize", data, f"more than {load.MAX_VALUES:,} values", "stopped at segments[")
    assert time.perf_counter() - start < SECONDS


# -- values out of range ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_a_negative_size(tmp_path, command):
    data = snapshot(block={"size": -1024}, events=[event(size=-1024)])
    field = "segments[0]['blocks'][0]['size']" if command == "summarize" else "device_traces[0][0]['size']"
    rejected(tmp_path, command, pickle.dumps(data), f"{field} is an int (-1024)", "whole number from 0")


def test_an_unknown_block_state(tmp_path):
    rejected(tmp_path, "summarize", pickle.dumps(snapshot(block={"state": "leaked"})),
             "segments[0]['blocks'][0]['state'] is a str ('leaked')", "active_allocated")


def test_an_unknown_action(tmp_path):
    rejected(tmp_path, "plot", pickle.dumps(snapshot(events=[event(), event(action="malloc", time_us=20)])),
             "device_traces[0][1]['action'] is a str ('malloc')", "alloc, free_requested")


def test_a_file_over_the_size_bound_is_not_unpickled(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "MAX_FILE_BYTES", 100)
    rejected(tmp_path, "summarize", pickle.dumps(snapshot()), "bytes, more than the 100 bytes")


def test_pytorchs_names_are_read(tmp_path):
    """PyTorch's snapshots name a block released but not reusable ``active_pending_free`` (its
    documentation, and numba_pool, ``active_awaiting_free``), and have more actions."""
    events = [event(), *(event(action, time_us=20 + k) for k, action in enumerate(load.ACTIONS))]
    data = pickle.dumps(snapshot(block={"state": "active_pending_free"}, events=events))
    result, _ = run(tmp_path, "summarize", data)
    assert result.exit_code == 0, result.output
    assert re.search(r"^awaiting free \(released, not yet reusable\) +1 KiB \(1024 bytes\), 50.0%$", result.stdout, re.M)
    result, _ = run(tmp_path, "plot", data)
    assert result.exit_code == 0, result.output


# -- any pickle of plain data ----------------------------------------------------------------------

#: Values the checks treat specially, mixed in with arbitrary ones.
EDGES = st.sampled_from([-1, 0, 2**63, 2**64, 10**400, True, float("nan"), float("inf"), "", "alloc", "oom",
                         "inactive", "active_pending_free", "segments", "device_traces", "frames", b"x", (), {}])
#: A snapshot's own keys, so that arbitrary dicts reach the checks below the top level.
KEYS = st.sampled_from(sorted({"segments", "device_traces", "device", "total_size", "blocks", "kind", "stream",
                               "address", "size", "requested_size", "state", "frames", "filename", "line",
                               "name", "action", "addr", "time_us"}))
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | EDGES
PLAIN = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                     | st.dictionaries(KEYS | st.text(max_size=3) | st.integers(), inner, max_size=5),
                     max_leaves=40)


class Valid(dict):
    """A valid snapshot, made as test_snapshot_cli makes its own (shown by name, not whole, in
    hypothesis's reports)."""

    def __repr__(self) -> str:
        return "<the valid snapshot>"


@pytest.fixture(scope="module")
def dumped(tmp_path_factory) -> Valid:
    return Valid(make_dump(str(tmp_path_factory.mktemp("valid") / "snapshot.pickle")))


def places(value, at=()) -> list[tuple]:
    """Every place in ``value`` (a snapshot: our own data, shallow), as a path of keys."""
    found = [at] if at else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found += places(item, (*at, key))
    return found


def mutated(draw, valid: dict) -> dict:
    """``valid`` with one to three of its places given an arbitrary value, or removed."""
    data = copy.deepcopy(dict(valid))
    for _ in range(draw(st.integers(1, 3))):
        spots = places(data)
        if not spots:
            break
        *parents, last = draw(st.sampled_from(spots))
        parent = data
        for key in parents:
            parent = parent[key]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[last]
        else:
            parent[last] = draw(PLAIN)
    return data


def read_both(tmp_path, data) -> None:
    """Both commands on ``data`` pickled: exit status 0 or 2, nothing escaping, an error in one
    short line, each within :data:`SECONDS`."""
    for command in ("summarize", "plot"):
        result, seconds = run(tmp_path, command, pickle.dumps(data))
        assert result.exit_code in (0, 2), result.output[:LINE]
        assert seconds < SECONDS, (command, seconds)
        if result.exit_code == 2:
            assert "Traceback" not in result.output and len(result.stderr) < LINE, result.stderr[:LINE]
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr


#: Settings of both: no deadline (:func:`read_both` times each command itself); fewer examples of
#: a changed valid snapshot, as most of them are plotted.
FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(max_examples=300, **FUZZ)
@given(data=PLAIN)
def test_any_plain_data_is_read_or_refused_in_one_line(tmp_path, data):
    read_both(tmp_path, data)


@settings(max_examples=60, **FUZZ)
@given(draw=st.data())
def test_a_valid_snapshot_with_fields_replaced_is_read_or_refused_in_one_line(tmp_path, dumped, draw):
    read_both(tmp_path, mutated(draw.draw, dumped))
