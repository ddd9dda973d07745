"""Reading an allocation log: RMM's logging format (what RMM's ``logging_resource_adaptor``
writes: pointers and streams in hex with or without ``0x``), or ``NUMBA_POOL_LOG``'s, which adds
a seventh column, Kind (``device``, ``managed`` or ``graph``; device memory through numba_pool's other doors
names the door, ``cuda.core``, ``cupy`` or ``torch``, and replays as ``device``); plain or gzip, validated line by line, held
as compact columns (:class:`Operations`).  Replay is of device memory through the arena:
managed rows are read, checked and counted (:attr:`ParsedLog.managed`), not replayed; nor are
``graph`` rows (allocation nodes of CUDA graphs, :attr:`ParsedLog.graph`).

A line's fields are exact: the size a whole number of bytes in decimal digits (``100``, not
``100.0``, ``+100`` or ``1_000``); the pointer and the stream hexadecimal digits with or without
``0x`` (not ``0x10_00``); quoted fields as CSV allows, a quote left open being an error."""

from __future__ import annotations

import codecs
import csv
import gzip
import os
import re
import time
import zlib
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from numba_pool.observe.alloclog import ACTIONS, HEADER, KINDS

__all__ = ["LogError", "Operation", "Operations", "ParsedLog", "read_log", "parse_log", "LEGACY_KEY"]

#: The legacy default stream's handle; stream 0 in a log means it too.
LEGACY_KEY = 1
#: Pointers, sizes and streams are 64-bit: a value at or above this is an error.
_LIMIT = 1 << 64
#: Characters of a line or field quoted in an error message.
_SHOWN = 120
#: Lines between two calls of a reading progress callback, and operations between two calls of
#: a replay progress callback (powers of two: a mask test on the hot path).
PROGRESS_EVERY = 1 << 15
ALLOCATE, FREE = 0, 1  # Operations.actions codes
#: Bytes that send a line to the exact path: ``int()`` takes ``_`` and ``+`` in numbers, which
#: the format does not, and a quote changes how the line splits.
_NOT_FAST = b'_+"'
_ACTION_NAMES = ("allocate", "free")
#: RMM's header: numba_pool's without the Kind column.
RMM_HEADER = HEADER[:6]
_MANAGED = b"managed"


class LogError(ValueError):
    """A log that cannot be replayed; the message names the file, the line number and the line
    (quoted, cut to 120 characters)."""


@dataclass(frozen=True)
class Operation:
    """One replayable line: ``action`` is ``allocate`` or ``free``; ``size`` in bytes (for a
    free, the size of the allocation it frees); ``line`` counts from 1, the header's."""

    line: int
    action: str
    pointer: int
    size: int
    stream: int


class Operations(Sequence):
    """The operations of a log in compact columns: :attr:`actions` (0 allocate, 1 free),
    :attr:`pointers`, :attr:`sizes` (bytes), :attr:`streams` (handles, 1 for the legacy stream)
    and :attr:`lines`.  Indexing or iterating gives :class:`Operation` objects, made on demand."""

    def __init__(self):
        self.actions = bytearray()
        self.pointers = array("Q")
        self.sizes = array("Q")
        self.streams = array("Q")
        self.lines = array("Q")

    @classmethod
    def of(cls, operations: Iterable[Operation]) -> Operations:
        """Columns holding ``operations`` (any iterable of :class:`Operation`)."""
        ops = cls()
        for op in operations:
            ops.append(op.line, _ACTION_NAMES.index(op.action), op.pointer, op.size, op.stream)
        return ops

    def append(self, line: int, action: int, pointer: int, size: int, stream: int) -> None:
        self.actions.append(action)
        self.pointers.append(pointer)
        self.sizes.append(size)
        self.streams.append(stream)
        self.lines.append(line)

    def __len__(self) -> int:
        return len(self.actions)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return Operation(self.lines[index], _ACTION_NAMES[self.actions[index]], self.pointers[index],
                         self.sizes[index], self.streams[index])

    def __iter__(self) -> Iterator[Operation]:
        for line, action, pointer, size, stream in zip(self.lines, self.actions, self.pointers, self.sizes,
                                                       self.streams):
            yield Operation(line, _ACTION_NAMES[action], pointer, size, stream)

    @property
    def nbytes(self) -> int:
        """Bytes the columns take (their allocated capacity may be up to 1/8 more)."""
        return len(self.actions) + 8 * (len(self.pointers) + len(self.sizes) + len(self.streams) + len(self.lines))


@dataclass
class ParsedLog:
    """A validated log, ready to replay (any number of times)."""

    operations: Operations
    skipped: Counter = field(default_factory=Counter)  # reason -> lines skipped
    failures: int = 0  # "allocate failure" lines (nothing to replay)
    managed: int = 0  # rows of managed memory (Kind column "managed"): read, not replayed
    graph: int = 0  # rows of graph memory (Kind column "graph", allocated in a capture): read, not replayed
    source: str = "log"  # the file it came from
    allocations: int = 0  # allocate operations among :attr:`operations`
    lines: int = 0  # lines read, the header's included
    bytes_read: int = 0  # bytes of the file (compressed bytes for a gzip file); 0 when unknown
    seconds: float = 0.0  # wall time spent reading and validating

    def __post_init__(self):
        if not isinstance(self.operations, Operations):  # a list of Operation, built by hand
            self.operations = Operations.of(self.operations)
            self.allocations = sum(a == ALLOCATE for a in self.operations.actions)


# -- reading ----------------------------------------------------------------------------------

def _clip(text: str) -> str:
    """``text`` quoted, cut to :data:`_SHOWN` characters with the full length said."""
    if len(text) <= _SHOWN:
        return repr(text)
    return f"{text[:_SHOWN]!r}... ({len(text):,} characters)"


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace").rstrip("\r\n")


#: A pointer or stream field: hexadecimal digits, with or without ``0x`` (RMM writes both).
_HEX = re.compile(r"(0[xX])?[0-9a-fA-F]+")


def _hex(text: str, what: str) -> int:
    if text.startswith("-") and _HEX.fullmatch(text[1:]):
        raise ValueError(f"{what} {_clip(text)} is negative")
    if not _HEX.fullmatch(text):
        raise ValueError(f"{what} {_clip(text)} is not hexadecimal (digits 0-9 and a-f, with or without 0x)")
    value = int(text, 16)
    if value >= _LIMIT:
        raise ValueError(f"{what} {_clip(text)} does not fit in 64 bits")
    return value


def _parse_row(raw: bytes, header: tuple[str, ...]) -> tuple[str, int, int, int, str] | None:
    """The slow, exact path for a line the fast path did not take: None for a blank line.
    Returns ``(action, pointer, size, stream, kind)``; the kind is ``device`` in RMM's format.

    :raises ValueError: saying what is wrong with the line.
    """
    text = _text(raw)
    if not text.strip():
        return None
    if '"' in text:  # quoted fields: what csv allows, although loggers do not write them
        try:
            row = next(csv.reader([text], strict=True))  # strict: an unclosed quote is an error
        except csv.Error as err:
            raise ValueError(f"not a CSV row ({err})") from None
    else:
        row = text.split(",")
    if len(row) != len(header):
        raise ValueError(f"expected {len(header)} fields ({','.join(header)}), found {len(row)}")
    _thread, _time, action, pointer, size, stream, *kind = (f.strip() for f in row)
    kind = kind[0] if kind else "device"
    if kind not in KINDS:
        raise ValueError(f"kind {_clip(kind)} is not one of {', '.join(KINDS)}")
    if action not in ACTIONS:
        raise ValueError(f"action {_clip(action)} is not one of {', '.join(ACTIONS)}")
    if size.startswith("-") and size[1:].isdigit():
        raise ValueError(f"size {_clip(size)} is negative")
    if not (size.isascii() and size.isdigit()):
        raise ValueError(f"size {_clip(size)} is not a whole number of bytes in decimal digits")
    if len(size) > 20 or int(size) >= _LIMIT:
        raise ValueError(f"size {_clip(size)} does not fit in 64 bits")
    return action, _hex(pointer, "pointer"), int(size), _hex(stream, "stream"), kind


def _parse(lines: Iterator[bytes], source: str, skip_bad_lines: bool,
           progress: Callable[[], None] | None, header: tuple[str, ...] = HEADER) -> ParsedLog:
    """Validate the lines after the header (bytes, line ends included) into a :class:`ParsedLog`.
    ``header`` is the file's: numba_pool's (with Kind) or RMM's.

    The hot loop takes well-formed lines without decoding them (``int`` reads bytes); anything
    else goes to :func:`_parse_row`, which decodes, explains and accepts CSV quoting.
    """
    start = time.perf_counter()
    ops = Operations()
    actions, pointers, sizes, streams, line_numbers = (
        ops.actions.append, ops.pointers.append, ops.sizes.append, ops.streams.append, ops.lines.append)
    parsed = ParsedLog(ops, source=source)
    # pointer -> size of its live allocation, or -1 once freed (tells a double free from a free
    # of a pointer never allocated).  One entry per distinct pointer.
    state: dict[int, int] = {}
    get = state.get
    allocations = 0
    allocate, free = b"allocate", b"free"
    columns = len(header)
    with_kind = columns == len(HEADER)
    device_kinds = (b"device", b"device\n", b"device\r\n")
    line = 1

    def bad(line: int, raw: bytes, reason: str, kind: str) -> None:
        if not skip_bad_lines:
            raise LogError(f"{source}: line {line}: {_clip(_text(raw))}: {reason}")
        parsed.skipped[kind] += 1

    try:
        for raw in lines:
            line += 1
            if progress is not None and not line & (PROGRESS_EVERY - 1):
                progress()
            parts = raw.split(b",")
            action = None
            # int() also takes "1_000", "+100" and "0x10_00", which the log's format does not,
            # and a quote makes the split wrong: such lines go to the exact path.  (One
            # translate, ~75 ns a line; three `in` tests took ~290 ns.)
            if (len(parts) == columns and len(raw.translate(None, _NOT_FAST)) == len(raw)
                    and (not with_kind or parts[6] in device_kinds)):
                action = parts[2]
                try:
                    pointer, size, stream = int(parts[3], 16), int(parts[4]), int(parts[5], 16)
                except ValueError:
                    action = None
                else:
                    every = pointer | size | stream
                    if every < 0 or every >= _LIMIT:
                        action = None
            if action != allocate and action != free:
                try:
                    row = _parse_row(raw, header)
                except ValueError as err:
                    bad(line, raw, str(err), "unparsable")
                    continue
                if row is None:
                    continue
                text_action, pointer, size, stream, kind = row
                if kind == "managed":
                    parsed.managed += 1
                    continue
                if kind == "graph":
                    parsed.graph += 1
                    continue
                if text_action == "allocate failure":
                    parsed.failures += 1
                    continue
                action = allocate if text_action == "allocate" else free
            if not stream:
                stream = LEGACY_KEY
            if action == allocate:
                previous = get(pointer)
                if previous is not None and previous >= 0:
                    bad(line, raw, f"allocation of {pointer:#x}, which is still allocated", "allocation of a live pointer")
                    continue
                state[pointer] = size
                allocations += 1
                actions(ALLOCATE)
            else:
                allocated = get(pointer)
                if allocated is None or allocated < 0:
                    reason = "free of a pointer never allocated" if allocated is None else "double free"
                    bad(line, raw, f"{reason} ({pointer:#x})", reason)
                    continue
                # RMM and NUMBA_POOL_LOG write a free's size equal to its allocation's: another size
                # means a damaged or misordered log, whose replay would count the wrong bytes.
                if size != allocated:
                    bad(line, raw, f"free of {pointer:#x} with size {size}, but it was allocated with size {allocated}",
                        "free size differs from its allocation's")
                    continue
                state[pointer] = -1
                actions(FREE)
            pointers(pointer)
            sizes(size)
            streams(stream)
            line_numbers(line)
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:  # from reading a gzip file
        raise LogError(f"{source}: line {line + 1}: damaged gzip file ({err or 'it ends early'})") from None
    parsed.allocations = allocations
    parsed.lines = line
    parsed.seconds = time.perf_counter() - start
    return parsed


def _check_header(first: bytes | None, source: str) -> tuple[str, ...]:
    """The file's header, numba_pool's or RMM's.

    :raises LogError: for neither, an empty file, UTF-16 or non-UTF-8 text."""
    expected = ",".join(HEADER) + f" (or RMM's {','.join(RMM_HEADER)})"
    if first is None or not first.strip():
        raise LogError(f"{source}: line 1: the file is empty: expected the header {expected}")
    if first.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise LogError(f"{source}: line 1: the file is UTF-16 text: convert it to UTF-8 "
                       f"(iconv -f UTF-16 -t UTF-8), a CSV log with the header {expected}")
    try:
        text = first.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise LogError(f"{source}: line 1: not a text file (byte {first[err.start]:#04x} at offset {err.start} "
                       f"is not UTF-8): expected a CSV allocation log with the header {expected}") from None
    text = text.rstrip("\r\n")
    header = tuple(f.strip() for f in text.split(","))
    if header not in (HEADER, RMM_HEADER):
        raise LogError(f"{source}: line 1: {_clip(text)}: expected the header {expected}")
    return header


def _shown(value) -> str:
    """``value`` for a message: its type and its repr, cut to :data:`_SHOWN` characters."""
    text = repr(value)
    return f"{text[:_SHOWN]}{'...' * (len(text) > _SHOWN)} ({type(value).__name__})"


def checked_path(path, what: str, expected: str = "a str or os.PathLike") -> str:
    """``path`` as a ``str``, for messages and ``open``.

    :raises TypeError: for anything but a ``str``, ``bytes`` or ``os.PathLike`` (``open`` takes an
        int as a file descriptor), naming ``what`` and the value, and saying ``expected``."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{what}={_shown(path)} is not a file path: expected {expected}")
    return os.fsdecode(path)  # a bytes path too, so that messages show it as text


def parse_log(lines: Iterable[str] | Iterable[bytes], skip_bad_lines: bool = False, source: str = "log") -> ParsedLog:
    """Parse and validate a log from its lines.

    :param lines: the lines, header first, as ``str`` (a file opened in text mode) or ``bytes``
        (in binary mode); a byte-order mark before the header is skipped.
    :param skip_bad_lines: count bad lines by reason (:attr:`ParsedLog.skipped`) instead of raising.
    :param source: the file's name, for messages.
    :raises LogError: naming ``source``, the line number and its content, for a missing header,
        a line that does not parse, a free of a pointer never allocated or already freed, or
        an allocation of a pointer that is still live, a free whose size is not its allocation's.
        A missing header is an error even with ``skip_bad_lines``.
    :raises TypeError: for a single string or bytes object (a log's whole text: pass
        ``text.splitlines()``), no iterable at all, or lines that are neither ``str`` nor ``bytes``,
        naming the type.
    """
    if isinstance(lines, (str, bytes, bytearray)):
        raise TypeError(f"parse_log takes the log's lines, not one {type(lines).__name__} "
                        f"(pass text.splitlines(), or a file opened in text or binary mode)")
    if not isinstance(skip_bad_lines, bool):
        raise TypeError(f"skip_bad_lines must be True or False, not {skip_bad_lines!r}")
    try:
        it = iter(lines)
    except TypeError:  # iter()'s own words, "'NoneType' object is not iterable", name no argument
        raise TypeError(f"parse_log: lines={_shown(lines)} is not an iterable of lines: pass text.splitlines(), "
                        "or a file opened in text or binary mode") from None
    first = next(it, None)
    if first is not None and not isinstance(first, (str, bytes, bytearray)):
        raise TypeError(f"parse_log: line 1 of {source} is a {type(first).__name__} ({first!r}), not str or bytes")
    if isinstance(first, str):
        first = first.encode("utf-8", "surrogateescape")
        it = (line.encode("utf-8", "surrogateescape") for line in it)
    header = _check_header(first, source)
    return _parse(it, source, skip_bad_lines, None, header)


def read_log(path: str | os.PathLike, skip_bad_lines: bool = False,
             progress: Callable[[int], None] | None = None) -> ParsedLog:
    """Read and validate the log in the file ``path`` (plain or gzip-compressed).

    :param skip_bad_lines: as for :func:`parse_log`.
    :param progress: called with the bytes of the file read so far (compressed bytes for a gzip
        file; compare with ``os.path.getsize(path)``), every 32,768 lines and at the end; for a
        pipe (a FIFO, ``/dev/stdin``), which has no position, with 0.
    :raises LogError: as :func:`parse_log`; also for a file that is not UTF-8 text (its name,
        line 1, and the offending byte), UTF-16 text, or a damaged gzip file (its name and the
        line reached).
    :raises OSError: when the file cannot be opened or read.
    :raises TypeError: when ``path`` is not a file path (an int would be taken as an open file
        descriptor), or ``skip_bad_lines`` is not True or False.
    """
    source = checked_path(path, "read_log: path")
    if not isinstance(skip_bad_lines, bool):
        raise TypeError(f"skip_bad_lines must be True or False, not {skip_bad_lines!r}")
    with open(source, "rb") as raw:
        f = gzip.GzipFile(fileobj=raw, mode="rb") if raw.peek(2)[:2] == b"\x1f\x8b" else raw
        lines = iter(f)
        # A pipe (a FIFO, /dev/stdin, <(zcat ...)) has no position ("Illegal seek"): 0 bytes read.
        tell = raw.tell if raw.seekable() else (lambda: 0)
        report = (lambda: progress(tell())) if progress is not None else None
        try:
            first = next(lines, None)
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise LogError(f"{source}: line 1: damaged gzip file ({err or 'it ends early'})") from None
        header = _check_header(first, source)
        parsed = _parse(lines, source, skip_bad_lines, report, header)
        parsed.bytes_read = tell()
    if progress is not None:
        progress(parsed.bytes_read)
    return parsed
