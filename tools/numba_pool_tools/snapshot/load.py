"""Reading a snapshot file for ``numba-pool-tools snapshot``: one line naming the file for each way it
can be wrong (unreadable, too large, not a pickle, not a snapshot: which field, what it holds and
what it should hold), and a bound on the memory and time any file takes.

Unpickling is :mod:`~numba_pool_tools.snapshot.unpickle`'s: plain data only (a pickle naming a class,
which could run code when loaded, is refused), and only once a throwaway process has shown that
CPython's unpickler ends on the bytes within a memory and a time that grow with the file's size (a
file of a few bytes can make it take gigabytes, never return, or crash).  Files above
:data:`MAX_FILE_BYTES` are refused before that.

Then every field the commands read is checked against :data:`SCHEMA`, the schema
:mod:`numba_pool.observe.snapshot` writes and PyTorch's ``torch.cuda.memory._snapshot()`` has:
each one's kind (a whole number, not a bool; a string; a list; a dict), sizes, addresses and times
from 0 to :data:`LARGEST`, device ordinals below :data:`MAX_DEVICES`, block states and event actions
among the known ones (:data:`STATES`, :data:`ACTIONS`), file names of at most :data:`MAX_NAME`
characters.  The keys numba_pool adds (a segment's ``kind``, an event's ``kind`` and ``thread``,
``allocator_settings``) and PyTorch's summary keys (a segment's ``segment_type``, ``allocated_size``...)
are checked when present; other keys are not looked at (PyTorch's snapshots have more).  What
PyTorch leaves out is allowed: an event or block recorded without a stack gets empty ``frames``
(the one change made to what is read), and an ``oom`` event may have ``device_free`` in place of
``addr``.  The commands then meet only values they can use, so a bad file is an error line here
rather than a traceback or a wrong table later.

A pickle can share references, so a file of a few hundred bytes can hold a list of two
references to a list of two references to ... : millions of values, and a repr of gigabytes.
So the check walks with a stack of its own (never Python's recursion), only as deep as the
schema goes (a frame in the frames of an event in a device's list of ``device_traces``: a value
nested deeper is never walked); it counts every value it reads, a shared one each time, and
stops at :func:`value_budget`'s count, which grows with the file's size (what the commands then do
grows with it too); and an error shows a value by its type and a repr of at most :data:`SHOWN`
characters, made from its first few items only.  An error line has at most about 300 characters
besides the file's name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import count, islice, repeat
from typing import Callable, Mapping, NamedTuple

from numba_pool.cli.errors import Failure
from numba_pool.observe import snapshot as _snapshot
from . import unpickle

#: The largest file read: a snapshot of 50 million values (:data:`MAX_VALUES`) pickles to well below
#: it, and unpickling takes up to :data:`unpickle.MEMORY_PER_BYTE` times the file's size in memory.
MAX_FILE_BYTES = 1 << 30
#: Bytes read at a time from a pipe or a device.
_CHUNK = 16 << 20
#: The most values one check reads, shared ones counted each time they are read: the commands
#: read them again just as often, so this bounds their time too; far above a real snapshot's
#: (100,000 events of 50 frames each are about 20 million).
MAX_VALUES = 50_000_000
#: ... and at most this many per byte of the file, but never fewer than :data:`MIN_VALUES`: a snapshot
#: has under 2 per byte (its shared frames included), a file sharing one list a million times far more;
#: so the time the commands take grows with the file's size, a few kilobytes taking a fraction of a second.
VALUES_PER_BYTE = 256
MIN_VALUES = 1_000_000
#: The largest size, address, stream, line or time: CUDA's and PyTorch's are 64-bit, and a larger
#: number would not fit the float the figure converts it to.
LARGEST = 2**64 - 1
#: Device ordinals are below this (and ``device_traces`` has at most this many lists): more GPUs
#: than one process sees, and one table column or one figure panel each, which must stay drawable.
MAX_DEVICES = 64
#: The longest file name of a frame (Linux's PATH_MAX): a site is shown whole in a table row and a
#: figure's legend.
MAX_NAME = 4096
#: The most characters of a value an error line shows.
SHOWN = 60
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


_ABSENT = object()


@dataclass(frozen=True)
class Record:
    """A field that holds a dict with the keys of ``fields`` (key -> what it holds), but maybe
    not those in ``optional``; one of ``defaults`` that is absent is set to its value there.
    ``steps``: each key's ``(key, what it holds, a list?, optional?, default or _ABSENT)``, made
    once (the walk reads millions of frames, each a dict of three)."""

    fields: Mapping[str, Value | ListOf]
    optional: frozenset = frozenset()
    defaults: Mapping[str, object] = field(default_factory=dict)
    steps: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "steps", tuple(
            (key, spec, type(spec) is ListOf, key in self.optional, self.defaults.get(key, _ABSENT))
            for key, spec in self.fields.items()))


def _optional(fields: Mapping[str, Value | ListOf], *required: str, defaults: Mapping[str, object] | None = None
              ) -> Record:
    """A :class:`Record` of ``fields`` where only ``required`` must be present."""
    return Record(fields, frozenset(fields) - set(required), defaults or {})


COUNT = Value("a whole number from 0 to 2**64 - 1", lambda v: type(v) is int and 0 <= v <= LARGEST)
DEVICE = Value(f"a device ordinal from 0 to {MAX_DEVICES - 1}", lambda v: type(v) is int and 0 <= v < MAX_DEVICES)
TEXT = Value("a string", lambda v: type(v) is str)
FILE_NAME = Value(f"a string of at most {MAX_NAME:,} characters", lambda v: type(v) is str and len(v) <= MAX_NAME)
PAIR = Value("a pair of whole numbers",
             lambda v: type(v) in (tuple, list) and len(v) == 2 and all(type(n) is int for n in v))
STATE = Value(f"a block state ({', '.join(STATES)})", lambda v: type(v) is str and v in STATES)
ACTION = Value(f"an event action ({', '.join(ACTIONS[:6])}, or another of PyTorch's)",
               lambda v: type(v) is str and v in ACTIONS)
NO_FRAMES = ()  # what an event or block recorded without a stack has (PyTorch leaves the key out)

FRAME = _optional({"filename": FILE_NAME, "line": COUNT, "name": TEXT}, "filename", "line")
BLOCK = _optional({"address": COUNT, "size": COUNT, "requested_size": COUNT, "state": STATE, "frames": ListOf(FRAME)},
                  "size", "requested_size", "state", defaults={"frames": NO_FRAMES})
SEGMENT = _optional({"device": DEVICE, "address": COUNT, "total_size": COUNT, "stream": COUNT, "kind": TEXT,
                     "segment_type": TEXT, "allocated_size": COUNT, "active_size": COUNT, "requested_size": COUNT,
                     "segment_pool_id": PAIR, "blocks": ListOf(BLOCK)},
                    "device", "total_size", "blocks")
#: ``addr`` is optional: PyTorch's ``oom`` events have ``device_free`` in its place.
EVENT = _optional({"action": ACTION, "addr": COUNT, "size": COUNT, "stream": COUNT, "time_us": COUNT,
                   "frames": ListOf(FRAME), "kind": TEXT, "thread": COUNT, "device_free": COUNT},
                  "action", "size", "time_us", defaults={"frames": NO_FRAMES})
#: The snapshot's keys the commands read (``summarize`` the segments, ``plot`` the events), and what
#: each holds, down to the last field read; and ``allocator_settings``, checked when present.
SCHEMA = {"segments": ListOf(SEGMENT), "device_traces": ListOf(ListOf(EVENT), MAX_DEVICES, "lists (one per device)"),
          "allocator_settings": Record({})}
#: The keys of :data:`SCHEMA` checked whenever present, whichever keys a command needs.
CHECKED_WHEN_PRESENT = ("allocator_settings",)


def value_budget(file_bytes: int) -> int:
    """The most values one check of a file of ``file_bytes`` bytes reads."""
    return min(MAX_VALUES, max(MIN_VALUES, VALUES_PER_BYTE * file_bytes))


def load(path: str, need: tuple[str, ...] = ("segments",)) -> dict:
    """The snapshot in ``path``, checked to have the keys ``need`` (``segments``,
    ``device_traces``) and, in each, every field the commands read as :data:`SCHEMA` says.

    :raises Failure: naming the file: it cannot be read, is larger than :data:`MAX_FILE_BYTES`,
        is not a pickle, cannot be unpickled within the bounds of :mod:`.unpickle`, or is not a
        snapshot (which field, what it holds and what it should), or holds more than
        :func:`value_budget` values to read.
    """
    data = _read(path)
    try:
        snapshot = unpickle.plain_data(data)
    except EOFError:
        raise Failure(f"{path}: not a pickle (the file is empty or cut short)") from None
    except unpickle.NotPlainData as err:
        raise Failure(f"{path}: not a snapshot: {err}") from None
    except unpickle.Unbounded as err:
        raise Failure(f"{path}: not read: {err}") from None
    except MemoryError:
        raise Failure(f"{path}: not read: no memory left to unpickle it") from None
    except Exception as err:  # noqa: BLE001  (pickle raises many kinds on a file that is not one)
        raise Failure(f"{path}: not a pickle ({type(err).__name__}: {_cut(str(err))})") from None
    problem = _problem(snapshot, need, value_budget(len(data)))
    if problem:
        raise Failure(f"{path}: {problem}")
    return snapshot


def _read(path: str) -> bytes:
    """The bytes of the file ``path``, read once (what the child unpickles is what this process does):
    a regular file's at once, a pipe's or a device's (which have no size to check first) in chunks
    up to the bound (``read(n)`` allocates n bytes at once)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise Failure(f"{path}: {size:,} bytes, more than the {MAX_FILE_BYTES:,} bytes a snapshot is read up to")
            chunks = [f.read(size + 1)] if size else []
            total = sum(map(len, chunks))
            while total <= MAX_FILE_BYTES and (chunk := f.read(_CHUNK)):
                chunks.append(chunk)
                total += len(chunk)
    except OSError as err:
        raise Failure(f"{path}: cannot read it ({err.strerror or err})") from None
    if total > MAX_FILE_BYTES:
        raise Failure(f"{path}: more than the {MAX_FILE_BYTES:,} bytes a snapshot is read up to")
    return b"".join(chunks)


def _problem(snapshot, need: tuple[str, ...], budget: int) -> str | None:
    """What makes ``snapshot`` no snapshot the commands can read, in words, or None."""
    if type(snapshot) is not dict:
        return f"{NOT_A_SNAPSHOT}: the pickle holds {_described(snapshot)}, not a dict"
    for key in need:
        if key not in snapshot:
            keys = ", ".join(_shown(k, SHOWN // 4) for k in islice(snapshot, 6)) or "none"
            return f"{NOT_A_SNAPSHOT}: no {key!r} key (its keys: {keys}{', ...' if len(snapshot) > 6 else ''})"
    for key in (*need, *(k for k in CHECKED_WHEN_PRESENT if k in snapshot and k not in need)):
        problem = _walk(snapshot[key], SCHEMA[key], key, budget)
        if problem:
            return problem
    return None


def _walk(value, spec, name: str, budget: int) -> str | None:
    """What is wrong in ``value``, the snapshot's key ``name``, against ``spec``, or None; reading
    at most ``budget`` values. A :class:`Record`'s absent ``defaults`` are set on the way.

    Depth first, in the file's order, with a stack of iterators (one per list being read, and
    one per list field of a dict: as deep as the schema); a dict's other fields are checked as
    it is read. A list read before against the same spec (a shared reference) is not read again,
    but its count of values is taken from the budget again, as the commands will read them again.
    A place is ``(parent's place, key or index)``, spelled out only for an error."""
    left = budget
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
            return (f"more than {budget:,} values to read, the most for a file of its size (a reference shared "
                    f"n times is read n times): stopped at {_spelled(place)}")
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
        for key, field_spec, is_list, optional, default in spec.steps:
            item = value.get(key, _ABSENT)
            if item is _ABSENT:
                if default is not _ABSENT:
                    value[key] = default  # what the commands then read; the default needs no check
                if optional:
                    continue
                return f"{NOT_A_SNAPSHOT}: {_spelled(place)} has no {key!r} key"
            if is_list:
                stack.append((iter([(item, field_spec, (place, key))]), None, left))
                continue
            left -= 1
            if not field_spec.ok(item):
                return _wrong((place, key), item, field_spec.words)
    return None


def _wrong(place, value, expected: str) -> str:
    return f"{NOT_A_SNAPSHOT}: {_spelled(place)} is {_described(value)}, not {expected}"


def _spelled(place) -> str:
    """``segments[3].blocks[0].state`` for the place ``((((('segments', 3), 'blocks'), 0), 'state')``
    (the schema's keys are names)."""
    steps = []
    while isinstance(place, tuple):
        place, step = place
        steps.append(f"[{step}]" if type(step) is int else f".{step}")
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
