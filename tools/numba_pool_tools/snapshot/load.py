"""Reading a snapshot file for ``numba-pool-tools snapshot``: one line naming the file for each way it
can be wrong (unreadable, too large, not a pickle, not a snapshot: which field, what it holds and
what it should hold).

Only plain data is unpickled (dicts, lists, tuples, strings, numbers, None): a snapshot holds
nothing else, and a pickle naming a class, which could run code when loaded, is refused.  Then
every field the commands read is checked against :data:`SCHEMA`, the schema
:mod:`numba_pool.observe.snapshot` writes and PyTorch's ``torch.cuda.memory._snapshot()`` has:
each one's kind (a whole number, not a bool; a string; a list; a dict), sizes, addresses and times
from 0 to :data:`LARGEST`, device ordinals below :data:`MAX_DEVICES`, block states and event actions
among the known ones (:data:`STATES`, :data:`ACTIONS`).  The commands then meet
only values they can use, so a bad file is an error line here rather than a traceback or a
wrong table later.  Keys the commands do not read are not looked at (PyTorch's snapshots have
more).

A pickle can share references, so a file of a few hundred bytes can hold a list of two
references to a list of two references to ... : millions of values, and a repr of gigabytes.
So the check walks with a stack of its own (never Python's recursion), only as deep as the
schema goes (a frame in the frames of an event in a device's list of ``device_traces``: a value
nested deeper is never walked); it counts every value it reads, a shared one each time, and
stops at :data:`MAX_VALUES`; and an error shows a value by its type and a repr of at most
:data:`SHOWN` characters, made from its first few items only.  The unpickling itself is CPython's
and not bounded here beyond :data:`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import os
import pickle
from itertools import count, islice, repeat
from typing import Callable, Mapping, NamedTuple

from numba_pool.cli.errors import Failure
from numba_pool.observe import snapshot as _snapshot

#: The largest file read, far above any snapshot's: a larger one is refused in one line, before
#: it is unpickled into memory several times its size.
MAX_FILE_BYTES = 2 << 30
#: The most values one check reads, shared ones counted each time they are read: the commands
#: read them again just as often, so this bounds their time too; far above a real snapshot's
#: (100,000 events of 50 frames each are about 20 million), reached at once by a shared-reference bomb.
MAX_VALUES = 50_000_000
#: The largest size, address, stream, line or time: CUDA's and PyTorch's are 64-bit, and a larger
#: number would not fit the float the figure converts it to.
LARGEST = 2**64 - 1
#: Device ordinals are below this (and ``device_traces`` has at most this many lists): more GPUs
#: than one process sees, and one table column or one figure panel each, which must stay drawable.
MAX_DEVICES = 64
#: The most characters of a value an error line shows (the line stays under 500 with its file).
SHOWN = 80
#: Block states: numba_pool's, and PyTorch's, whose snapshots say ``active_pending_free`` for what
#: its documentation (and numba_pool) calls ``active_awaiting_free``.
STATES = (*_snapshot.STATES.values(), "active_pending_free")
#: Event actions: numba_pool's history's, then those PyTorch's snapshots add.
ACTIONS = ("alloc", "free_requested", "free_completed", "oom", "trim", "reset",
           "segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot", "user_defined")
NOT_A_SNAPSHOT = "not a memory snapshot (numba_pool.dump_snapshot's or PyTorch's)"


class Value(NamedTuple):
    """A field that holds one value: what it should be, in words, and the test of it."""

    words: str
    ok: Callable[[object], bool]


class ListOf(NamedTuple):
    """A field that holds a list of ``item``, of at most ``most`` of them (named ``unit``) when given."""

    item: object
    most: int | None = None
    unit: str = "items"


class Record(NamedTuple):
    """A field that holds a dict with the keys of ``fields`` (key -> what it holds), but maybe
    not those in ``optional``."""

    fields: Mapping[str, Value | ListOf]
    optional: frozenset = frozenset()


COUNT = Value("a whole number from 0 to 2**64 - 1", lambda v: type(v) is int and 0 <= v <= LARGEST)
DEVICE = Value(f"a device ordinal from 0 to {MAX_DEVICES - 1}", lambda v: type(v) is int and 0 <= v < MAX_DEVICES)
TEXT = Value("a string", lambda v: type(v) is str)
STATE = Value(f"a block state ({', '.join(STATES)})", lambda v: type(v) is str and v in STATES)
ACTION = Value(f"an event action ({', '.join(ACTIONS)})", lambda v: type(v) is str and v in ACTIONS)

FRAME = Record({"filename": TEXT, "line": COUNT, "name": TEXT}, frozenset({"name"}))
BLOCK = Record({"address": COUNT, "size": COUNT, "requested_size": COUNT, "state": STATE, "frames": ListOf(FRAME)},
               frozenset({"address"}))
SEGMENT = Record({"device": DEVICE, "address": COUNT, "total_size": COUNT, "stream": COUNT, "kind": TEXT,
                  "blocks": ListOf(BLOCK)}, frozenset({"address", "stream", "kind"}))
EVENT = Record({"action": ACTION, "addr": COUNT, "size": COUNT, "stream": COUNT, "time_us": COUNT,
                "frames": ListOf(FRAME)}, frozenset({"stream"}))
#: The snapshot's keys the commands read (``summarize`` the segments, ``plot`` the events), and what
#: each holds, down to the last field read.
SCHEMA = {"segments": ListOf(SEGMENT), "device_traces": ListOf(ListOf(EVENT), MAX_DEVICES, "lists (one per device)")}


class NotPlainData(pickle.UnpicklingError):
    """The pickle names a class or a function."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise NotPlainData(f"it names {module}.{name}, and only plain data (dicts, lists, strings, numbers) is read")


def load(path: str, need: tuple[str, ...] = ("segments",)) -> dict:
    """The snapshot in ``path``, checked to have the keys ``need`` (``segments``,
    ``device_traces``) and, in each, every field the commands read as :data:`SCHEMA` says.

    :raises Failure: naming the file: it cannot be read, is larger than :data:`MAX_FILE_BYTES`,
        is not a pickle, or is not a snapshot (which field, what it holds and what it should), or
        holds more than :data:`MAX_VALUES` values to read.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise Failure(f"{path}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} bytes a snapshot is read up to")
            snapshot = _PlainData(f).load()
    except OSError as err:
        raise Failure(f"{path}: cannot read it ({err.strerror or err})") from None
    except EOFError:
        raise Failure(f"{path}: not a pickle (the file is empty or cut short)") from None
    except NotPlainData as err:
        raise Failure(f"{path}: not a snapshot: {err}") from None
    except Failure:  # the size's
        raise
    except Exception as err:  # noqa: BLE001  (pickle raises many kinds on a file that is not one)
        raise Failure(f"{path}: not a pickle ({type(err).__name__}: {_cut(str(err))})") from None
    problem = _problem(snapshot, need)
    if problem:
        raise Failure(f"{path}: {problem}")
    return snapshot


def _problem(snapshot, need: tuple[str, ...]) -> str | None:
    """What makes ``snapshot`` no snapshot the commands can read, in words, or None."""
    if type(snapshot) is not dict:
        return f"{NOT_A_SNAPSHOT}: the pickle holds {_described(snapshot)}, not a dict"
    for key in need:
        if key not in snapshot:
            keys = ", ".join(_shown(k, SHOWN // 4) for k in islice(snapshot, 6)) or "none"
            return f"{NOT_A_SNAPSHOT}: no {key!r} key (its keys: {keys}{', ...' if len(snapshot) > 6 else ''})"
    for key in need:
        problem = _walk(snapshot[key], SCHEMA[key], key)
        if problem:
            return problem
    return None


def _walk(value, spec, name: str) -> str | None:
    """What is wrong in ``value``, the snapshot's key ``name``, against ``spec``, or None.

    Depth first, in the file's order, with a stack of iterators (one per list being read, and
    one per list field of a dict: as deep as the schema); a dict's other fields are checked as
    it is read. A list read before against the same spec (a shared reference) is not read again,
    but its count of values is taken from the budget again, as the commands will read them again.
    A place is ``(parent's place, key or index)``, spelled out only for an error."""
    left = MAX_VALUES
    counted: dict[tuple[int, int], int] = {}  # (id of a list, id of its spec) -> the values in it, once read
    stack = [(iter([(value, spec, name)]), None, left)]  # (iterator, its list's key in counted, left when pushed)
    while stack:
        items, read, left_then = stack[-1]
        step = next(items, None)
        if step is None:
            stack.pop()
            if read is not None:
                counted[read] = left_then - left
            continue
        value, spec, place = step
        read = (id(value), id(spec)) if type(spec) is ListOf else None
        left -= 1 + counted.get(read, 0)
        if left < 0:
            return (f"more than {MAX_VALUES:,} values to read (a reference shared n times is read n times): "
                    f"stopped at {_spelled(place)}")
        if read is not None:
            if read in counted:
                continue
            if type(value) is not list:
                return _wrong(place, value, "a list")
            if spec.most is not None and len(value) > spec.most:
                return f"{NOT_A_SNAPSHOT}: {_spelled(place)} has {len(value):,} {spec.unit}, more than {spec.most:,}"
            stack.append((zip(value, repeat(spec.item), zip(repeat(place), count())), read, left))  # (item, spec, place)
            continue
        if type(value) is not dict:
            return _wrong(place, value, "a dict")
        for key, field in spec.fields.items():
            if key not in value:
                if key in spec.optional:
                    continue
                return f"{NOT_A_SNAPSHOT}: {_spelled(place)} has no {key!r} key"
            item = value[key]
            if type(field) is ListOf:
                stack.append((iter([(item, field, (place, key))]), None, left))
                continue
            left -= 1
            if not field.ok(item):
                return _wrong((place, key), item, field.words)
    return None


def _wrong(place, value, expected: str) -> str:
    return f"{NOT_A_SNAPSHOT}: {_spelled(place)} is {_described(value)}, not {expected}"


def _spelled(place) -> str:
    """``segments[3]['blocks'][0]['state']`` for the place ``((((('segments', 3), 'blocks'), 0), 'state')``."""
    steps = []
    while isinstance(place, tuple):
        place, step = place
        steps.append(f"[{step!r}]")
    return place + "".join(reversed(steps))


def _described(value) -> str:
    """``a list ([[...], 3])``: the type, and :func:`_shown`'s repr (but for None)."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({_shown(value)})"


def _shown(value, width: int = SHOWN) -> str:
    """A repr of ``value`` of at most ``width`` characters, made from its first few items, each
    shown one level deep, so that a value of any size or depth costs as little as a small one."""
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        part = width // 4
        shown = [f"{_atom(k, part)}: {_atom(v, part)}" for k, v in islice(value.items(), 4)] \
            if isinstance(value, dict) else [_atom(item, part) for item in islice(value, 4)]
        brackets = "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
        text = brackets[0] + ", ".join(shown + (["..."] if len(value) > 4 else [])) + brackets[1]
    else:
        text = _atom(value, width)
    return _cut(text, width)


def _atom(value, width: int) -> str:
    """A repr of ``value`` of at most ``width`` characters that reads no item of it (a list is
    ``[...]``), no more than the start of a string, nor the digits of a huge number."""
    if isinstance(value, list):
        return "[...]"
    if isinstance(value, tuple):
        return "(...)"
    if isinstance(value, (dict, set, frozenset)):
        return "{...}"
    if isinstance(value, (str, bytes, bytearray)):
        return _cut(repr(value[:width]), width)
    if isinstance(value, int) and value.bit_length() > 128:
        return f"<a number of {value.bit_length():,} bits>"
    return _cut(repr(value), width)


def _cut(text: str, width: int = SHOWN) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."
