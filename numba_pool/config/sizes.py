"""Byte sizes, whole, 0..2**64 - 1 (``cuuint64_t``; docs/architecture.md, "Sizes: one syntax, and small caps refused"):

* an ``int`` (numpy integers too): bytes.  Floats never (except :func:`parse_max_size`'s fraction);
* a string: a decimal number of bytes (``"1048576"``), or one with a unit (``"64 MiB"``, ``"1.5 GiB"``),
  spaces allowed.  KiB...EiB are powers of 1024, KB...EB (and ``kB``) of 1000, as in IEC and humanfriendly;
  case-insensitive, except a lower-case ``b`` after an upper-case prefix (``"64 Mb"``: bits, refused);
* refused: digit separators, ``+``, exponents, hexadecimal, fractional bytes once scaled."""

from __future__ import annotations

import difflib
import numbers
import operator
import re
from fractions import Fraction
from typing import Any

from .errors import ConfigError

KEEP_ALL = 2**64 - 1  #: Release threshold "keep all" (``UINT64_MAX``, the seeds' point): no release at a synchronize.
MAX_BYTES = 2**64 - 1  #: The largest size accepted anywhere (bytes): the driver's attributes are 64-bit unsigned.
ALIGNMENT = 256  #: Alignment (bytes) of every block handed out, as ``cuMemAlloc``'s; arena sizes are multiples.

DEFAULT_ARENA_MAX_BLOCK = 64 << 10  #: Default largest arena block (bytes): docs/guide.md, "The arena", says why.
DEFAULT_ARENA_SLAB_SIZE = 4 << 20  #: Default slab the arena takes from the mempool (bytes); docs/guide.md, the arena.

MIN_BARE_CAP = 1 << 20  #: A bare-number pool cap (no unit) under this many bytes is refused (:func:`parse_max_size`).
MIN_CACHE_BLOCK = 512  #: The caches' smallest block (bytes, ``host_blocks.MIN_BLOCK``): a smaller cap serves nothing.
MIN_FRACTION = 0.01  #: The smallest pool cap given as a fraction of device memory (1 %); see :func:`parse_max_size`.

SIZE_HELP = "bytes (e.g. 1048576) or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"

def release_limit(threshold: int) -> int | None:
    """The bytes a release threshold keeps, as the allocator's caches take it; None for :data:`KEEP_ALL`."""
    return None if threshold == KEEP_ALL else threshold


_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1}  #: lower-case unit -> bytes (bits spellings: :func:`_reads_as_bits`)
for _i, _prefix in enumerate("kmgtpe", start=1):
    _UNITS[f"{_prefix}b"] = 1000**_i
    _UNITS[f"{_prefix}ib"] = 1024**_i
_UNIT_NAMES = ["B", "KB", "MB", "GB", "TB", "PB", "EB", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]

_PLAIN_NUMBER = re.compile(r"^\s*([0-9]+(\.[0-9]*)?|\.[0-9]+)\s*$")
_SIZE = re.compile(r"^\s*(?P<sign>-?)\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*$")


def _reads_as_bits(unit: str) -> bool:
    """Whether ``unit`` is a bits spelling (``Mb``, ``Gb``, ``MIb``); ``kb``/``mb`` and ``kB`` are bytes."""
    return len(unit) >= 2 and unit.endswith("b") and unit[0].isupper()


def _size_error(value: Any, source: str, problem: str) -> ConfigError:
    return ConfigError(f"{source}={value!r} {problem}: expected {SIZE_HELP}")


def parse_size(value: Any, source: str) -> int:
    """Parse a size in bytes in this module's syntax, scaled exactly (``"1.5 GiB"`` is 1610612736).  :param source: what
    the value came from (a variable or ``install(name)``), quoted in the error.  :returns: bytes, from 0 to
    :data:`MAX_BYTES`.  :raises ConfigError: for other types (floats and bools too), unknown or bits units, digit
    separators, ``+``, negative or fractional bytes, sizes above 2**64 - 1."""
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
    """Bytes (:func:`parse_size`), or ``all``/``max``/``None``: :data:`KEEP_ALL`.  :raises ConfigError: otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("all", "max")):
        return KEEP_ALL
    try:
        return parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; or 'all' to keep every byte cached") from None


def parse_max_size(value: Any, source: str) -> int | float | None:
    """The private pool's cap: bytes (:func:`parse_size`), or a fraction of device memory (a float in
    [0.01, 1], ``"0.5"``, ``"50%"``); ``None``/``none``: no cap.  A bare number below 1 MiB (:data:`MIN_BARE_CAP`) or a
    fraction below 1 % is refused with a suggestion (docs/architecture.md, "Sizes"); a unit allows it.
    :raises ConfigError: for a fraction outside [0.01, 1], 0 bytes, bare < 1 MiB, or what :func:`parse_size` refuses."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):  # as the cache caps
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
    nbytes = _cap_bytes(value, source, "a pool", "or a fraction of device memory such as 0.5 or 50%, or 'none' for no cap")
    bare = not isinstance(value, str) or _PLAIN_NUMBER.match(value)
    if bare and nbytes < MIN_BARE_CAP:
        meant = ["'1.0' (100 %)"] if nbytes == 1 else [f"'{nbytes}%'"] if nbytes <= 100 else []
        meant.append(f"'{nbytes} MiB'")
        raise ConfigError(
            f"{source}={value!r} would cap the pool at {nbytes} bytes: did you mean {' or '.join(meant)}? "
            f"(a cap below 1 MiB needs its unit, e.g. '{nbytes} B')")
    return nbytes


def _checked_fraction(fraction: float, value: Any, source: str) -> float:
    """``fraction`` if in [:data:`MIN_FRACTION`, 1].  :raises ConfigError: otherwise, saying what is accepted."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"{source}={value!r} is not a fraction of device memory in (0, 1]: expected e.g. 0.5 or "
                          "50%, or a size such as 8 GiB")
    if fraction < MIN_FRACTION:
        raise ConfigError(f"{source}={value!r} would cap the pool at {fraction:.3g} of device memory, under 1 %: "
                          "a cap that small needs a size with its unit, e.g. '256 MiB'")
    return fraction


def parse_arena_size(value: Any, source: str) -> int:
    """An arena block or slab size (:func:`parse_size`): a positive multiple of 256 bytes, the alignment.
    :raises ConfigError: for a size that is not, or anything :func:`parse_size` refuses."""
    nbytes = parse_size(value, source)
    if nbytes < ALIGNMENT or nbytes % ALIGNMENT:
        down, up = nbytes // ALIGNMENT * ALIGNMENT, (nbytes // ALIGNMENT + 1) * ALIGNMENT
        nearest = f"{down} or {up}" if down else f"{up}"
        raise ConfigError(
            f"{source}={value!r} ({nbytes} bytes) is not a positive multiple of {ALIGNMENT} bytes, the arena's "
            f"block alignment: expected e.g. {nearest}")
    return nbytes


def parse_host_max_size(value: Any, source: str) -> int | None:
    """The pinned host cache's cap in bytes; ``None``/``none``: no cap.  :raises ConfigError: for 0, a bare number < 1
    MiB (as :func:`parse_max_size`), < :data:`MIN_CACHE_BLOCK` however spelt, or what :func:`parse_size` refuses."""
    return _optional_cap(value, source, "a host cache")


def parse_managed_max_size(value: Any, source: str) -> int | None:
    """The managed cache's cap: as :func:`parse_host_max_size`.  :raises ConfigError: as :func:`parse_host_max_size`."""
    return _optional_cap(value, source, "a managed memory cache")


def _optional_cap(value: Any, source: str, what: str) -> int | None:
    """A cache's cap: None for ``None``/``none``, else :func:`_cap_bytes` with :func:`parse_host_max_size`'s rules."""
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
    """A nonzero cap in bytes.  :raises ConfigError: for 0 or what :func:`parse_size` refuses, adding ``otherwise``."""
    try:
        nbytes = parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; {otherwise}") from None
    if nbytes == 0:
        raise ConfigError(f"{source}={value!r}: {what} capped at 0 bytes cannot serve anything; unset it for no cap")
    return nbytes
