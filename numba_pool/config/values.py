"""The other kinds of option values: switches, the peer-access setting, the log's path."""

from __future__ import annotations

import numbers
import os
import stat
from typing import Any

from .errors import ConfigError

BOOL_HELP = "0 or 1 (also false/true, no/yes, off/on)"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(value: Any, source: str) -> bool:
    """``True``/``False``, ``0``/``1``, or one of the words in :data:`BOOL_HELP` (case-insensitive).
    :raises ConfigError: for anything else (``"maybe"``, ``2``)."""
    if _is_bool(value):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ConfigError(f"{source}={value!r} is not a switch: expected {BOOL_HELP}")


def parse_peer_access(value: Any, source: str) -> str:
    """``all`` (devices reaching the pool's device may use its memory, ``cuMemPoolSetAccess``) or ``none``, any case.
    :raises ConfigError: for anything else."""
    word = value.strip().lower() if isinstance(value, str) else value
    if word in ("all", "none"):
        return word
    raise ConfigError(f"{source}={value!r} is not a peer access setting: expected 'all' or 'none'")


_PSEUDO_FS = ("/proc", "/sys")  #: Kernel interfaces: their files look regular but are not logs.


def _in_pseudo_fs(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == top or real.startswith(top + "/") for top in _PSEUDO_FS)


def parse_optional_path(value: Any, source: str, what: str = "a CSV file") -> str | None:
    """:func:`parse_path`, or None (no file) for ``off``, ``none``, ``0``, ``false``, ``no`` (the README's default)."""
    if isinstance(value, str) and value.strip().lower() in ("off", "none", "0", "false", "no"):
        return None
    return parse_path(value, source, what)


def parse_path(value: Any, source: str, what: str = "a CSV file") -> str:
    """The absolute path (``~`` expanded) of ``what`` to write, checked now, creating nothing: not a folder; an
    existing file writable, regular, outside ``/proc`` and ``/sys``; a new file's folder existing and writable.
    :raises ConfigError: for an empty value, a non-path, or a failed check."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{source}={value!r} is not a file path: expected the path of {what} to write")
    text = os.fspath(value).strip() if isinstance(value, str) else os.fspath(value)  # " a.csv": a.csv
    if isinstance(text, bytes):
        raise ConfigError(f"{source}={value!r} is not a file path: expected a str path")
    if "\0" in text:
        raise ConfigError(f"{source}={value!r} contains a NUL character: expected the path of {what} to write")
    path = os.path.abspath(os.path.expanduser(text))

    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{source}={value!r} {problem}: expected the path of {what} to write")

    if text.endswith(("/", os.sep)) or os.path.isdir(path):
        raise bad("is a folder")
    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode
        except OSError as err:
            raise bad(f"cannot be used ({err.strerror})") from None
        if not stat.S_ISREG(mode):
            raise bad("is not a regular file (a device, pipe or socket)")
        if _in_pseudo_fs(path):
            raise bad(f"is a kernel interface file ({os.path.realpath(path)})")
        if not os.access(path, os.W_OK):
            raise bad("is not writable")
        return path
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise bad(f"is in folder {folder!r}, which " + ("is not a folder" if os.path.lexists(folder) else "does not exist"))
    if _in_pseudo_fs(folder):
        raise bad(f"is in a kernel interface folder ({folder})")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise bad(f"is in folder {folder!r}, which is not writable")
    return path


def switch(value: Any, call: str, name: str) -> bool:
    """A public function's on/off argument: a bool or 0/1 (NumPy's too), as :func:`parse_bool` takes them, words aside.
    :raises TypeError: for anything else (``'off'`` is truthy: refused), naming ``call``'s ``name`` and the value."""
    if _is_bool(value) or isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{call}: {name}={value!r} must be True or False")


def device_ordinal(value: Any, call: str, name: str) -> int:
    """``value`` as a device ordinal: an integral number (NumPy's too) but a bool, a C int >= 0.
    :raises TypeError: for what is no int.  :raises ValueError: outside [0, 2**31); both naming ``call``'s ``name``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{call}: {name}={value!r} is not a device ordinal (an int)")
    if not 0 <= value < 1 << 31:
        raise ValueError(f"{call}: {name}={value!r} is not a device ordinal (0 <= ordinal < 2**31)")
    return int(value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or getattr(value, "dtype", None) == bool  # also NumPy's bool_


def byte_count(value: Any, call: str, name: str, *, positive: bool) -> int:
    """``value`` as a number of bytes: an integral number (NumPy's too) but a bool, below 2**64.
    :raises ValueError: naming ``call``'s ``name`` and ``value``, for anything else or below 1 (``positive``) or 0."""
    if type(value) is int and positive <= value < 1 << 64:
        return value
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or not positive <= value < 1 << 64:
        raise ValueError(f"{call}: {name}={value!r} must be a {'positive' if positive else 'non-negative'} number of "
                         "bytes below 2**64")
    return int(value)
