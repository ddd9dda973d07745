"""Self-checks of ``numba-pool-tools bench``'s tables: a figure that fails one is flagged, never shown clean.

Pure functions over the tables' JSON (no GPU), each returning a list of :class:`Flag`:

* **Floor inversions** (:func:`allocator_floor_flags`, :func:`end_to_end_floor_flags`): a row
  measured below a floor it cannot go below.  Every row floors at ``Numba alone`` (Numba's own
  cost, no finalizer: the least any manager can cost); the ``no-op floor``, Numba's default
  manager and the anchors (RMM's and CuPy's plugins) pass a finalizer, which Numba wraps in
  ``weakref.finalize``, so they floor at the ``no-op floor`` too.  In the allocator part the test
  is the paired difference's median (µs) below zero; end to end, the median over rounds (µs).
* **Rounds that disagree** (:func:`rounds_flags`): end to end, per manager and figure, the largest
  over the smallest of the rounds above ``1 +`` :data:`TOLERANCE`.
* **Runs that disagree, end to end** (:func:`ratio_runs_flags`): the end-to-end part run N times
  (``--repeat-run``), per table, figure and row, the largest over the smallest of the runs'
  ratios to default above ``1 +`` :data:`TOLERANCE`.
* **Runs that disagree** (:func:`runs_flags`): the allocator part run N times (``--repeat-run``),
  per size and allocator, the largest over the smallest of the runs' ratios (overhead above
  ``Numba alone`` over the no-op floor's) above ``1 +`` :data:`TOLERANCE`, or a ratio not positive.
  Ratios, not µs: the host's speed changes between runs, and the µs with it, the ratios hold.
* **Targets** (:func:`target_flags`): a row's ratio to default (default's time over the row's,
  x faster) below a :class:`Target` the project set (issue 21's for managed memory: at least 2x
  at 4 KiB, 5x at 64 MiB, the pipeline faster at every size; issue 33's for the overlap of
  streams, :mod:`numba_pool_tools.bench.overlap_tables`), or missing where the row has the
  table (no default row to compare with): a target missed is flagged, never shown met.
* **The allocation history's cost** (:func:`history_flags`, issue 22's targets): in the allocator
  part, recording Python stacks adds at most :data:`HISTORY_MAX_ADDED_US` per allocate+free pair
  at a stack depth of :data:`HISTORY_CHECKED_DEPTH` (a recorded row's paired difference from the
  same path off, its median), and a path the history was switched on and off on is within
  :data:`HISTORY_OFF_US` of one it never touched (:mod:`numba_pool_tools.bench.history_cost`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .labels import BASELINE_SUFFIX, NOOP_FLOOR, REFERENCE, SEED_LOOP, WITH_FINALIZER, figure_label

TOLERANCE = 0.10
HISTORY_MAX_ADDED_US = 5.0  # µs per pair that recording Python stacks may add ...
HISTORY_CHECKED_DEPTH = 20  # ... at this stack depth
HISTORY_OFF_US = 0.05  # µs per pair a path may differ by, once the history was switched on and off


@dataclass(frozen=True)
class Flag:
    """A failed check: which table, figure (a size in bytes as a string, or ``seed loop``) and
    row, and what is wrong."""

    table: str
    figure: str
    label: str
    message: str

    def __str__(self) -> str:
        return f"CHECK FAILED [{self.table}] {figure_label(self.figure)}, {self.label}: {self.message}"


def floors_of(label: str) -> list[str]:
    """The floors ``label`` cannot measure below: none for ``Numba alone``; ``Numba alone`` for
    every other row; the no-op floor as well for rows that pass a finalizer."""
    if label == REFERENCE:
        return []
    if label.removesuffix(BASELINE_SUFFIX) in WITH_FINALIZER:
        return [REFERENCE, NOOP_FLOOR]
    return [REFERENCE]


def allocator_floor_flags(results: dict) -> list[Flag]:
    """Inversions in one allocator table, ``{size: {label: row}}``: a row whose paired difference
    from a floor (``above_reference`` for ``Numba alone``, ``above_floor`` for the no-op floor;
    median, µs) is below zero."""
    fields = {REFERENCE: "above_reference", NOOP_FLOOR: "above_floor"}
    flags = []
    for size, rows in results.items():
        for label, row in rows.items():
            for floor in floors_of(label):
                difference = row.get(fields[floor])
                if floor in rows and difference is not None and difference["median"] < 0:
                    flags.append(Flag("allocator", size, label, f"{difference['median']:+.2f} us below {floor} "
                                      f"[95% CI {difference['low']:+.2f}, {difference['high']:+.2f}]: a floor inversion"))
    return flags


def end_to_end_floor_flags(results: dict) -> list[Flag]:
    """Inversions in the end-to-end table, ``{label: {"alloc_free_us": {size: µs}}}``: a row's
    allocate+free median below that of a floor, at any size."""
    flags = []
    for label, row in results.items():
        for floor in floors_of(label):
            if floor not in results:
                continue
            for size, us in row["alloc_free_us"].items():
                below = results[floor]["alloc_free_us"][size] - us
                if below > 0:
                    flags.append(Flag("end to end", size, label, f"{us:.2f} us is {below:.2f} us below {floor} "
                                      f"({results[floor]['alloc_free_us'][size]:.2f} us): a floor inversion"))
    return flags


def spread_flag(table: str, figure: str, label: str, values: list[float], what: str) -> Flag | None:
    """A flag when ``values`` (one per round or run) are not all positive or their largest over
    their smallest exceeds ``1 +`` :data:`TOLERANCE`; ``None`` when they agree."""
    if len(values) < 2:
        return None
    shown = ", ".join(f"{v:.3g}" for v in values)
    if min(values) <= 0:
        return Flag(table, figure, label, f"{what} not all positive ({shown}): cannot agree")
    spread = max(values) / min(values)
    if spread > 1 + TOLERANCE:
        return Flag(table, figure, label, f"{what} disagree by {(spread - 1) * 100:.0f} % "
                    f"(max/min {spread:.3f} > {1 + TOLERANCE:.2f}): {shown}")
    return None


def rounds_flags(per_round: dict[str, list[dict]]) -> list[Flag]:
    """End-to-end rounds that disagree: per manager, the seed loop and each allocate+free size
    over the rounds, ``{label: [worker result, ...]}``."""
    flags = []
    for label, rounds in per_round.items():
        figures = {SEED_LOOP: [r["seed_loop_ms"] for r in rounds]}
        figures.update({size: [r["alloc_free_us"][size] for r in rounds] for size in rounds[0]["alloc_free_us"]})
        for figure, values in figures.items():
            flag = spread_flag("end to end", figure, label, values, "rounds")
            if flag:
                flags.append(flag)
    return flags


def runs_flags(runs: list[dict]) -> list[Flag]:
    """Allocator runs that disagree: per size and allocator, the median ratios to the no-op
    floor's overhead (``ratio_to_floor``) of ``runs``, each ``{size: {label: row}}``."""
    flags = []
    if len(runs) < 2:
        return flags
    for size, rows in runs[0].items():
        for label in rows:
            ratios = [run.get(size, {}).get(label, {}).get("ratio_to_floor") for run in runs]
            if any(r is None for r in ratios):
                continue
            flag = spread_flag("allocator runs", size, label, [r["median"] for r in ratios], "ratios of the runs")
            if flag:
                flags.append(flag)
    return flags


def ratio_runs_flags(runs: list[dict[tuple[str, str, str], float]]) -> list[Flag]:
    """End-to-end runs that disagree: per ``(table, figure, row)`` present in every run, the
    runs' ratios to default (x faster) whose largest over smallest exceeds ``1 +``
    :data:`TOLERANCE`.  The flag's table is the figure's table with `` runs`` after it."""
    flags = []
    if len(runs) < 2:
        return flags
    for key in runs[0]:
        if all(key in run for run in runs):
            table, figure, label = key
            flag = spread_flag(f"{table} runs", figure, label, [run[key] for run in runs], "ratios to default of the runs")
            if flag:
                flags.append(flag)
    return flags


@dataclass(frozen=True)
class Target:
    """A ratio to default a row must reach: in ``table``, at ``figure`` (a cell's name, such as
    ``'managed_array 4 KiB'``), at least ``times`` x faster than default (default's time over
    the row's), or more than ``times`` where ``strictly``."""

    table: str
    figure: str
    times: float
    strictly: bool = False

    def met(self, ratio: float) -> bool:
        """Whether ``ratio`` (x faster than default) reaches the target."""
        return ratio > self.times if self.strictly else ratio >= self.times

    @property
    def wanted(self) -> str:
        """The target in words: ``'at least 2x faster than default'``, ``'faster than default'``;
        a target below 1 as a time: ``'at most 1.05x default's time'``."""
        if self.strictly:
            return "faster than default" if self.times == 1 else f"more than {self.times:g}x faster than default"
        if self.times < 1:
            return f"at most {1 / self.times:.3g}x default's time"
        return f"at least {self.times:g}x faster than default"


def target_flags(ratios: dict[tuple[str, str, str], float], targets, rows: list[tuple[str, str]]) -> list[Flag]:
    """A flag for each target of ``targets`` that a row misses: for each ``(table, label)`` of
    ``rows`` (the rows held to the targets, in the tables where they have figures), each target
    of that table whose ratio ``ratios[(table, figure, label)]`` (x faster than default) does
    not reach it, or is missing (no default figure to compare with: the target cannot be shown met)."""
    flags = []
    for table, label in rows:
        for target in (t for t in targets if t.table == table):
            ratio = ratios.get((table, target.figure, label))
            if ratio is None:
                flags.append(Flag(table, target.figure, label, f"no ratio to default: the target ({target.wanted}) "
                                  "cannot be checked"))
            elif not target.met(ratio):
                measured = (f"{1 / ratio:.2f}x default's time" if target.times < 1
                            else f"{ratio:.2f}x faster than default")
                flags.append(Flag(table, target.figure, label, f"{measured}, the target is {target.wanted}: "
                                  "target missed"))
    return flags


def history_flags(results: dict) -> list[Flag]:
    """The allocation history's checks over one allocator table, ``{size: {label: row}}`` (table
    ``history``): a row recording Python stacks at depth :data:`HISTORY_CHECKED_DEPTH` whose
    added cost (``row["history"]["added"]``, median, µs) is above :data:`HISTORY_MAX_ADDED_US`, or
    missing; a path off whose paired difference from the path never switched on
    (``vs_never_recorded``, median, µs) is more than :data:`HISTORY_OFF_US` either way."""
    flags = []
    for size, rows in results.items():
        for label, row in rows.items():
            history = row.get("history")
            if history and history["stacks"] == "python" and history["depth"] == HISTORY_CHECKED_DEPTH:
                added = history.get("added")
                if added is None:
                    flags.append(Flag("history", size, label, f"no paired difference from {history['of']}: "
                                      f"the added cost (at most {HISTORY_MAX_ADDED_US:g} us) cannot be checked"))
                elif added["median"] > HISTORY_MAX_ADDED_US:
                    flags.append(Flag("history", size, label, f"{added['median']:+.2f} us per pair added at "
                                      f"{history['frames']} frames [95% CI {added['low']:+.2f}, {added['high']:+.2f}]: "
                                      f"more than {HISTORY_MAX_ADDED_US:g} us"))
            off = row.get("vs_never_recorded")
            if off is not None and abs(off["median"]) > HISTORY_OFF_US:
                flags.append(Flag("history", size, label, f"{off['median']:+.2f} us per pair from the same path never "
                                  f"switched on [95% CI {off['low']:+.2f}, {off['high']:+.2f}], after the history was "
                                  f"switched on and off: more than {HISTORY_OFF_US:g} us"))
    return flags


def flagged(flags: list[Flag], table: str) -> set[tuple[str, str]]:
    """The ``(figure, label)`` cells of ``table`` that a flag names."""
    return {(f.figure, f.label) for f in flags if f.table == table}


def summary(flags: list[Flag]) -> str:
    """One closing line: every flag counted, or that every check passed."""
    if flags:
        return (f"SELF-CHECKS: {len(flags)} FAILED (the rows marked '!' above): these figures do not hold; "
                "do not quote them")
    return (f"self-checks passed: no floor inversion, rounds/runs within {TOLERANCE:.0%} of each other, "
            "targets met (where measured)")
