"""The host tables of ``numba-pool bench --part end-to-end``, in the parent process: which
workers run the host rows, their figures read back, medians over rounds, ratios to default,
self-checks and the two tables.  The rows are measured by :mod:`numba_pool.bench.host_worker`,
inside the workers of :mod:`numba_pool.bench.worker`.

* **Which workers** (:func:`parts_for`): default and numba_pool's (mempool, arena, baselines)
  run both host parts (``--host pinned,pipeline``); numba_pool's run with ``NUMBA_POOL_HOST=1``
  throughout, since the host cache is off by default (their ``cuda.device_array`` figures do
  not use pinned memory).  The anchors (RMM's and CuPy's plugins) run the pipeline only: they
  keep Numba's own pinned memory, as default does (the table's "pinned memory from" column
  says so from each worker), so their pinned rows would time default's path again, at about
  5 s a worker.  Their pipeline rows show what a device pool alone gives.  The floors have no
  host rows: their pinned memory is Numba's own too, and every device array of theirs aliases
  one buffer, so the pipeline's output could not be right.
* **Figures** (JSON, per manager): ``pinned_array_us`` and ``mapped_array_us`` (µs per
  allocate+free pair) and ``pipeline_ms`` (ms per batch), each ``{size in bytes: median over
  rounds}``; ``rounds_<field>`` and ``counts_<field>`` (operations per repeat), each
  ``{size: [one per round]}``; ``host_cache`` (every round's pinned memory came from
  numba_pool's cache); ``pinned_from`` (in words, from the first round); ``vs_default``
  (``{field: {size: default's time / the row's}}``).
* **Self-checks** (:class:`numba_pool.bench.checks.Flag`): rounds more than 10 % apart, as for
  the ``cuda.device_array`` table; and a row run with ``NUMBA_POOL_HOST=1`` whose pinned memory
  did not come from the cache (then its figures are Numba's, not numba_pool's).  There is no
  floor in these tables, hence no floor check.  A flagged cell ends in ``!``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from . import checks
from .device_tables import ratio_to_default
from .host_worker import FIELDS, MAPPED, PARTS, PINNED, PIPELINE, SIZES
from .labels import ANCHORS, BASELINE_SUFFIX, DEFAULT, NOOP_FLOOR, REFERENCE, size_label

HOST_TABLE = "pinned alloc+free"
PIPELINE_TABLE = "batch pipeline"
TABLE_OF = {PINNED: HOST_TABLE, MAPPED: HOST_TABLE, PIPELINE: PIPELINE_TABLE}
NAME_OF = {PINNED: "pinned_array", MAPPED: "mapped_array", PIPELINE: "batch"}
HOST_VARIABLE = "NUMBA_POOL_HOST"
EVERY_SIZE = "every size"  # a flag's figure when it concerns a whole row
FLOORS = (NOOP_FLOOR, REFERENCE)
FLOORS_NOTE = ("no-op floor, Numba alone: no host rows: their pinned memory is Numba's own, as default's, "
               "and their device arrays all alias one buffer, so the pipeline's output could not be right")
ANCHORS_NOTE = ("{labels}: batch pipeline only: their pinned memory is Numba's own, as default's "
                "(pinned_array and mapped_array rows would time default's path again)")


def parts_for(label: str) -> tuple[str, ...]:
    """The host parts the worker of ``label`` runs: none for the floors, the pipeline for the
    anchors, both for the others (default, numba_pool's rows and their baselines)."""
    row = label.removesuffix(BASELINE_SUFFIX)
    if row in FLOORS:
        return ()
    if row in ANCHORS:
        return ("pipeline",)
    return PARTS


def plan(managers: list) -> tuple[list, list[str]]:
    """``managers`` (:class:`numba_pool.bench.end_to_end.Manager`) with their host parts as worker
    arguments (``--host PARTS``, :func:`parts_for`), numba_pool's with ``NUMBA_POOL_HOST=1``;
    and a note for the floors and one for the anchors, where there are any."""
    planned, floors, anchors = [], False, []
    for manager in managers:
        parts = parts_for(manager.label)
        floors = floors or not parts
        if parts == ("pipeline",):
            anchors.append(manager.label)
        if not parts:
            planned.append(manager)
            continue
        env = manager.env
        if env.get("NUMBA_CUDA_MEMORY_MANAGER") == "numba_pool":
            env = {**env, HOST_VARIABLE: "1"}
        planned.append(dataclasses.replace(manager, env=env, args=("--host", ",".join(parts))))
    notes = [FLOORS_NOTE] if floors else []
    return planned, notes + ([ANCHORS_NOTE.format(labels=", ".join(anchors))] if anchors else [])


def figure_name(field: str, size: str | int) -> str:
    """``(PINNED, '4096')`` -> ``'pinned_array 4 KiB'``, ``(PIPELINE, '4096')`` -> ``'batch 4 KiB'``:
    a cell's name in flags and headers."""
    return f"{NAME_OF[field]} {size_label(int(size))}"


# -- reading the workers' figures --------------------------------------------------------------

def host_figures(result: dict) -> dict | None:
    """The host part of one worker's result (its JSON line), checked: ``None`` when it has none
    (no host part asked for, or a numba_pool from before the host rows); else
    ``{field: {size: time}, "counts": {field: {size: count}}, "repeats", "host_cache",
    "pinned_from"}``.

    :raises ValueError: naming what is wrong, when it is there but malformed: no field, a size
        that is not a byte count, a time that is not a positive finite number, a count that is
        not a positive whole number.
    """
    host = result.get("host")
    if host is None:
        return None
    if not isinstance(host, dict):
        raise ValueError(f"'host' is {type(host).__name__}, not an object")
    fields = [f for f in FIELDS if f in host]
    if not fields:
        raise ValueError(f"'host' has none of {', '.join(FIELDS)}")
    if not _is_count(host.get("repeats")):
        raise ValueError(f"'host' repeats = {host.get('repeats')!r} is not a positive count")
    parsed = {"repeats": host["repeats"], "host_cache": host.get("host_cache") is True,
              "pinned_from": str(host.get("pinned_from", "-")), "counts": {}}
    for field in fields:
        parsed[field] = _sizes_to_numbers(host[field], field, _is_time)
        counts = host.get("counts", {}).get(field)
        if counts is not None:
            parsed["counts"][field] = _sizes_to_numbers(counts, f"counts.{field}", _is_count)
    return parsed


def _is_time(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _sizes_to_numbers(values, what: str, valid) -> dict:
    if not isinstance(values, dict) or not values:
        raise ValueError(f"{what} is not a non-empty object of sizes")
    for size, value in values.items():
        if not str(size).isdigit():
            raise ValueError(f"{what}: {size!r} is not a size in bytes")
        if not valid(value):
            kind = "count" if valid is _is_count else "time"
            raise ValueError(f"{what}[{size}] = {value!r} is not a positive {kind}")
    return {str(size): value for size, value in values.items()}


def collect(per_round: dict[str, list[dict]], asked: set[str]) -> tuple[dict[str, list[dict]], list[str]]:
    """The host figures of every manager in ``asked`` (labels), round by round, from
    ``{label: [worker result, ...]}``; and one note per manager in ``asked`` left out (no host
    figures, or unreadable ones)."""
    rounds, notes = {}, []
    for label, results in per_round.items():
        if label not in asked:
            continue
        try:
            parsed = [p for p in map(host_figures, results) if p is not None]
        except ValueError as err:
            notes.append(f"{label}: no host rows, its worker's host figures are unreadable: {err}")
            continue
        if parsed:
            rounds[label] = parsed
        else:
            notes.append(f"{label}: no host rows, its worker returned none (a numba_pool without bench_host?)")
    return rounds, notes


# -- medians, ratios, checks -------------------------------------------------------------------

def median_over_rounds(rounds: list[dict]) -> dict:
    """One manager's host figures over its rounds (:func:`host_figures` each): the median of
    each cell, each cell's rounds (``rounds_<field>``) and counts (``counts_<field>``), and
    ``host_cache`` true only if it was in every round.  Cells missing from a round are left out."""
    merged = {"rounds": len(rounds), "repeats": rounds[0]["repeats"],
              "host_cache": all(r["host_cache"] for r in rounds), "pinned_from": rounds[0]["pinned_from"]}
    for field in FIELDS:
        sizes = [s for s in rounds[0].get(field, {}) if all(s in r.get(field, {}) for r in rounds)]
        if not sizes:
            continue
        merged[field] = {s: statistics.median(r[field][s] for r in rounds) for s in sizes}
        merged[f"rounds_{field}"] = {s: [r[field][s] for r in rounds] for s in sizes}
        merged[f"counts_{field}"] = {s: [r["counts"].get(field, {}).get(s) for r in rounds] for s in sizes}
    return merged


def ratios_to_default(results: dict[str, dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Per manager, ``{field: {size: x faster than default}}`` for the cells default has too:
    the median over rounds of default's time over the manager's in the same round
    (:func:`numba_pool.bench.device_tables.ratio_to_default`), or the ratio of the medians where rounds are not
    kept; empty without a default row."""
    default = results.get(DEFAULT)
    if default is None:
        return {}
    return {label: {field: {s: ratio_to_default(default, r, field, s) for s in r[field] if s in default[field]}
                    for field in FIELDS if field in r and field in default}
            for label, r in results.items()}


def rounds_flags(results: dict[str, dict]) -> list[checks.Flag]:
    """Cells whose rounds disagree by more than :data:`numba_pool.bench.checks.TOLERANCE`."""
    flags = []
    for label, merged in results.items():
        for field in FIELDS:
            for size, values in merged.get(f"rounds_{field}", {}).items():
                flag = checks.spread_flag(TABLE_OF[field], figure_name(field, size), label, values, "rounds")
                if flag:
                    flags.append(flag)
    return flags


def host_cache_flags(results: dict[str, dict], expected: set[str]) -> list[checks.Flag]:
    """A flag per table for each row in ``expected`` (run with ``NUMBA_POOL_HOST=1``) whose
    pinned memory did not come from numba_pool's host cache in every round."""
    flags = []
    for label in expected:
        merged = results.get(label)
        if merged is None or merged["host_cache"]:
            continue
        for table in dict.fromkeys(TABLE_OF[f] for f in FIELDS if f in merged):
            flags.append(checks.Flag(table, EVERY_SIZE, label, "its pinned memory did not come from numba_pool's "
                                     f"host cache although {HOST_VARIABLE}=1: these are Numba's figures"))
    return flags


# -- the tables --------------------------------------------------------------------------------

def significant(value: float, digits: int = 4) -> str:
    """``value`` with ``digits`` significant digits, no exponent: 5.2 -> '5.200', 46012.3 -> '46012'."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    return f"{value:.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


def times(ratio: float) -> str:
    """A ratio to default as ``x faster``: '2.91x', '25.3x', '4512x'."""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x" if ratio < 100 else f"{ratio:.0f}x"


def render_host(results: dict[str, dict], flags: list = ()) -> str:
    """The pinned table: per manager, where its pinned memory came from and µs per
    ``pinned_array`` and ``mapped_array`` allocate+free pair at each size, with how many times
    faster than default it is (``(216x)``); a flagged cell ends in ``!``."""
    return _render(results, flags, (PINNED, MAPPED), "us")


def render_pipeline(results: dict[str, dict], flags: list = ()) -> str:
    """The batch-pipeline table: per manager, ms per batch at each batch size, as
    :func:`render_host`."""
    return _render(results, flags, (PIPELINE,), "ms")


def _render(results: dict[str, dict], flags: list, fields: tuple, unit: str) -> str:
    from tabulate import tabulate

    marked = checks.flagged(list(flags), TABLE_OF[fields[0]])
    ratios = ratios_to_default(results)
    suffix = f" {unit} (x faster)" if ratios else f" {unit}"
    headers = ["manager", "pinned memory from"] + [figure_name(f, s) + suffix for f in fields for s in SIZES]
    rows = []
    for label, merged in results.items():
        if not any(f in merged for f in fields):
            continue
        row = [label, merged["pinned_from"]]
        row += [_cell(merged, ratios.get(label, {}), f, str(s), label, marked) for f in fields for s in SIZES]
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _cell(merged: dict, ratios: dict, field: str, size: str, label: str, marked: set) -> str:
    value = merged.get(field, {}).get(size)
    if value is None:
        return "-"
    text = significant(value)
    ratio = ratios.get(field, {}).get(size)
    if ratio is not None:
        text += f" ({times(ratio)})"
    if (figure_name(field, size), label) in marked or (EVERY_SIZE, label) in marked:
        text += " !"
    return text
