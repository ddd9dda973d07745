"""Snapshot files that unpickle to plain data but not to a snapshot the readers can use: the wrong
kinds of values, values out of range, nesting too deep to repr, references shared so that a tiny
file describes a huge structure. ``numba-pool-tools snapshot summarize`` and ``plot`` answer each
with one short line naming the file and the field, and exit status 2, within :data:`SECONDS` and
:data:`MEGABYTES` of memory: never a traceback, a line of megabytes or a walk that does not end.
And what PyTorch's snapshots hold that numba_pool's do not is read.  (Pickles that CPython's
unpickler itself cannot survive: test_snapshot_unpickle.py; pickles hypothesis makes:
test_snapshot_fuzz.py.)"""

from __future__ import annotations

import pickle
import re
import time
import tracemalloc

import pytest

from helpers import check_one_line_error
from numba_pool_tools.snapshot import load
from test_snapshot_cli import invoke

#: The longest error line a command may print, the longest a file may take to be read, and the most
#: memory this process may allocate reading a file that is refused.
LINE, SECONDS, MEGABYTES = 500, 2.0, 200


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


def run(tmp_path, command: str, data: bytes, traced: bool = False):
    """``numba-pool-tools snapshot COMMAND`` on a file of ``data``: the result (nothing escaped),
    the seconds it took and, when ``traced``, the most memory this process's Python allocations
    held meanwhile, in MB (tracemalloc: none of the figure's)."""
    path = tmp_path / "snap.pickle"
    path.write_bytes(data)
    extra = []
    if command == "plot":
        pytest.importorskip("matplotlib")
        pytest.importorskip("matplotlib.backends.backend_agg")  # imported before the file is read: not timed
        extra = ["-o", str(tmp_path / "out.png")]
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    try:
        result = invoke(command, str(path), *extra)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] / 1e6 if traced else None
    finally:
        tracemalloc.stop()
    return result, seconds, peak


def rejected(tmp_path, command: str, data: bytes, field: str, *words: str) -> str:
    """Assert that ``command`` refuses the file of ``data`` in one line under :data:`LINE`
    characters naming the file, ``field`` and ``words``, within :data:`SECONDS` and
    :data:`MEGABYTES`; return the line."""
    result, seconds, peak = run(tmp_path, command, data, traced=True)
    assert result.exit_code == 2, result.output[:LINE]
    assert len(result.stderr) < LINE, f"{len(result.stderr):,} characters: {result.stderr[:LINE]}"
    line = check_one_line_error(result.stderr, result.stdout, f"{tmp_path / 'snap.pickle'}: ")
    assert field in line and all(word in line for word in words), line
    assert not (tmp_path / "out.png").exists()
    assert seconds < SECONDS and peak < MEGABYTES, (seconds, peak, line)
    return line


def read(tmp_path, command: str, data: bytes):
    """The result of ``command`` on a file of ``data``, asserted to succeed."""
    result, _, _ = run(tmp_path, command, data)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_the_hand_made_snapshot_is_read(tmp_path, command):
    read(tmp_path, command, pickle.dumps(snapshot()))


# -- the wrong kinds of values ---------------------------------------------------------------------

@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_a_frame_filename_that_is_an_int(tmp_path, command):
    data = snapshot(block={"frames": [frame(filename=7)]}, events=[event(frames=[frame(filename=7)])])
    field = "segments[0].blocks[0]" if command == "summarize" else "device_traces[0][0]"
    rejected(tmp_path, command, pickle.dumps(data), f"{field}.frames[0].filename is an int (7)", "a string")


def test_a_segment_kind_that_is_a_list(tmp_path):
    rejected(tmp_path, "summarize", pickle.dumps(snapshot(segment={"kind": ["arena", "slab"]})),
             "segments[0].kind is a list (['arena', 'slab'])", "a string")


def test_an_event_action_that_is_a_list(tmp_path):
    rejected(tmp_path, "plot", pickle.dumps(snapshot(events=[event(action=["alloc"])])),
             "device_traces[0][0].action is a list (['alloc'])", "alloc, free_requested")


def test_a_list_nested_200_000_deep(tmp_path):
    depth = 200_000
    deep = b"(" * depth + b"]" + b"l" * depth  # MARK ... EMPTY_LIST, then LIST: each wraps the last in a list
    data = with_raw(snapshot(segment={"total_size": "RAW:deep"}), deep=deep)
    line = rejected(tmp_path, "summarize", data, "segments[0].total_size is a list ([[...]])", "whole number")
    assert "RecursionError" not in line


def shared_lists(doublings: int) -> list:
    """A list of two references to a list of two references to ... an empty list: 2**doublings
    empty lists to a walk or a repr, ``doublings + 1`` lists in memory and a few bytes each in a pickle."""
    shared: list = []
    for _ in range(doublings):
        shared = [shared, shared]
    return shared


@pytest.mark.parametrize("doublings", [24, 40])
def test_ten_million_shared_empty_lists_in_a_tiny_file(tmp_path, doublings):
    """The issue's 242-byte file (16 million empty lists; a one-line error of 42 million characters),
    and one of a trillion, each where the check reads it and where it never goes."""
    bomb = shared_lists(doublings)
    data = pickle.dumps({"segments": [{"device": 0, "total_size": bomb, "blocks": []}]})
    assert len(data) < 350
    rejected(tmp_path, "summarize", data, "segments[0].total_size is a list ([[...], [...]])")
    data = pickle.dumps(snapshot(segment={"blocks": bomb}))
    rejected(tmp_path, "summarize", data, "segments[0].blocks[0] is a list ([[...], [...]]), not a dict")
    data = pickle.dumps({**snapshot(), "unread": bomb})  # a key nothing reads: never walked
    read(tmp_path, "summarize", data)


def test_shared_blocks_and_frames_stop_at_the_bound_on_values(tmp_path):
    """A thousand references to a segment of a thousand references to a block of a thousand
    references to a frame: a few kilobytes, a billion frames to read. The bound counts each
    reference, and a list read once is not read again to count it, so the check stops at once."""
    block = {"size": 8, "requested_size": 8, "state": "active_allocated", "frames": [frame()] * 1000}
    segment = {"device": 0, "total_size": 8_000, "blocks": [block] * 1000}
    data = pickle.dumps({"segments": [segment] * 1000})
    assert len(data) < 10_000
    rejected(tmp_path, "summarize", data, f"more than {load.value_budget(len(data)):,} values to read, the most "
                                          "for a file of its size", "stopped at segments[")


def test_the_bound_on_values_grows_with_the_file(tmp_path):
    """Sixty segments of a thousand references to one block of four frames, 1.26 million values
    to read: refused from a file of 3 kB, where the segments are one shared sixty times; read from
    one of 120 kB, where they are sixty segments (the file's thousand references each)."""
    block = {"size": 8, "requested_size": 8, "state": "active_allocated", "frames": [frame(line=k) for k in range(4)]}
    segments = [{"device": 0, "total_size": 8_000, "blocks": [block] * 1000} for _ in range(60)]
    data = pickle.dumps({"segments": segments[:1] * 60})
    assert len(data) < 3_000 and load.value_budget(len(data)) == load.MIN_VALUES
    rejected(tmp_path, "summarize", data, "more than 1,000,000 values to read")
    data = pickle.dumps({"segments": segments})
    assert 100_000 < len(data) < 200_000 and load.value_budget(len(data)) > 25_000_000
    result = read(tmp_path, "summarize", data)
    assert re.search(r"^/user/train.py:0 +468\.75 KiB \(480000 bytes\) +60,000$", result.stdout, re.M), result.stdout


# -- values out of range ---------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_a_negative_size(tmp_path, command):
    data = snapshot(block={"size": -1024}, events=[event(size=-1024)])
    field = "segments[0].blocks[0].size" if command == "summarize" else "device_traces[0][0].size"
    rejected(tmp_path, command, pickle.dumps(data), f"{field} is an int (-1024)", "whole number from 0")


def test_an_unknown_block_state(tmp_path):
    rejected(tmp_path, "summarize", pickle.dumps(snapshot(block={"state": "leaked"})),
             "segments[0].blocks[0].state is a str ('leaked')", "active_allocated")


def test_an_unknown_action(tmp_path):
    rejected(tmp_path, "plot", pickle.dumps(snapshot(events=[event(), event(action="malloc", time_us=20)])),
             "device_traces[0][1].action is a str ('malloc')", "alloc, free_requested")


def test_a_file_over_the_size_bound_is_not_unpickled(tmp_path, monkeypatch):
    monkeypatch.setattr(load, "MAX_FILE_BYTES", 100)
    rejected(tmp_path, "summarize", pickle.dumps(snapshot()), "bytes, more than the 100 bytes")


def test_pytorchs_names_are_read(tmp_path):
    """PyTorch's snapshots name a block released but not reusable ``active_pending_free`` (its
    documentation, and numba_pool, ``active_awaiting_free``), and have more actions."""
    events = [event(), *(event(action, time_us=20 + k) for k, action in enumerate(load.ACTIONS))]
    data = pickle.dumps(snapshot(block={"state": "active_pending_free"}, events=events))
    result = read(tmp_path, "summarize", data)
    assert re.search(r"^awaiting free \(released, not yet reusable\) +1 KiB \(1024 bytes\), 50.0%$", result.stdout, re.M)
    read(tmp_path, "plot", data)


def pytorchs_snapshot() -> dict:
    """A snapshot as PyTorch 2.x's ``torch.cuda.memory._snapshot()`` writes one (torch/csrc/cuda/memory_snapshot.cpp):
    keys numba_pool does not write, an ``oom`` event with ``device_free`` in place of ``addr``, and events
    recorded without a stack, which have no ``frames`` (nor has the last block: PyTorch gives its blocks
    empty ones, other writers may not)."""
    segment = {"device": 0, "address": 4096, "total_size": 2048, "allocated_size": 1024, "active_size": 1024,
               "requested_size": 1000, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
               "is_expandable": False, "frames": [frame()],
               "blocks": [{"address": 4096, "size": 1024, "requested_size": 1000, "state": "active_allocated",
                           "frames": [frame()]},
                          {"address": 5120, "size": 512, "requested_size": 0, "state": "inactive", "frames": []},
                          {"address": 5632, "size": 512, "requested_size": 500, "state": "active_allocated"}]}
    extra = {"compile_context": "N/A", "user_metadata": "", "pool_id": (0, 0)}
    no_stack = {key: value for key, value in event(time_us=30, addr=8192).items() if key != "frames"}
    events = [dict(event("segment_alloc", size=2048, time_us=5), **extra), dict(event(), **extra), no_stack,
              {"action": "oom", "device_free": 1 << 20, "size": 1 << 40, "stream": 0, "time_us": 40, **extra},
              dict(event("snapshot", size=0, time_us=50, addr=0), **extra)]
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": True,
                "roundup_power2_divisions": {"1": 0, "2": 0}}
    return {"segments": [segment], "device_traces": [events], "allocator_settings": settings}


def test_pytorchs_own_snapshot_is_read(tmp_path):
    data = pickle.dumps(pytorchs_snapshot())
    result = read(tmp_path, "summarize", data)
    assert re.search(r"^/user/train.py:12 +1000 bytes +1$", result.stdout, re.M), result.stdout
    assert re.search(r"^<no stack> +500 bytes +1$", result.stdout, re.M), result.stdout
    read(tmp_path, "plot", data)
    from numba_pool_tools.snapshot.timeline import timelines

    (line,) = timelines(load.load(str(tmp_path / "snap.pickle"), need=("device_traces",))["device_traces"], top=5)
    assert line.allocations == 2 and line.sites == ["/user/train.py:12", "<no stack>"]
    assert line.marks == [(35e-6, "oom")] and line.held[-1] == [1000, 1000]


#: numba_pool's keys and PyTorch's summary keys, checked when present: (what is changed, the command
#: that reads it, what the line names).
EXTRA = {
    "segment_type": (dict(segment={"segment_type": ["large"]}), "summarize", "segments[0].segment_type is a list"),
    "allocated_size": (dict(segment={"allocated_size": -1}), "summarize", "segments[0].allocated_size is an int (-1)"),
    "segment_pool_id": (dict(segment={"segment_pool_id": "(0, 0)"}), "summarize",
                        "segments[0].segment_pool_id is a str ('(0, 0)'), not a pair of whole numbers"),
    "event kind": (dict(events=[event(kind=["device"])]), "plot", "device_traces[0][0].kind is a list (['device'])"),
    "thread": (dict(events=[event(thread=-5)]), "plot", "device_traces[0][0].thread is an int (-5)"),
    "device_free": (dict(events=[event("oom", device_free="lots")]), "plot",
                    "device_traces[0][0].device_free is a str"),
}


@pytest.mark.parametrize("case", EXTRA)
def test_the_keys_numba_pool_adds_are_checked_when_present(tmp_path, case):
    changes, command, field = EXTRA[case]
    rejected(tmp_path, command, pickle.dumps(snapshot(**changes)), field)


@pytest.mark.parametrize("command", ["summarize", "plot"])
def test_allocator_settings_that_are_no_dict(tmp_path, command):
    rejected(tmp_path, command, pickle.dumps({**snapshot(), "allocator_settings": ["numba_pool"]}),
             "allocator_settings is a list (['numba_pool']), not a dict")


def test_a_file_name_longer_than_any_path(tmp_path):
    longest = "/" + "a" * (load.MAX_NAME - 1)
    read(tmp_path, "summarize", pickle.dumps(snapshot(block={"frames": [frame(filename=longest)]})))
    rejected(tmp_path, "summarize", pickle.dumps(snapshot(block={"frames": [frame(filename=longest + "a")]})),
             "segments[0].blocks[0].frames[0].filename is a str ('/aaaa", "not a string of at most 4,096 characters")


def test_the_plots_labels_leave_out_the_middle_of_a_long_site():
    from numba_pool_tools.snapshot.plot import LABEL_CHARS, _short

    site = "/u/" + "a" * 5000 + "train.py:12"
    assert _short(site, [site]) == "a" * 17 + "..." + "a" * 29 + "train.py:12" and LABEL_CHARS == 60
    assert _short("/u/train.py:12", ["/u/train.py:12", "/v/train.py:12"]) == "/u/train.py:12"


def test_a_device_is_read_up_to_the_bound_on_file_size(tmp_path, monkeypatch):
    """A pipe or a device has no size to check before reading: reading stops at the bound."""
    monkeypatch.setattr(load, "MAX_FILE_BYTES", 1 << 20)
    result = invoke("summarize", "/dev/zero")
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout,
                         "/dev/zero: more than the 1,048,576 bytes a snapshot is read up to")


def schema_values(spec=None) -> list:
    """Every :class:`load.Value` of the schema, and the words of each list and record."""
    found, specs = [], list(load.SCHEMA.values()) if spec is None else [spec]
    while specs:
        spec = specs.pop()
        if isinstance(spec, load.ListOf):
            specs.append(spec.item)
            found.append(load.Value("a list", None))
        elif isinstance(spec, load.Record):
            specs.extend(spec.fields.values())
            found.append(load.Value("a dict", None))
        else:
            found.append(spec)
    return found


def test_every_error_line_is_at_most_300_characters_besides_the_files_name():
    """The longest place the schema has, with seven- and eight-digit indices, holding values whose words
    are long, against every field's expected words (the longest of them are a shorter place's)."""
    place = ((((("device_traces", 63), 12_345_678), "frames"), 1_234_567), "filename")
    nasty = [["x" * 1000] * 1000, {("k" * 500,): "v" * 500}, 10**400, -(2**200), b"\xff" * 1000, "é" * 10_000,
             frozenset(range(100)), shared_lists(30), float("nan"), (1, 2, 3) * 100]
    lines = [load._wrong(place, value, spec.words) for value in nasty for spec in schema_values()]
    lines += [load._walk([[]] * 65, load.SCHEMA["device_traces"], "device_traces", 100),
              load._walk(shared_lists(30), load.ListOf(load.ListOf(load.ListOf(None))), "segments", 1000)]
    assert max(len(line) for line in lines) <= 300, max(lines, key=len)
