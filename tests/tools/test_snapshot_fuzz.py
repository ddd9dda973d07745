"""``numba-pool-tools snapshot summarize`` and ``plot`` on files hypothesis makes: plain data of any
shape, or of a snapshot's shape with values of any kind, pickled with any protocol; valid snapshots with fields replaced or removed; and a valid
snapshot's pickle with bytes changed, inserted or cut.  Each is read or refused in one line under
:data:`LINE` characters, with exit status 0 or 2, nothing escaping, within :data:`SECONDS`.

Every file is unpickled first in a forked child (:mod:`numba_pool_tools.snapshot.unpickle`), about
10 to 25 ms here, so each example runs one of the two commands, drawn, and the counts are modest:
the three tests take about 10 s here."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_snapshot_cli import make_dump
from test_snapshot_files import LINE, SECONDS, run, snapshot

#: Values the checks treat specially, mixed in with arbitrary ones.
EDGES = st.sampled_from([-1, 0, 2**63, 2**64, 10**400, True, float("nan"), float("inf"), "", "alloc", "oom",
                         "inactive", "active_pending_free", "segments", "device_traces", "frames", b"x", (), {},
                         "a" * 5000])
#: A snapshot's own keys, so that arbitrary dicts reach the checks below the top level.
KEYS = st.sampled_from(sorted({"segments", "device_traces", "device", "total_size", "blocks", "kind", "stream",
                               "address", "size", "requested_size", "state", "frames", "filename", "line",
                               "name", "action", "addr", "time_us", "thread", "device_free", "segment_type",
                               "segment_pool_id", "allocator_settings"}))
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | EDGES
#: Keys of any kind a dict can have: a tuple too (hashed while unpickling).
ANY_KEY = KEYS | st.text(max_size=3) | st.integers() | st.tuples(st.integers(), st.text(max_size=2))
PLAIN = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                     | st.dictionaries(ANY_KEY, inner, max_size=5),
                     max_leaves=40)
def mostly(right: st.SearchStrategy) -> st.SearchStrategy:
    """What ``right`` draws, three times in four; else anything :data:`PLAIN` draws."""
    return st.one_of(right, right, right, PLAIN)


NUMBER = mostly(st.integers(0, 1 << 20))
FRAMES = mostly(st.lists(st.fixed_dictionaries({"filename": mostly(st.sampled_from(["/u/train.py", "<string>"])),
                                                "line": NUMBER}, optional={"name": mostly(st.just("step"))}),
                         max_size=2))
BLOCKS = mostly(st.lists(st.fixed_dictionaries(
    {"size": NUMBER, "requested_size": NUMBER, "frames": FRAMES,
     "state": mostly(st.sampled_from(["active_allocated", "active_awaiting_free", "inactive"]))},
    optional={"address": NUMBER}), max_size=2))
SEGMENTS = mostly(st.lists(st.fixed_dictionaries(
    {"device": mostly(st.integers(0, 3)), "total_size": NUMBER, "blocks": BLOCKS},
    optional={"kind": mostly(st.just("arena slab")), "stream": NUMBER, "segment_type": mostly(st.just("large"))}),
    max_size=2))
EVENTS = mostly(st.lists(st.fixed_dictionaries(
    {"action": mostly(st.sampled_from(["alloc", "free_requested", "free_completed", "oom"])), "addr": NUMBER,
     "size": NUMBER, "time_us": NUMBER, "frames": FRAMES},
    optional={"kind": mostly(st.just("device")), "thread": NUMBER, "device_free": NUMBER, "stream": NUMBER}),
    max_size=3))
#: Snapshot-shaped data whose fields hold the right kind of value three times in four: a wrong one deep
#: inside, where hypothesis rarely gets from :data:`PLAIN` alone.
SHAPED = st.fixed_dictionaries({"segments": SEGMENTS, "device_traces": mostly(st.lists(EVENTS, max_size=2))},
                               optional={"allocator_settings": mostly(st.just({"allocator": "numba_pool"}))})
COMMANDS = st.sampled_from(["summarize", "plot"])


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


def edited(draw, data: bytes) -> bytes:
    """``data`` with one to four bytes changed, inserted or removed, or its end cut."""
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["change", "insert", "remove", "cut"]))
        byte = bytes([draw(st.integers(0, 255))])
        data = {"change": data[:at] + byte + data[at + 1:], "insert": data[:at] + byte + data[at:],
                "remove": data[:at] + data[at + 1:], "cut": data[:at]}[edit]
    return data


def read_or_refused(tmp_path, command: str, data: bytes) -> None:
    """``command`` on a file of ``data``: exit status 0 or 2, nothing escaping, an error in one short
    line, within :data:`SECONDS`."""
    result, seconds, _ = run(tmp_path, command, data)
    assert result.exit_code in (0, 2), result.output[:LINE]
    assert seconds < SECONDS, (command, seconds)
    if result.exit_code == 2:
        assert "Traceback" not in result.output and len(result.stderr) < LINE, result.stderr[:LINE]
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


#: No deadline (:func:`read_or_refused` times each command itself), and a fixture per test, not per example.
FUZZ = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(max_examples=120, **FUZZ)
@given(data=PLAIN | SHAPED, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), command=COMMANDS)
def test_any_plain_data_is_read_or_refused_in_one_line(tmp_path, data, protocol, command):
    read_or_refused(tmp_path, command, pickle.dumps(data, protocol=protocol))


@settings(max_examples=30, **FUZZ)
@given(draw=st.data(), command=COMMANDS)
def test_a_valid_snapshot_with_fields_replaced_is_read_or_refused_in_one_line(tmp_path, dumped, draw, command):
    read_or_refused(tmp_path, command, pickle.dumps(mutated(draw.draw, dumped)))


@settings(max_examples=60, **FUZZ)
@given(draw=st.data(), protocol=st.sampled_from([0, 2, pickle.HIGHEST_PROTOCOL]), command=COMMANDS)
def test_a_valid_snapshots_pickle_with_bytes_changed_is_read_or_refused_in_one_line(tmp_path, draw, protocol, command):
    read_or_refused(tmp_path, command, edited(draw.draw, pickle.dumps(snapshot(), protocol=protocol)))
