"""The host tables of ``numba-pool-tools bench --part end-to-end``, pinned and managed memory, in the
parent process: which workers run the host rows, their figures read back, medians over rounds,
ratios to default, self-checks and the tables (:data:`TABLES`).  The rows are measured by
:mod:`numba_pool_tools.bench.host_worker`, inside the workers of :mod:`numba_pool_tools.bench.worker`.

* **Which workers** (:func:`plan`): default and numba_pool's (mempool, arena, baselines) run
  every host part of the kinds of memory asked for (``--host PARTS``, of ``pinned``,
  ``pipeline``, ``managed`` and ``managed-pipeline``); numba_pool's run with ``NUMBA_POOL_HOST=1`` for the pinned parts, since
  the host cache is off by default, and ``NUMBA_POOL_MANAGED=1`` for the managed parts (on by
  default; set so that the parent's environment cannot turn it off); their
  ``cuda.device_array`` figures use neither.  The anchors (RMM's and CuPy's plugins) run the
  pinned pipeline only: they keep Numba's own pinned and managed memory, as default does (the
  tables' "memory from" column says so from each worker), so their pinned and managed rows
  would time default's path again, at about 5 s a worker.  Their pipeline rows show what a
  device pool alone gives.  The floors have no host rows: their pinned and managed memory is
  Numba's own too, and every device array of theirs aliases one buffer, so the pipeline's output
  could not be right.  A baseline runs the parts its numba_pool's worker knows
  (:func:`known_parts`).  Without the ``cuda.device_array`` rows (``--no-device-rows``), the
  workers get ``--no-device`` and a worker left with nothing to time is not started.
* **Figures** (JSON, per manager): ``pinned_array_us``, ``mapped_array_us`` and
  ``managed_array_us`` (µs per allocate+free pair), ``pipeline_ms`` and ``managed_pipeline_ms``
  (ms per batch), each ``{size in bytes: median over rounds}``; ``rounds_<field>`` and
  ``counts_<field>`` (operations per repeat), each ``{size: [one per round]}``; ``host_cache``
  and ``managed_cache`` (every round's pinned, managed memory came from numba_pool's cache);
  ``pinned_from`` and ``managed_from`` (in words, from the first round); ``vs_default``
  (``{field: {size: default's time / the row's}}``).
* **Self-checks** (:class:`numba_pool_tools.bench.checks.Flag`): rounds more than 10 % apart, as for
  the ``cuda.device_array`` table; a row run with ``NUMBA_POOL_HOST=1`` or
  ``NUMBA_POOL_MANAGED=1`` whose memory of that kind did not come from the cache (then its
  figures are Numba's, not numba_pool's); and the managed targets of issue 21
  (:data:`MANAGED_TARGETS`) for numba_pool's rows in both modes.  There is no floor in these
  tables, hence no floor check.  A flagged cell ends in ``!``.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import subprocess
import sys

from . import checks, launch
from .device_tables import ratio_to_default
from .host_worker import (FIELDS, MANAGED, MANAGED_MEMORY, MANAGED_PARTS, MANAGED_PIPELINE, MAPPED, MEMORIES, PARTS,
                          PINNED, PINNED_MEMORY, PINNED_PARTS, PIPELINE, SIZES, Memory)
from .labels import ANCHORS, ARENA, BASELINE_SUFFIX, DEFAULT, NOOP_FLOOR, NUMBA_POOL, REFERENCE, size_label

HOST_TABLE = "pinned alloc+free"
PIPELINE_TABLE = "batch pipeline"
MANAGED_TABLE = "managed alloc+free"
MANAGED_PIPELINE_TABLE = "managed pipeline"
TABLE_OF = {PINNED: HOST_TABLE, MAPPED: HOST_TABLE, PIPELINE: PIPELINE_TABLE, MANAGED: MANAGED_TABLE,
            MANAGED_PIPELINE: MANAGED_PIPELINE_TABLE}
NAME_OF = {PINNED: "pinned_array", MAPPED: "mapped_array", PIPELINE: "batch", MANAGED: "managed_array",
           MANAGED_PIPELINE: "managed batch"}
HOST_VARIABLE = "NUMBA_POOL_HOST"
MANAGED_VARIABLE = "NUMBA_POOL_MANAGED"
VARIABLE_OF = {PINNED_MEMORY.name: HOST_VARIABLE, MANAGED_MEMORY.name: MANAGED_VARIABLE}
EVERY_SIZE = "every size"  # a flag's figure when it concerns a whole row
FLOORS = (NOOP_FLOOR, REFERENCE)
FLOORS_NOTE = ("no-op floor, Numba alone: no host rows: their pinned memory is Numba's own, as default's, "
               "and their device arrays all alias one buffer, so the pipeline's output could not be right")
ANCHORS_NOTE = ("{labels}: batch pipeline only: their pinned memory is Numba's own, as default's "
                "(pinned_array and mapped_array rows would time default's path again)")
MANAGED_NOTE = ("{labels}: no managed rows: their managed memory is Numba's own (cuMemAllocManaged per array), "
                "as default's, so their rows would time default's path again")
UNKNOWN_NOTE = "{label}: no {parts} rows: the worker of the numba_pool it imports does not know them (older)"
IDLE_NOTE = "{labels}: not run: without the cuda.device_array rows (--no-device-rows) they have nothing to time"
#: The rows the managed targets hold for: numba_pool in both modes (not the baselines: other versions).
TARGET_ROWS = (NUMBA_POOL, ARENA)
PROBE = "from {package}.host_worker import PARTS; print(','.join(PARTS))"  # package: launch.worker_package's


def figure_name(field: str, size: str | int) -> str:
    """``(PINNED, '4096')`` -> ``'pinned_array 4 KiB'``, ``(PIPELINE, '4096')`` -> ``'batch 4 KiB'``:
    a cell's name in flags and headers (size in bytes)."""
    return f"{NAME_OF[field]} {size_label(int(size))}"


#: The issue's targets for managed memory (issue 21): numba_pool's managed allocate+free at least
#: 2x faster than default at 4 KiB and 5x at 64 MiB; its managed pipeline faster at every size.
MANAGED_TARGETS = (checks.Target(MANAGED_TABLE, figure_name(MANAGED, 4 << 10), 2.0),
                   checks.Target(MANAGED_TABLE, figure_name(MANAGED, 64 << 20), 5.0),
                   *(checks.Target(MANAGED_PIPELINE_TABLE, figure_name(MANAGED_PIPELINE, s), 1.0, strictly=True)
                     for s in SIZES))


@dataclasses.dataclass(frozen=True)
class Table:
    """A host table: its name (the flags' table), its columns (fields, each at every size), their
    unit, the memory it times, and what its heading says a cell is."""

    name: str
    fields: tuple[str, ...]
    unit: str  # "us" or "ms"
    memory: Memory
    title: str
    what: str


TABLES = {table.name: table for table in (
    Table(HOST_TABLE, (PINNED, MAPPED), "us", PINNED_MEMORY, "pinned host memory end to end",
          "us per allocate+free pair of cuda.pinned_array / cuda.mapped_array (uint8)"),
    Table(PIPELINE_TABLE, (PIPELINE,), "ms", PINNED_MEMORY, "batch pipeline end to end",
          "ms per batch of a pinned staging buffer filled on the host, to_device on a stream, device temporaries of "
          "the batch size, half of it and 4 KiB, two kernels, copy_to_host into a pinned buffer, stream synchronize; "
          "every buffer allocated and dropped per batch"),
    Table(MANAGED_TABLE, (MANAGED,), "us", MANAGED_MEMORY, "managed memory end to end",
          "us per allocate+free pair of cuda.managed_array (uint8)"),
    Table(MANAGED_PIPELINE_TABLE, (MANAGED_PIPELINE,), "ms", MANAGED_MEMORY, "managed pipeline end to end",
          "ms per batch of a managed array allocated, filled on the host, the increment kernel on it, "
          "cuda.synchronize, its sum read on the host, dropped"),
)}


def targets_text(table: str) -> str:
    """The targets of ``table`` in words, ``''`` where it has none:
    ``'targets for numba_pool, numba_pool arena: managed_array 4 KiB at least 2x faster than default, ...'``."""
    wanted = [f"{t.figure} {t.wanted}" for t in MANAGED_TARGETS if t.table == table]
    return f"targets for {', '.join(TARGET_ROWS)}: {', '.join(wanted)}" if wanted else ""


# -- which worker runs what ----------------------------------------------------------------------

def parts_for(label: str, memories: tuple = MEMORIES) -> tuple[str, ...]:
    """The host parts the worker of ``label`` runs for ``memories`` (pinned, managed): none for
    the floors, the pinned pipeline for the anchors, every part for the others (default,
    numba_pool's rows and their baselines)."""
    row = label.removesuffix(BASELINE_SUFFIX)
    if row in FLOORS:
        return ()
    if row in ANCHORS:
        return ("pipeline",) if PINNED_MEMORY in memories else ()
    return tuple(p for p in PARTS if any(p in m.parts for m in memories))


def known_parts(folder: str | None) -> tuple[str, ...]:
    """The host parts the worker started in ``folder`` knows: this numba_pool's (:data:`PARTS`)
    without a folder; else those of the numba_pool a worker imports there (a baseline's), asked in
    a Python of its own (``host_worker.PARTS`` of :func:`~numba_pool_tools.bench.launch.worker_package`'s, about 1 s), and the pinned parts
    where it cannot say (from before the managed rows, or before this module)."""
    if folder is None:
        return PARTS
    package = launch.worker_package(folder)
    _, env, cwd = launch.command(package, [], {}, folder)
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE.format(package=package)], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.SubprocessError):
        return PINNED_PARTS
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return PINNED_PARTS
    return tuple(p for p in lines[-1].split(",") if p)


def plan(managers: list, memories: tuple = MEMORIES, device: bool = True, known=known_parts) -> tuple[list, list[str]]:
    """``managers`` (:class:`numba_pool_tools.bench.end_to_end.Manager`) with their host parts for
    ``memories`` as worker arguments (``--host PARTS``, :func:`parts_for`, less those the worker
    does not know: ``known(cwd)``, :func:`known_parts`), and ``--no-device`` without ``device``
    (the ``cuda.device_array`` rows) where the worker knows it (one that knows the managed parts:
    they came together); numba_pool's with ``NUMBA_POOL_HOST=1`` and ``NUMBA_POOL_MANAGED=1``
    for the kinds of memory they time.  Without ``device``, a worker with no part is left out.
    Also one note for each group of rows left out of some table, and why."""
    planned, floors, anchors, idle, notes = [], [], [], [], []
    knowledge: dict = {}
    for manager in managers:
        wanted = parts_for(manager.label, memories)
        if (wanted or not device) and manager.cwd not in knowledge:  # asked once a folder, only if it matters
            knowledge[manager.cwd] = known(manager.cwd)
        understood = knowledge.get(manager.cwd, PARTS)
        parts = tuple(p for p in wanted if p in understood)
        missing = [p for p in wanted if p not in understood]
        if missing:
            notes.append(UNKNOWN_NOTE.format(label=manager.label, parts=", ".join(missing)))
        row = manager.label.removesuffix(BASELINE_SUFFIX)
        (floors if row in FLOORS else anchors if row in ANCHORS else []).append(manager.label)
        args = ("--host", ",".join(parts)) if parts else ()
        if not device and set(MANAGED_PARTS) <= set(understood):
            args += ("--no-device",)
        if not parts and not device:
            idle.append(manager.label)
            continue
        env = manager.env
        if env.get("NUMBA_CUDA_MEMORY_MANAGER") == "numba_pool":
            env = {**env, **{VARIABLE_OF[m.name]: "1" for m in memories if set(m.parts) & set(parts)}}
        planned.append(dataclasses.replace(manager, env=env, args=args) if args else manager)
    if PINNED_MEMORY in memories:
        notes += [FLOORS_NOTE] if floors else []
        notes += [ANCHORS_NOTE.format(labels=", ".join(anchors))] if anchors else []
    if MANAGED_MEMORY in memories and floors + anchors:
        notes.append(MANAGED_NOTE.format(labels=", ".join(floors + anchors)))
    if idle:
        notes.append(IDLE_NOTE.format(labels=", ".join(idle)))
    return planned, notes


def hosts(manager) -> bool:
    """Whether the worker of ``manager`` (as :func:`plan` left it) runs host parts."""
    return "--host" in manager.args


# -- reading the workers' figures --------------------------------------------------------------

def host_figures(result: dict) -> dict | None:
    """The host part of one worker's result (its JSON line), checked: ``None`` when it has none
    (no host part asked for, or a numba_pool from before the host rows); else
    ``{field: {size: time}, "counts": {field: {size: count}}, "repeats"}`` with, for each kind
    of memory, its ``cache_key`` (``host_cache``, ``managed_cache``: true only if the worker
    said so) and ``source_key`` (``pinned_from``, ``managed_from``: ``'-'`` where it did not say).

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
    parsed = {"repeats": host["repeats"], "counts": {}}
    for memory in MEMORIES:
        parsed[memory.cache_key] = host.get(memory.cache_key) is True
        parsed[memory.source_key] = str(host.get(memory.source_key, "-"))
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
    each cell, each cell's rounds (``rounds_<field>``) and counts (``counts_<field>``), each
    kind of memory's cache (``host_cache``, ``managed_cache``) true only if it was in every round,
    and where it came from in the first round.  Cells missing from a round are left out."""
    merged = {"rounds": len(rounds), "repeats": rounds[0]["repeats"]}
    for memory in MEMORIES:
        merged[memory.cache_key] = all(r[memory.cache_key] for r in rounds)
        merged[memory.source_key] = rounds[0][memory.source_key]
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
    (:func:`numba_pool_tools.bench.device_tables.ratio_to_default`), or the ratio of the medians where rounds are not
    kept; empty without a default row."""
    default = results.get(DEFAULT)
    if default is None:
        return {}
    return {label: {field: {s: ratio_to_default(default, r, field, s) for s in r[field] if s in default[field]}
                    for field in FIELDS if field in r and field in default}
            for label, r in results.items()}


def keyed_ratios(ratios: dict[str, dict[str, dict[str, float]]]) -> dict[tuple[str, str, str], float]:
    """Ratios to default per manager, ``{label: {field: {size: x faster}}}`` (:func:`ratios_to_default`,
    a row's ``vs_default``), as ``{(table, figure, row): x faster}``: the key of the checks and of
    the runs' comparison."""
    return {(TABLE_OF[field], figure_name(field, size), label): ratio
            for label, fields in ratios.items() for field, sizes in fields.items() for size, ratio in sizes.items()}


def rounds_flags(results: dict[str, dict]) -> list[checks.Flag]:
    """Cells whose rounds disagree by more than :data:`numba_pool_tools.bench.checks.TOLERANCE`."""
    flags = []
    for label, merged in results.items():
        for field in FIELDS:
            for size, values in merged.get(f"rounds_{field}", {}).items():
                flag = checks.spread_flag(TABLE_OF[field], figure_name(field, size), label, values, "rounds")
                if flag:
                    flags.append(flag)
    return flags


def cache_flags(results: dict[str, dict], expected: set[str], memory: Memory = PINNED_MEMORY) -> list[checks.Flag]:
    """A flag per table of ``memory`` (pinned or managed) for each row in ``expected`` (run with
    ``NUMBA_POOL_HOST=1``, ``NUMBA_POOL_MANAGED=1``) whose memory of that kind did not come from
    numba_pool's cache in every round."""
    flags = []
    for label in expected:
        merged = results.get(label)
        if merged is None or merged[memory.cache_key]:
            continue
        for table in dict.fromkeys(TABLE_OF[f] for f in memory.fields if f in merged):
            flags.append(checks.Flag(table, EVERY_SIZE, label, f"its {memory.name} memory did not come from "
                                     f"numba_pool's {memory.cache} cache although {VARIABLE_OF[memory.name]}=1: "
                                     "these are Numba's figures"))
    return flags


def target_flags(results: dict[str, dict], targets: tuple = MANAGED_TARGETS,
                 rows: tuple = TARGET_ROWS) -> list[checks.Flag]:
    """The ``targets`` (:class:`numba_pool_tools.bench.checks.Target`) each of ``rows`` in ``results``
    misses, in the tables where it has figures (:func:`numba_pool_tools.bench.checks.target_flags`)."""
    present = [(TABLE_OF[field], label) for label in rows if label in results
               for field in FIELDS if field in results[label]]
    return checks.target_flags(keyed_ratios(ratios_to_default(results)), targets, list(dict.fromkeys(present)))


# -- the tables --------------------------------------------------------------------------------

def significant(value: float, digits: int = 4) -> str:
    """``value`` with ``digits`` significant digits, no exponent: 5.2 -> '5.200', 46012.3 -> '46012'."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    return f"{value:.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


def times(ratio: float) -> str:
    """A ratio to default as ``x faster``: '2.91x', '25.3x', '4512x'."""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x" if ratio < 100 else f"{ratio:.0f}x"


def present(table: str, results: dict[str, dict]) -> bool:
    """Whether any row of ``results`` has figures of ``table`` (a name in :data:`TABLES`)."""
    return any(f in r for f in TABLES[table].fields for r in results.values())


def render(table: str, results: dict[str, dict], flags: list = ()) -> str:
    """The table named ``table`` (:data:`TABLES`): per manager with figures in it, where its
    memory came from and the figure at each size (µs per pair or ms per batch), with how many
    times faster than default it is (``(216x)``); a flagged cell ends in ``!``."""
    from tabulate import tabulate

    spec = TABLES[table]
    marked = checks.flagged(list(flags), table)
    ratios = ratios_to_default(results)
    suffix = f" {spec.unit} (x faster)" if ratios else f" {spec.unit}"
    headers = ["manager", f"{spec.memory.name} memory from"]
    headers += [figure_name(f, s) + suffix for f in spec.fields for s in SIZES]
    rows = []
    for label, merged in results.items():
        if not any(f in merged for f in spec.fields):
            continue
        row = [label, merged[spec.memory.source_key]]
        row += [_cell(merged, ratios.get(label, {}), f, str(s), label, marked) for f in spec.fields for s in SIZES]
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
