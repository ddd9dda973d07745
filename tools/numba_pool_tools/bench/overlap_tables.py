"""The overlap part from the parent (``numba-pool-tools bench --part overlap``): the managers whose
workers run :mod:`numba_pool_tools.bench.overlap` (Numba's default manager, numba_pool, its arena:
each in a process of its own, the processes of a round taking lock-step turns, as the
end-to-end part's do), their figures read back and merged over rounds, ratios to default, the
self-checks and the table.

* **Figures** (:func:`figures`): ``batch_ms`` and ``serial_ms``, ``{figure: ms}``, for each
  stream count of :data:`~numba_pool_tools.bench.overlap.STREAMS` (``'2 streams'``), and the batches
  with ``using_stream`` (``'2 streams, using_stream'``) where the worker served numba_pool.
* **Ratios** (:func:`ratios_to_default`): x faster than default (default's time over the
  row's), paired round by round (:func:`numba_pool_tools.bench.device_tables.paired_ratio`); a batch
  with ``using_stream`` is compared with default's plain batch of as many streams (default has
  no allocation stream).
* **Overlap**: the kernels' time alone, back to back on one stream (the median over every
  worker and round: the kernels do not depend on the manager), over a batch's: 1 when the
  streams ran one after the other, N when N streams ran at once.
* **Self-checks** (:func:`check`): rounds more than 10 % apart (as the end-to-end tables'), and
  issue 33's targets (:data:`TARGETS`) for numba_pool in both modes: each batch at most
  :data:`MAX_TIME_RATIO` x default's time, and faster than default with ``using_stream``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from . import checks
from .device_tables import paired_ratio
from .end_to_end import ARENA, DEFAULT, NUMBA_POOL
from .host_tables import significant, times
from .labels import size_label
from .overlap import BATCH, ITERATIONS, REPEATS, SCOPED, SERIAL, STREAMS, TEMPORARY, figure

MODULE = "numba_pool_tools.bench.overlap"  # python -m MODULE: the overlap worker
TABLE = "overlap"  # the flags' table
MAX_TIME_RATIO = 1.05  # numba_pool's batch at most this many times default's
SERIAL_ROW = "kernels alone, back to back on one stream"
SCOPED_ROW = ", each allocation in using_stream(s)"  # after a manager's label: its batches with using_stream
#: The rows the targets hold for: numba_pool in both modes.
TARGET_ROWS = (NUMBA_POOL.label, ARENA.label)
#: Issue 33's targets, as ratios to default (x faster): numba_pool's batch at most 1.05x
#: default's time, with ``using_stream`` faster than default, at every stream count.
TARGETS = (*(checks.Target(TABLE, figure(n), 1 / MAX_TIME_RATIO) for n in STREAMS),
           *(checks.Target(TABLE, figure(n, True), 1.0, strictly=True) for n in STREAMS))


def managers(no_arena: bool = False) -> list:
    """The managers of the part (:class:`numba_pool_tools.bench.end_to_end.Manager`), their workers
    running :data:`MODULE`: default, numba_pool and, unless ``no_arena``, the arena."""
    chosen = [m for m in (DEFAULT, NUMBA_POOL, ARENA) if not (no_arena and m is ARENA)]
    return [dataclasses.replace(m, module=MODULE) for m in chosen]


def heading(rounds: int, core: int) -> str:
    """What the table's heading says after the setting: what a batch is and how it is timed."""
    return (f"stream overlap (CPU core {core}, collector off): N cuda.stream()s each running {ITERATIONS} x "
            f"(cuda.device_array of {size_label(TEMPORARY)} on the stream, a 1-block kernel of about 1 ms on it "
            f"writing it, drop it), issued interleaved from one thread, then synchronized; ms per batch (x faster "
            f"than default), the median of {REPEATS} batches after a warm-up, median over {rounds} rounds, each "
            f"manager in its own process, taking turns; overlap: the kernels' time alone over the batch's (1: the "
            f"streams ran one after the other, N: all at once); targets for {', '.join(TARGET_ROWS)}: at most "
            f"{MAX_TIME_RATIO:g}x default's time, faster than default with using_stream")


# -- reading the workers' figures --------------------------------------------------------------

def figures(result: dict) -> dict:
    """One worker's figures (its JSON line), checked: ``{BATCH: {figure: ms}, SERIAL: {figure:
    ms}, "using_stream": bool}``.

    :raises ValueError: naming what is missing or wrong: a field that is not an object, a
        figure missing (every stream count; with ``using_stream``, its batches too), a time that
        is not a positive finite number.
    """
    scoped = result.get("using_stream") is True
    wanted = {BATCH: [figure(n) for n in STREAMS] + [figure(n, True) for n in STREAMS] * scoped,
              SERIAL: [figure(n) for n in STREAMS]}
    parsed = {"using_stream": scoped}
    for field, names in wanted.items():
        values = result.get(field)
        if not isinstance(values, dict):
            raise ValueError(f"{field!r} is {type(values).__name__}, not an object of figures")
        for name in names:
            value = values.get(name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value > 0):
                raise ValueError(f"{field}[{name!r}] = {value!r} is not a positive time")
        parsed[field] = {name: float(values[name]) for name in names}
    return parsed


def median_over_rounds(rounds: list[dict]) -> dict:
    """One manager's figures over its rounds (:func:`figures` each): the median of each figure,
    and each figure's rounds (``rounds_batch_ms``, ``rounds_serial_ms``)."""
    merged = {"rounds": len(rounds), "using_stream": all(r["using_stream"] for r in rounds)}
    for field in (BATCH, SERIAL):
        names = [name for name in rounds[0][field] if all(name in r[field] for r in rounds)]
        merged[field] = {name: statistics.median(r[field][name] for r in rounds) for name in names}
        merged[f"rounds_{field}"] = {name: [r[field][name] for r in rounds] for name in names}
    return merged


def merge(per_round: dict[str, list[dict]]) -> dict[str, dict]:
    """``{label: [worker result per round]}`` read back (:func:`figures`), merged over rounds,
    with each row's ratios to default (``vs_default``, :func:`ratios_to_default`).

    :raises ValueError: naming the manager, when a worker's figures are unreadable.
    """
    results = {}
    for label, rounds in per_round.items():
        try:
            results[label] = median_over_rounds([figures(r) for r in rounds])
        except ValueError as err:
            raise ValueError(f"the overlap worker of {label} returned unreadable figures: {err}") from None
    for label, ratios in ratios_to_default(results).items():
        results[label]["vs_default"] = ratios
    return results


# -- ratios, checks --------------------------------------------------------------------------

def base(name: str) -> str:
    """The default figure a figure is compared with: ``'2 streams, using_stream'`` -> ``'2 streams'``."""
    return name.removesuffix(SCOPED)


def ratios_to_default(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per manager, each batch figure's x faster than default's batch of as many streams,
    paired round by round; empty without a default row."""
    default = results.get(DEFAULT.label)
    if default is None:
        return {}
    theirs = default[f"rounds_{BATCH}"]
    return {label: {name: paired_ratio(theirs[base(name)], rounds)
                    for name, rounds in merged[f"rounds_{BATCH}"].items() if base(name) in theirs}
            for label, merged in results.items()}


def keyed_ratios(results: dict[str, dict]) -> dict[tuple[str, str, str], float]:
    """The rows' ratios to default, default's own left out, as ``{(table, figure, row): x
    faster}``: the key of the targets and of the runs' comparison."""
    return {(TABLE, name, label): ratio for label, merged in results.items() if label != DEFAULT.label
            for name, ratio in merged.get("vs_default", {}).items()}


def serial_ms(results: dict[str, dict]) -> dict[str, float]:
    """The kernels' time alone for each stream count: the median over every worker's rounds."""
    return {figure(n): statistics.median(v for merged in results.values()
                                         for v in merged[f"rounds_{SERIAL}"].get(figure(n), []))
            for n in STREAMS if any(figure(n) in merged[SERIAL] for merged in results.values())}


def check(results: dict[str, dict]) -> list[checks.Flag]:
    """The failed checks: batches whose rounds disagree by more than
    :data:`numba_pool_tools.bench.checks.TOLERANCE`, and the :data:`TARGETS` a row of
    :data:`TARGET_ROWS` misses (or cannot be checked against: no default row)."""
    flags = []
    for label, merged in results.items():
        for name, values in merged[f"rounds_{BATCH}"].items():
            flag = checks.spread_flag(TABLE, name, label, values, "rounds")
            if flag:
                flags.append(flag)
    rows = [(TABLE, label) for label in TARGET_ROWS if label in results]
    return flags + checks.target_flags(keyed_ratios(results), TARGETS, rows)


# -- the table -------------------------------------------------------------------------------

def render(results: dict[str, dict], flags: list = ()) -> str:
    """The table: a row per manager, then per manager with ``using_stream`` figures, then the
    kernels alone; per stream count, ms per batch with x faster than default, and the overlap
    (the kernels' time alone over the batch's); a cell a check flagged ends in ``!``."""
    from tabulate import tabulate

    marked = checks.flagged(list(flags), TABLE)
    serial = serial_ms(results)
    headers = ["manager"]
    for n in STREAMS:
        headers += [f"{n} streams: ms per batch (x faster than default)", f"{n} streams: overlap"]
    rows = []
    for scoped in (False, True):
        for label, merged in results.items():
            if scoped and not merged["using_stream"]:
                continue
            row = [label + (SCOPED_ROW if scoped else "")]
            for n in STREAMS:
                row += _cells(merged, figure(n, scoped), label, serial.get(figure(n)), marked)
            rows.append(row)
    rows.append([SERIAL_ROW] + [cell for n in STREAMS for cell in (_ms(serial.get(figure(n))),
                                                                    "1.00" if figure(n) in serial else "-")])
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)



def _ms(value: float | None) -> str:
    return "-" if value is None else significant(value)


def _cells(merged: dict, name: str, label: str, serial: float | None, marked: set) -> list[str]:
    """A row's two cells at a figure: ms (x faster), and the overlap."""
    value = merged[BATCH].get(name)
    if value is None:
        return ["-", "-"]
    text = significant(value)
    ratio = merged.get("vs_default", {}).get(name)
    if ratio is not None:
        text += f" ({times(ratio)})"
    if (name, label) in marked:
        text += " !"
    return [text, "-" if serial is None else f"{serial / value:.2f}"]
