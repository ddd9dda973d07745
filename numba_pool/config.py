"""Configuration of the numba_pool EMM plugin.

Every option can come from an environment variable (read once, when the first CUDA context
initializes the plugin) or from :func:`numba_pool.install` keyword arguments, which take
precedence.  Parsing never touches CUDA, so ``numba-pool info`` can report a bad value on a
machine without a GPU.

A bad value raises :class:`ConfigError`, a one-line message naming what the user typed (the
environment variable, or ``install(<keyword>)``), the value, and what is accepted.  Nothing falls
back silently to a default.  A variable that is unset or empty, and an ``install()`` keyword
given as ``None``, mean "use the default".  An unknown ``NUMBA_POOL_*`` variable (a typo) gives a
:class:`ConfigWarning` naming the closest known variable.

Sizes are in bytes: a Python int, or a string of a whole number of bytes or of a decimal number
with a unit (``"64 MiB"``, ``"1.5 GiB"``, ``"2 MB"``); the result must be a whole number of bytes
from 0 to 2**64 - 1 (what the driver's ``cuuint64_t``/``size_t`` attributes hold).
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import os
import re
import stat
import warnings
from fractions import Fraction
from typing import Any, Callable, Mapping

import humanfriendly

#: Release threshold meaning "keep every byte cached" (``UINT64_MAX``), the seeds' point: a
#: mempool that never gives memory back on synchronization serves each allocation from cache.
KEEP_ALL = 2**64 - 1
#: The largest size accepted anywhere (bytes): the driver's attributes are 64-bit unsigned.
MAX_BYTES = 2**64 - 1
#: The alignment of every block numba_pool hands out (bytes): what ``cuMemAlloc`` guarantees.
#: The arena's block and slab sizes are multiples of it.
ALIGNMENT = 256

#: Default largest block served by the arena (bytes).  Measured (README, arena section): on the
#: shipped logs, blocks of 200 KiB in the arena raise peak reserved / peak requested to 1.22,
#: while at 64 KiB both replay within 1.01; and the arena's gain over the mempool path matters
#: most for the small, frequent arrays that dominate Numba workloads.
DEFAULT_ARENA_MAX_BLOCK = 64 << 10
#: Default slab the arena takes from the mempool (bytes); see the README's arena section.
DEFAULT_ARENA_SLAB_SIZE = 4 << 20

#: A pool cap given as a bare number (no unit) below this many bytes is refused; see
#: :func:`parse_max_size`.
MIN_BARE_CAP = 1 << 20

SIZE_HELP = "bytes (e.g. 1048576) or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"
BOOL_HELP = "0 or 1 (also false/true, no/yes, off/on)"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the one-line message names the variable or
    keyword, its value, and what is accepted."""


class ConfigWarning(UserWarning):
    """A configuration that works but is probably not what was meant (an unknown
    ``NUMBA_POOL_*`` variable)."""


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """The configuration in effect for every numba_pool memory manager of a process.

    Sizes are in bytes.  ``max_size`` is either bytes (int) or a fraction of the device's total
    memory (float in (0, 1]); :meth:`max_size_bytes` resolves it once the device is known.
    ``log`` is an absolute file path, or None for no allocation log.  ``ipc`` asks for a pool
    whose allocations other processes can open (where the device supports it); ``peer_access``
    is ``"all"`` (other devices may reach the pool's memory) or ``"none"``.  ``host`` serves
    pinned and mapped host memory (``cuda.pinned_array``, ``mapped_array``) from a cache of
    ``cuMemHostAlloc`` blocks (:mod:`numba_pool.allocator.host_blocks`); off by default: not yet validated on a
    GPU.  ``host_max_size`` caps its reserved bytes (None: no cap); beyond
    ``host_release_threshold`` cached bytes, completed blocks are freed.  Build it with :func:`load`,
    which checks every value; the constructor checks nothing.
    """

    release_threshold: int = KEEP_ALL
    max_size: int | float | None = None
    initial_size: int = 0
    use_default_pool: bool = False
    arena: bool = False
    arena_max_block: int = DEFAULT_ARENA_MAX_BLOCK
    arena_slab_size: int = DEFAULT_ARENA_SLAB_SIZE
    log: str | None = None
    ipc: bool = True
    peer_access: str = "all"
    host: bool = False
    host_max_size: int | None = None
    host_release_threshold: int = KEEP_ALL

    def max_size_bytes(self, device_total: int) -> int | None:
        """The hard cap of the private pool in bytes for a device of ``device_total`` bytes
        (None: no cap)."""
        if isinstance(self.max_size, float):
            return int(self.max_size * device_total)
        return self.max_size

    def describe(self) -> dict[str, str]:
        """Human-readable values of every option, for ``numba-pool info``."""
        def size(n: int) -> str:  # "0 bytes" once, not "0 bytes (0 bytes)"
            return humanfriendly.format_size(n, binary=True) + ("" if n < 1024 else f" ({n} bytes)")

        if isinstance(self.max_size, float):
            max_size = f"{self.max_size:.0%} of device memory"
        else:
            max_size = "no cap" if self.max_size is None else size(self.max_size)
        return {
            "pool": "device default mempool" if self.use_default_pool else "private mempool (cuMemPoolCreate)",
            "release threshold": "keep all (never release on sync)" if self.release_threshold == KEEP_ALL else size(self.release_threshold),
            "max size": max_size,
            "initial size": size(self.initial_size),
            "arena": (f"on: blocks up to {size(self.arena_max_block)}, slabs of {size(self.arena_slab_size)}"
                      if self.arena else "off"),
            "log": self.log or "off",
            "ipc": "exportable pool (POSIX file descriptors) where the device supports it" if self.ipc else "off",
            "peer access": ("every device that can reach this one (cuMemPoolSetAccess)" if self.peer_access == "all"
                            else "none: the pool's own device only"),
            "host": (f"on: pinned/mapped blocks cached (cuMemHostAlloc), cap "
                     f"{'none' if self.host_max_size is None else size(self.host_max_size)}, release threshold "
                     f"{'keep all' if self.host_release_threshold == KEEP_ALL else size(self.host_release_threshold)}"
                     if self.host else "off: Numba's cuMemHostAlloc/cuMemFreeHost per buffer"),
        }


def release_limit(threshold: int) -> int | None:
    """A release threshold (bytes) as the allocator's caches take it: the bytes they keep, or
    None for :data:`KEEP_ALL` (keep every byte)."""
    return None if threshold == KEEP_ALL else threshold


# -- parsing of single values -------------------------------------------------------------

#: unit (lower case) -> bytes.  Decimal units are powers of 1000, binary ones of 1024, as in
#: humanfriendly and the IEC; the spelling is case-insensitive ("64 mib" is 64 MiB).
_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1}
for _i, _prefix in enumerate("kmgtpe", start=1):
    _UNITS[f"{_prefix}b"] = 1000**_i
    _UNITS[f"{_prefix}ib"] = 1024**_i
_UNIT_NAMES = ["B", "KB", "MB", "GB", "TB", "PB", "EB", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]

_PLAIN_NUMBER = re.compile(r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*$")
_SIZE = re.compile(r"^\s*(?P<sign>[-+]?)\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*$")


def _size_error(value: Any, source: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}={value!r} {problem}: expected {SIZE_HELP}")


def parse_size(value: Any, source: str) -> int:
    """Parse a size in bytes: an int (also numpy integers), or a string of a whole number of
    bytes or of a decimal number with a binary (KiB...) or decimal (KB...) unit.

    The number is scaled exactly: ``"1.5 GiB"`` is 1610612736 bytes, while ``"1.1 KiB"``
    (1126.4 bytes) and ``"1.5 B"`` are refused rather than truncated.

    :param source: what the value came from (an environment variable or ``install(name)``),
        quoted in the error.
    :returns: bytes, from 0 to :data:`MAX_BYTES`.
    :raises ConfigError: for anything else: other types (floats and bools included), unknown
        units, negative sizes, fractional bytes, sizes above 2**64 - 1.
    """
    if isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise _size_error(value, source, "is not a size")
        unit = match["unit"].lower()
        if unit not in _UNITS:
            close = difflib.get_close_matches(match["unit"], _UNIT_NAMES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise _size_error(value, source, f"has an unknown unit {match['unit']!r}{hint}")
        exact = Fraction(match["number"]) * _UNITS[unit]
        if match["sign"] == "-" and exact:
            raise _size_error(value, source, "is negative")
        if exact.denominator != 1:
            raise _size_error(value, source, f"is not a whole number of bytes ({float(exact):.6g} bytes)")
        nbytes = int(exact)
    else:
        try:
            if isinstance(value, bool):
                raise TypeError
            nbytes = operator.index(value)
        except TypeError:
            kind = "a float, not a size (sizes are whole bytes)" if isinstance(value, float) else "not a size"
            raise _size_error(value, source, f"is {kind}") from None
        if nbytes < 0:
            raise _size_error(value, source, "is negative")
    if nbytes > MAX_BYTES:
        raise _size_error(value, source, f"is above the largest size, 2**64 - 1 = {MAX_BYTES} bytes")
    return nbytes


def parse_release_threshold(value: Any, source: str) -> int:
    """A size in bytes (see :func:`parse_size`), or ``all``/``max`` (also ``None`` from Python)
    for :data:`KEEP_ALL`.

    :raises ConfigError: for anything else.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("all", "max")):
        return KEEP_ALL
    try:
        return parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; or 'all' to keep every byte cached") from None


def parse_max_size(value: Any, source: str) -> int | float | None:
    """The private pool's cap: a size in bytes (see :func:`parse_size`), or a fraction of device
    memory: a float in (0, 1], or a string ``"0.5"`` or ``"50%"``.  ``None`` means no cap.

    A *bare* number (an int, or a string without a unit) below :data:`MIN_BARE_CAP` (1 MiB) is
    refused with a suggestion.  Decision: an error, not a warning.  ``1`` and ``1.0`` differ only
    by a dot yet mean a 1-byte cap and 100 % of the device; a cap that small cannot serve a single
    real allocation, so the value is almost surely a slip, and as a warning it would scroll by
    while the program fails later with ``CUDA_ERROR_OUT_OF_MEMORY`` far from its cause.  A tiny
    cap remains possible by writing the unit (``"512 KiB"``, ``"4096 B"``).

    :raises ConfigError: for a fraction outside (0, 1], a cap of 0 bytes, a bare number below
        1 MiB, or anything :func:`parse_size` refuses.
    """
    if value is None:
        return None
    fraction = None
    if isinstance(value, float):
        fraction = value
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith("%") and _PLAIN_NUMBER.match(text[:-1]):
            fraction = float(text[:-1]) / 100
        elif _PLAIN_NUMBER.match(text) and "." in text:
            fraction = float(text)
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ConfigError(
                f"{source}={value!r} is not a fraction of device memory in (0, 1]: expected e.g. 0.5 or 50%, "
                "or a size such as 8 GiB")
        return fraction
    try:
        nbytes = parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; or a fraction of device memory such as 0.5 or 50%") from None
    if nbytes == 0:
        raise ConfigError(f"{source}={value!r}: a pool capped at 0 bytes cannot serve anything; unset it for no cap")
    bare = not isinstance(value, str) or _PLAIN_NUMBER.match(value)
    if bare and nbytes < MIN_BARE_CAP:
        meant = ["'1.0' (100 %)"] if nbytes == 1 else [f"'{nbytes}%'"] if nbytes <= 100 else []
        meant.append(f"'{nbytes} MiB'")
        raise ConfigError(
            f"{source}={value!r} would cap the pool at {nbytes} bytes: did you mean {' or '.join(meant)}? "
            f"(a cap below 1 MiB needs its unit, e.g. '{nbytes} B')")
    return nbytes


def parse_arena_size(value: Any, source: str) -> int:
    """An arena block or slab size in bytes (see :func:`parse_size`): a positive multiple of
    256 bytes, the arena's block alignment.

    :raises ConfigError: for a size that is not, or anything :func:`parse_size` refuses.
    """
    nbytes = parse_size(value, source)
    if nbytes < ALIGNMENT or nbytes % ALIGNMENT:
        down, up = nbytes // ALIGNMENT * ALIGNMENT, (nbytes // ALIGNMENT + 1) * ALIGNMENT
        nearest = f"{down} or {up}" if down else f"{up}"
        raise ConfigError(
            f"{source}={value!r} ({nbytes} bytes) is not a positive multiple of {ALIGNMENT} bytes, the arena's "
            f"block alignment: expected e.g. {nearest}")
    return nbytes


def parse_host_max_size(value: Any, source: str) -> int | None:
    """The pinned host cache's cap in bytes (see :func:`parse_size`); ``None``/``none`` for no
    cap.

    :raises ConfigError: for 0 bytes, or anything :func:`parse_size` refuses.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    try:
        nbytes = parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; or 'none' for no cap") from None
    if nbytes == 0:
        raise ConfigError(f"{source}={value!r}: a host cache capped at 0 bytes cannot serve anything; unset it for no cap")
    return nbytes


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(value: Any, source: str) -> bool:
    """``True``/``False``, ``0``/``1``, or one of the words in :data:`BOOL_HELP`
    (case-insensitive).

    :raises ConfigError: for anything else (``"maybe"``, ``2``).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ConfigError(f"{source}={value!r} is not a switch: expected {BOOL_HELP}")


def parse_peer_access(value: Any, source: str) -> str:
    """``all`` (every device that can reach the pool's device may use its memory,
    ``cuMemPoolSetAccess``) or ``none`` (case-insensitive).

    :raises ConfigError: for anything else.
    """
    word = value.strip().lower() if isinstance(value, str) else value
    if word in ("all", "none"):
        return word
    raise ConfigError(f"{source}={value!r} is not a peer access setting: expected 'all' or 'none'")


#: Kernel interfaces: their files look regular but are not logs.
_PSEUDO_FS = ("/proc", "/sys")


def _in_pseudo_fs(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == top or real.startswith(top + "/") for top in _PSEUDO_FS)


def parse_path(value: Any, source: str) -> str:
    """The allocation log's file path (``~`` expanded).  Checked now, so that a bad path fails
    at configuration rather than at the first allocation: the path must not be a folder; an
    existing file must be a writable regular file outside ``/proc`` and ``/sys``; a new file's
    folder must exist and be writable.  The file itself is neither created nor changed here.

    :returns: the absolute path.
    :raises ConfigError: for an empty value, a non-path, or a path that fails a check above.
    """
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{source}={value!r} is not a file path: expected the path of a CSV file to write")
    text = os.fspath(value).strip() if isinstance(value, str) else os.fspath(value)  # " a.csv": a.csv
    if isinstance(text, bytes):
        raise ConfigError(f"{source}={value!r} is not a file path: expected a str path")
    if "\0" in text:
        raise ConfigError(f"{source}={value!r} contains a NUL character: expected the path of a CSV file to write")
    path = os.path.abspath(os.path.expanduser(text))

    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{source}={value!r} {problem}: expected the path of a CSV file to write")

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
            raise bad(f"is a kernel interface file ({os.path.realpath(path)}), not a log file")
        if not os.access(path, os.W_OK):
            raise bad("is not writable")
        return path
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise bad(f"is in folder {folder!r}, which " + ("is not a folder" if os.path.lexists(folder) else "does not exist"))
    if _in_pseudo_fs(folder):
        raise bad(f"is in a kernel interface folder ({folder}), not a place for a log file")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise bad(f"is in folder {folder!r}, which is not writable")
    return path


# -- the options ----------------------------------------------------------------------------

#: option name -> (environment variable, parser)
OPTIONS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "release_threshold": ("NUMBA_POOL_RELEASE_THRESHOLD", parse_release_threshold),
    "max_size": ("NUMBA_POOL_MAX_SIZE", parse_max_size),
    "initial_size": ("NUMBA_POOL_INITIAL_SIZE", parse_size),
    "use_default_pool": ("NUMBA_POOL_USE_DEFAULT_POOL", parse_bool),
    "arena": ("NUMBA_POOL_ARENA", parse_bool),
    "arena_max_block": ("NUMBA_POOL_ARENA_MAX_BLOCK", parse_arena_size),
    "arena_slab_size": ("NUMBA_POOL_ARENA_SLAB_SIZE", parse_arena_size),
    "log": ("NUMBA_POOL_LOG", parse_path),
    "ipc": ("NUMBA_POOL_IPC", parse_bool),
    "peer_access": ("NUMBA_POOL_PEER_ACCESS", parse_peer_access),
    "host": ("NUMBA_POOL_HOST", parse_bool),
    "host_max_size": ("NUMBA_POOL_HOST_MAX_SIZE", parse_host_max_size),
    "host_release_threshold": ("NUMBA_POOL_HOST_RELEASE_THRESHOLD", parse_release_threshold),
}

#: ``NUMBA_POOL_*`` variables read elsewhere than :func:`load`; every other ``NUMBA_POOL_*``
#: name in the environment is reported as a probable typo.
OTHER_VARIABLES = {
    "NUMBA_POOL_NOOP_FINALIZER": "numba_pool.bench.noop: the no-op manager keeps (1) or drops (0) its finalizer",
    "NUMBA_POOL_BENCH_RMM": "set by numba-pool bench in the child process that measures rmm",
    "NUMBA_POOL_BENCH_CORE": "set by numba-pool bench: the CPU core its end-to-end workers pin themselves to",
    "NUMBA_POOL_BENCH_TURNS": "set by numba-pool bench: the pipes its end-to-end workers take turns through",
    "NUMBA_POOL_BENCH_REPEATS": "set by numba-pool bench in its warm-up rounds' workers: timed repeats per figure",
    "NUMBA_POOL_FUZZ_EXAMPLES": "tests/allocator/test_fuzz.py: number of hypothesis examples",
    "NUMBA_POOL_FUZZ_PARK": "tests/allocator/test_fuzz.py: 0 leaves out the park rule (another thread's launch-and-drop between two driver calls)",
    "NUMBA_POOL_FUZZ_RULES": "tests/allocator/test_fuzz.py: only these rules, comma-separated (a run looking for one class of defect)",
}
KNOWN_VARIABLES = frozenset([variable for variable, _ in OPTIONS.values()] + list(OTHER_VARIABLES))


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    prefix = "NUMBA_POOL_"
    known = sorted(KNOWN_VARIABLES)
    for name in sorted(environ):
        if not name.upper().startswith(prefix) or name in KNOWN_VARIABLES:
            continue
        # Compared without the shared prefix, which would make every name look close.
        close = difflib.get_close_matches(name.upper()[len(prefix):], [k[len(prefix):] for k in known], n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"known variables: {', '.join(known)}"
        warnings.warn(f"{name} is not a numba_pool variable and is ignored: {hint}", ConfigWarning, stacklevel=3)


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> PoolConfig:
    """Build the configuration from environment variables and keyword overrides.

    :param environ: the environment to read (``os.environ`` when None).  Unset or empty
        variables mean the default.  Unknown ``NUMBA_POOL_*`` names give a :class:`ConfigWarning`
        naming the closest known variable.
    :param overrides: option values from :func:`numba_pool.install`; they win over the
        environment.  ``None`` means the option's default (whatever the environment says).
    :raises ConfigError: an unknown option, a bad value, or options that contradict each other;
        the message names the environment variable or ``install(<option>)`` the value came from.
    """
    environ = os.environ if environ is None else environ
    unknown = sorted(set(overrides) - set(OPTIONS))
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, list(OPTIONS), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"install(): unknown option(s) {', '.join(hints)}: expected some of {', '.join(OPTIONS)}")
    _warn_unknown_variables(environ)
    values: dict[str, Any] = {}
    given: dict[str, tuple[str, Any]] = {}  # option -> (source, value as typed), for the consistency messages
    for name, (variable, parser) in OPTIONS.items():
        if name in overrides:
            if overrides[name] is None:
                continue  # the default, whatever the environment says
            source, raw = f"install({name})", overrides[name]
        elif environ.get(variable, "").strip():
            source, raw = variable, environ[variable]
        else:
            continue
        values[name] = parser(raw, source)
        given[name] = (source, raw)
    config = PoolConfig(**values)
    _check_consistency(config, given)
    if config.use_default_pool and "ipc" not in given:  # the default pool cannot be exported
        config = dataclasses.replace(config, ipc=False)
    return config


def _named(config: PoolConfig, given: dict[str, tuple[str, Any]], name: str, nbytes: bool = True) -> str:
    """How a consistency error names an option: as the user gave it, or as the default; with
    its value in bytes when ``nbytes``."""
    value = getattr(config, name)
    nbytes = nbytes and isinstance(value, int) and not isinstance(value, bool)
    if name in given:
        source, raw = given[name]
        same = isinstance(raw, int) and raw == value  # an int typed in Python: bytes already
        return f"{source}={raw!r}" + ("" if same or not nbytes else f" ({value} bytes)")
    return (f"the default {name}" + (f" of {value} bytes" if nbytes else "")
            + f" (set {OPTIONS[name][0]} or install({name}=...) to change it)")


def _check_consistency(config: PoolConfig, given: dict[str, tuple[str, Any]]) -> None:
    def named(name: str, nbytes: bool = True) -> str:
        return _named(config, given, name, nbytes)

    if config.use_default_pool and config.ipc and "ipc" in given:
        raise ConfigError(f"{named('ipc', False)} asks for an exportable pool, but {named('use_default_pool')} selects "
                          "the device's default mempool, which cannot be exported (cuMemPoolExportToShareableHandle)")
    if config.use_default_pool and config.max_size is not None:
        raise ConfigError(
            f"{named('max_size', False)} caps the private mempool, but {named('use_default_pool')} selects the "
            "device's default mempool, which cannot be capped (CUmemPoolProps.maxSize is set at creation)")
    if config.initial_size > config.release_threshold:
        raise ConfigError(
            f"{named('initial_size')} is above {named('release_threshold')}: the reserve would be released at "
            "the first synchronization")
    if isinstance(config.max_size, int) and config.initial_size > config.max_size:
        raise ConfigError(f"{named('initial_size')} is above {named('max_size')}: the reserve must fit under the cap")
    if config.arena_max_block > config.arena_slab_size:
        raise ConfigError(
            f"{named('arena_max_block')} is larger than {named('arena_slab_size')}: a block must fit in a slab")
