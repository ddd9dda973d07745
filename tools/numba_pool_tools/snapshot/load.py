"""Reading a snapshot file for ``numba-pool-tools snapshot``: one line naming the file for each way it
can be wrong (unreadable, not a pickle, not a snapshot: the key missing and where).

Only plain data is unpickled (dicts, lists, tuples, strings, numbers, None): a snapshot holds
nothing else, and a pickle naming a class, which could run code when loaded, is refused.
"""

from __future__ import annotations

import pickle

from numba_pool.cli.errors import Failure

#: What each part of a snapshot must have: the keys the commands read (the schema of
#: :mod:`numba_pool.observe.snapshot`, PyTorch's ``torch.cuda.memory._snapshot()``).
SEGMENT_KEYS = ("device", "total_size", "blocks")
BLOCK_KEYS = ("size", "requested_size", "state", "frames")
FRAME_KEYS = ("filename", "line")
EVENT_KEYS = ("action", "addr", "size", "time_us", "frames")
#: Values that must be whole numbers.
NUMBERS = {"device", "total_size", "size", "requested_size", "line", "addr", "time_us"}


class NotPlainData(pickle.UnpicklingError):
    """The pickle names a class or a function."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise NotPlainData(f"it names {module}.{name}, and only plain data (dicts, lists, strings, numbers) is read")


def load(path: str, need: tuple[str, ...] = ("segments",)) -> dict:
    """The snapshot in ``path``, checked to have the keys ``need`` (``segments``,
    ``device_traces``) and, in each, what the commands read.

    :raises Failure: naming the file: it cannot be read, is not a pickle, or is not a snapshot
        (which key is missing, and where).
    """
    try:
        with open(path, "rb") as f:
            snapshot = _PlainData(f).load()
    except OSError as err:
        raise Failure(f"{path}: cannot read it ({err.strerror or err})") from None
    except EOFError:
        raise Failure(f"{path}: not a pickle (the file is empty or cut short)") from None
    except NotPlainData as err:
        raise Failure(f"{path}: not a snapshot: {err}") from None
    except Exception as err:  # noqa: BLE001  (pickle raises many kinds on a file that is not one)
        raise Failure(f"{path}: not a pickle ({type(err).__name__}: {err})") from None
    problem = _problem(snapshot, need)
    if problem:
        raise Failure(f"{path}: not a memory snapshot (numba_pool.dump_snapshot's or PyTorch's): {problem}")
    return snapshot


def _problem(snapshot, need: tuple[str, ...]) -> str | None:
    """What makes ``snapshot`` no snapshot, in words, or None."""
    if not isinstance(snapshot, dict):
        return f"the pickle holds {_kind(snapshot)}, not a dict"
    for key in need:
        if key not in snapshot:
            keys = ", ".join(repr(k) for k in list(snapshot)[:8]) or "none"
            return f"no {key!r} key (its keys: {keys})"
    if "segments" in need:
        problem = _list_problem(snapshot["segments"], "segments", _segment_problem)
        if problem:
            return problem
    if "device_traces" in need:
        traces = snapshot["device_traces"]
        if not isinstance(traces, list):
            return f"'device_traces' is {_kind(traces)}, not a list"
        for device, events in enumerate(traces):
            problem = _list_problem(events, f"device_traces[{device}]", _event_problem)
            if problem:
                return problem
    return None


def _list_problem(items, where: str, check) -> str | None:
    if not isinstance(items, list):
        return f"{where} is {_kind(items)}, not a list"
    for i, item in enumerate(items):
        problem = check(item, f"{where}[{i}]")
        if problem:
            return problem
    return None


def _segment_problem(segment, where: str) -> str | None:
    return _keys_problem(segment, where, SEGMENT_KEYS) or _list_problem(segment["blocks"], f"{where}['blocks']", _block_problem)


def _block_problem(block, where: str) -> str | None:
    return _keys_problem(block, where, BLOCK_KEYS) or _frames_problem(block["frames"], f"{where}['frames']")


def _event_problem(event, where: str) -> str | None:
    return _keys_problem(event, where, EVENT_KEYS) or _frames_problem(event["frames"], f"{where}['frames']")


def _frames_problem(frames, where: str) -> str | None:
    return _list_problem(frames, where, lambda frame, at: _keys_problem(frame, at, FRAME_KEYS))


def _keys_problem(item, where: str, keys: tuple[str, ...]) -> str | None:
    if not isinstance(item, dict):
        return f"{where} is {_kind(item)}, not a dict"
    for key in keys:
        if key not in item:
            return f"{where} has no {key!r} key"
        value = item[key]
        if key in NUMBERS and (not isinstance(value, int) or isinstance(value, bool)):
            return f"{where}[{key!r}] is {value!r}, not a whole number"
    return None


def _kind(value) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
