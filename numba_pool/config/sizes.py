"""Sizes in bytes, as every entry point takes them: environment variables, ``install()``
keywords, the command line and the Python replay API all parse with :func:`parse_size` and the
parsers built on it.

The syntax, decided once for all of them:

* a Python ``int`` (numpy integers too): bytes.  Floats are never sizes (``1.5`` would be
  fractional bytes), except as :func:`parse_max_size`'s fraction of device memory;
* a string: a decimal number of bytes (``"1048576"``), or a decimal number with a unit
  (``"64 MiB"``, ``"1.5 GiB"``, ``"2 MB"``), spaces allowed around both.  Binary units (KiB, MiB,
  GiB, TiB, PiB, EiB) are powers of 1024, decimal ones (KB, MB, GB, TB, PB, EB, and SI's kB) of
  1000, as in the IEC standard and humanfriendly.  Units are case-insensitive (``"64 mib"``,
  ``"64 MB"``, ``"64 mb"``), except a lower-case ``b`` after an upper-case prefix (``"64 Mb"``,
  ``"1 Gb"``), which reads as bits and is refused, naming the byte units meant;
* not accepted: digit separators (``"1_000"``, ``"1,000"``), a leading ``+``, exponents
  (``"1e6"``), hexadecimal, and a number that is not a whole number of bytes once scaled
  (``"1.1 KiB"``, ``"0.5 B"``).

The result is a whole number of bytes from 0 to 2**64 - 1 (what the driver's
``cuuint64_t``/``size_t`` attributes hold).
"""

from __future__ import annotations

import difflib
import numbers
import operator
import re
from fractions import Fraction
from typing import Any

from .errors import ConfigError

#: Release threshold meaning "keep every byte cached" (``UINT64_MAX``), the seeds' point: a
#: mempool that never gives memory back on synchronization serves each allocation from cache.
KEEP_ALL = 2**64 - 1
#: The largest size accepted anywhere (bytes): the driver's attributes are 64-bit unsigned.
MAX_BYTES = 2**64 - 1
#: The alignment of every block numba_pool hands out (bytes): what ``cuMemAlloc`` guarantees.
#: The arena's block and slab sizes are multiples of it.
ALIGNMENT = 256

#: Default largest block served by the arena (bytes).  Measured (docs/guide.md, the arena): on the
#: shipped logs, blocks of 200 KiB in the arena raise peak reserved / peak requested to 1.22,
#: while at 64 KiB both replay within 1.01; and the arena's gain over the mempool path matters
#: most for the small, frequent arrays that dominate Numba workloads.
DEFAULT_ARENA_MAX_BLOCK = 64 << 10
#: Default slab the arena takes from the mempool (bytes); see docs/guide.md, the arena.
DEFAULT_ARENA_SLAB_SIZE = 4 << 20

#: A pool cap given as a bare number (no unit) below this many bytes is refused; see
#: :func:`parse_max_size`.
MIN_BARE_CAP = 1 << 20
#: The smallest block of the pinned and managed caches (bytes; ``MIN_BLOCK`` of
#: :mod:`numba_pool.allocator.host_blocks`, which a test keeps equal): a smaller cap serves nothing.
MIN_CACHE_BLOCK = 512
#: The smallest pool cap given as a fraction of device memory (1 %); see :func:`parse_max_size`.
MIN_FRACTION = 0.01

SIZE_HELP = "bytes (e.g. 1048576) or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"

def release_limit(threshold: int) -> int | None:
    """A release threshold (bytes) as the allocator's caches take it: the bytes they keep, or
    None for :data:`KEEP_ALL` (keep every byte)."""
    return None if threshold == KEEP_ALL else threshold



# -- parsing of single values -------------------------------------------------------------

#: unit (lower case) -> bytes.  Decimal units are powers of 1000, binary ones of 1024, as in
#: humanfriendly and the IEC; the spelling is case-insensitive ("64 mib" is 64 MiB), except the
#: bits-like spellings :func:`_reads_as_bits` refuses.
_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1}
for _i, _prefix in enumerate("kmgtpe", start=1):
    _UNITS[f"{_prefix}b"] = 1000**_i
    _UNITS[f"{_prefix}ib"] = 1024**_i
_UNIT_NAMES = ["B", "KB", "MB", "GB", "TB", "PB", "EB", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]

_PLAIN_NUMBER = re.compile(r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*$")
_SIZE = re.compile(r"^\s*(?P<sign>-?)\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*$")


def _reads_as_bits(unit: str) -> bool:
    """Whether ``unit`` ends in a lower-case ``b`` after an upper-case prefix (``Mb``, ``Gb``,
    ``MIb``): the network convention for bits, which a size in bytes must not silently take for
    bytes (``kb``/``mb``, all lower case, and SI's ``kB`` are bytes)."""
    return len(unit) >= 2 and unit.endswith("b") and unit[0].isupper()


def _size_error(value: Any, source: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}={value!r} {problem}: expected {SIZE_HELP}")


def parse_size(value: Any, source: str) -> int:
    """Parse a size in bytes, in the syntax this module's docstring states: an int (also numpy
    integers), or a string of a whole number of bytes or of a decimal number with a binary
    (KiB...) or decimal (KB...) unit.

    The number is scaled exactly: ``"1.5 GiB"`` is 1610612736 bytes, while ``"1.1 KiB"``
    (1126.4 bytes) and ``"1.5 B"`` are refused rather than truncated.

    :param source: what the value came from (an environment variable or ``install(name)``),
        quoted in the error.
    :returns: bytes, from 0 to :data:`MAX_BYTES`.
    :raises ConfigError: for anything else: other types (floats and bools included), unknown
        units or units that read as bits (``Mb``), digit separators, a ``+`` sign, negative
        sizes, fractional bytes, sizes above 2**64 - 1.
    """
    if isinstance(value, str):
        match = _SIZE.match(value)
        if not match:
            raise _size_error(value, source, "is not a size")
        unit = match["unit"].lower()
        if unit in _UNITS and _reads_as_bits(match["unit"]):
            meant = f"{match['unit'][0].upper()}B or {match['unit'][0].upper()}iB"
            raise _size_error(value, source, f"has the unit {match['unit']!r}, which reads as bits: write {meant} "
                                             f"for bytes")
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
            real = isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)  # numpy floats too
            kind = "a float, not a size (sizes are whole bytes)" if real else "not a size"
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
    memory: a float (numpy floats too) in [0.01, 1], or a string ``"0.5"`` or ``"50%"``.
    ``None`` means no cap.

    Small caps follow one rule, whatever the spelling: below 1 MiB (:data:`MIN_BARE_CAP`) as a
    bare number (an int, or a string without a unit), or below 1 % (:data:`MIN_FRACTION`) as a
    fraction, the value is refused with a suggestion.  Decision: an error, not a warning.  ``1``
    and ``1.0`` differ only by a dot yet mean a 1-byte cap and 100 % of the device, and
    ``0.0000000000001`` or ``0.001%`` would cap an 80 GiB device at 0 bytes or 859 kB: a cap that
    small cannot serve a real workload, so the value is almost surely a slip, and as a warning it
    would scroll by while the program fails later with ``CUDA_ERROR_OUT_OF_MEMORY`` far from its
    cause.  A small cap remains possible by writing the unit (``"512 KiB"``, ``"4096 B"``).

    :raises ConfigError: for a fraction outside [0.01, 1], a cap of 0 bytes, a bare number below
        1 MiB, or anything :func:`parse_size` refuses.
    """
    if value is None:
        return None
    fraction = None
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        fraction = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith("%") and _PLAIN_NUMBER.match(text[:-1]):
            fraction = float(text[:-1]) / 100
        elif _PLAIN_NUMBER.match(text) and "." in text:
            fraction = float(text)
    if fraction is not None:
        return _checked_fraction(fraction, value, source)
    nbytes = _cap_bytes(value, source, "a pool", "or a fraction of device memory such as 0.5 or 50%")
    bare = not isinstance(value, str) or _PLAIN_NUMBER.match(value)
    if bare and nbytes < MIN_BARE_CAP:
        meant = ["'1.0' (100 %)"] if nbytes == 1 else [f"'{nbytes}%'"] if nbytes <= 100 else []
        meant.append(f"'{nbytes} MiB'")
        raise ConfigError(
            f"{source}={value!r} would cap the pool at {nbytes} bytes: did you mean {' or '.join(meant)}? "
            f"(a cap below 1 MiB needs its unit, e.g. '{nbytes} B')")
    return nbytes


def _checked_fraction(fraction: float, value: Any, source: str) -> float:
    """``fraction`` of device memory, when in [:data:`MIN_FRACTION`, 1].

    :raises ConfigError: otherwise, saying what is accepted."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"{source}={value!r} is not a fraction of device memory in (0, 1]: expected e.g. 0.5 or "
                          "50%, or a size such as 8 GiB")
    if fraction < MIN_FRACTION:
        raise ConfigError(f"{source}={value!r} would cap the pool at {fraction:.3g} of device memory, under 1 %: "
                          "a cap that small needs a size with its unit, e.g. '256 MiB'")
    return fraction


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
    cap.  Small caps follow :func:`parse_max_size`'s rule (a bare number below 1 MiB is refused
    with a suggestion), and a cap below the cache's smallest block (:data:`MIN_CACHE_BLOCK`) is
    refused whatever its spelling: every allocation would fail.

    :raises ConfigError: for 0 bytes, a bare number below 1 MiB, a cap below 512 bytes, or
        anything :func:`parse_size` refuses.
    """
    return _optional_cap(value, source, "a host cache")


def parse_managed_max_size(value: Any, source: str) -> int | None:
    """The managed cache's cap in bytes (see :func:`parse_size`); ``None``/``none`` for no cap.
    Small caps as :func:`parse_host_max_size`'s (the two caches round blocks alike).

    :raises ConfigError: for 0 bytes, a bare number below 1 MiB, a cap below 512 bytes, or
        anything :func:`parse_size` refuses.
    """
    return _optional_cap(value, source, "a managed memory cache")


def _optional_cap(value: Any, source: str, what: str) -> int | None:
    """A cache's cap: None for ``None``/``none``, else :func:`_cap_bytes`, with the small-cap
    rules of :func:`parse_host_max_size`."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    nbytes = _cap_bytes(value, source, what, "or 'none' for no cap")
    bare = not isinstance(value, str) or _PLAIN_NUMBER.match(value)
    if bare and nbytes < MIN_BARE_CAP:  # parse_max_size's rule: almost surely a slip
        raise ConfigError(
            f"{source}={value!r} would cap {what} at {nbytes} bytes: did you mean '{nbytes} MiB'? "
            f"(a cap below 1 MiB needs its unit, e.g. '{max(nbytes, MIN_CACHE_BLOCK)} B')")
    if nbytes < MIN_CACHE_BLOCK:
        raise ConfigError(
            f"{source}={value!r} would cap {what} at {nbytes} bytes, below its smallest block "
            f"({MIN_CACHE_BLOCK} bytes): every allocation would fail; expected at least '{MIN_CACHE_BLOCK} B', "
            "or 'none' for no cap")
    return nbytes


def _cap_bytes(value: Any, source: str, what: str, otherwise: str) -> int:
    """A cap in bytes (:func:`parse_size`), not 0.

    :raises ConfigError: for 0 bytes, or what :func:`parse_size` refuses, with ``otherwise``
        (what else the option takes) added to its message."""
    try:
        nbytes = parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; {otherwise}") from None
    if nbytes == 0:
        raise ConfigError(f"{source}={value!r}: {what} capped at 0 bytes cannot serve anything; unset it for no cap")
    return nbytes
