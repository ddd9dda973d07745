"""The ``cuda.device_array`` tables of ``numba-pool-tools bench``'s end-to-end part, in the parent:
each manager's worker results merged over rounds (:func:`median_over_rounds`), ratios to Numba's
default manager paired round by round (:func:`ratios_to_default`), and the tables (medians with
the differences from the floors, ratios to default, ratios of several runs side by side).  The
figures come from :mod:`numba_pool_tools.bench.worker`; a cell that a check of
:mod:`numba_pool_tools.bench.checks` flagged ends in ``!``.
"""

from __future__ import annotations

import statistics

from . import checks
from .labels import DEFAULT, NOOP_FLOOR, REFERENCE, SEED_LOOP, figure_label, size_label
from .worker import SEED_ITERATIONS, SIZES


def median_over_rounds(rounds: list[dict]) -> dict:
    """Combine one manager's results from several rounds: the median of each figure, and each
    round's figures (``rounds_seed_loop_ms``, ``rounds_alloc_free_us``) for the checks."""
    merged = {"seed_loop_ms": statistics.median(r["seed_loop_ms"] for r in rounds),
              "alloc_free_us": {k: statistics.median(r["alloc_free_us"][k] for r in rounds)
                                for k in rounds[0]["alloc_free_us"]},
              "manager": rounds[0]["manager"], "rounds": len(rounds),
              "rounds_seed_loop_ms": [r["seed_loop_ms"] for r in rounds],
              "rounds_alloc_free_us": {k: [r["alloc_free_us"][k] for r in rounds] for k in rounds[0]["alloc_free_us"]}}
    pairs = [r["driver_pair_us"] for r in rounds if "driver_pair_us" in r]
    if pairs:
        merged["driver_pair_us"] = statistics.median(pairs)
    if "core" in rounds[0]:
        merged["core"] = rounds[0]["core"]
    if all("pairs" in r for r in rounds):
        merged["rounds_pairs"] = [r["pairs"] for r in rounds]  # pairs per repeat, by size
    return merged


def ratios_to_default(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Per manager, how many times faster than default (:func:`ratio_to_default`): ``seed loop``
    and each allocate+free size (bytes, as a string); empty without a default row."""
    default = results.get(DEFAULT)
    if default is None:
        return {}
    return {label: {SEED_LOOP: ratio_to_default(default, r, "seed_loop_ms"),
                    **{k: ratio_to_default(default, r, "alloc_free_us", k) for k in r["alloc_free_us"]}}
            for label, r in results.items()}


def ratio_to_default(default: dict, row: dict, field: str, key: str | None = None) -> float:
    """How many times faster ``row`` is than ``default`` at ``field`` (``field[key]`` with a
    ``key``): :func:`paired_ratio` of their ``rounds_<field>`` where both kept their rounds,
    else the ratio of their figures (medians)."""
    def at(figures: dict, name: str):
        value = figures.get(name)
        return value if key is None or value is None else value.get(key)

    default_rounds, row_rounds = at(default, f"rounds_{field}"), at(row, f"rounds_{field}")
    if default_rounds is not None and row_rounds is not None:
        return paired_ratio(default_rounds, row_rounds)
    return at(default, field) / at(row, field)


def paired_ratio(default_rounds: list[float], row_rounds: list[float]) -> float:
    """Default's time over a row's, round by round, and the median of those ratios: the two
    workers of a round ran minutes apart at most, so a slow spell of the machine that lasts
    longer cancels in their ratio, where a ratio of the medians over rounds keeps it.  Lists of
    different lengths cannot be paired (a round missing from one of them would shift every
    later pair): then the ratio of their medians."""
    if len(default_rounds) != len(row_rounds):
        return statistics.median(default_rounds) / statistics.median(row_rounds)
    return statistics.median(d / r for d, r in zip(default_rounds, row_rounds))


def _mark(cell: str, figure: str, label: str, marked: set) -> str:
    """``cell``, with `` !`` after it where a check flagged ``(figure, label)``."""
    return cell + " !" if (figure, label) in marked else cell


def render_ratios(results: dict[str, dict], flags: list = ()) -> str:
    """Per manager, how many times faster than default (default's time / the manager's), for the
    seed loop and each allocate+free size; a cell whose figure a check flagged ends in ``!``."""
    from tabulate import tabulate

    marked = checks.flagged(list(flags), "end to end")
    ratios = ratios_to_default(results)
    figures = [SEED_LOOP] + [str(s) for s in SIZES]
    rows = [[label] + [_mark(f"{r[f]:.2f}", f, label, marked) for f in figures] for label, r in ratios.items()]
    headers = ["manager (x faster than default)", f"benchmark loop ({SEED_ITERATIONS} it.)"]
    headers += [f"{size_label(s)} alloc+free" for s in SIZES]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def render_ratio_runs(runs: list[dict[tuple[str, str, str], float]], flags: list = ()) -> str:
    """The end-to-end ratios to default of several runs side by side, ``{(table, figure, row):
    x faster}`` each: a line per table, figure and row, a column per run, and the runs' largest
    over smallest; a line that a check flagged ends in ``!``."""
    from tabulate import tabulate

    marked = {(f.table.removesuffix(" runs"), f.figure, f.label) for f in flags}
    rows = []
    for key in runs[0]:
        values = [run.get(key) for run in runs]
        if any(v is None for v in values):
            continue
        table, figure, label = key
        spread = f"{max(values) / min(values):.3f}" + (" !" if key in marked else "")
        rows.append([table, figure_label(figure), label, *(f"{v:.3g}" for v in values), spread])
    headers = ["table", "figure", "manager", *(f"run {n + 1}" for n in range(len(runs))), "max/min"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def render(results: dict[str, dict], flags: list = ()) -> str:
    """The bench table: one row per manager, medians with the ratio to default, and each
    allocate+free time's difference (µs) from the no-op floor and from Numba alone; a cell
    that a check flagged (:mod:`numba_pool_tools.bench.checks`) ends in ``!``."""
    from tabulate import tabulate

    marked = checks.flagged(list(flags), "end to end")
    ratios = ratios_to_default(results)
    present = [label for label in (NOOP_FLOOR, REFERENCE) if label in results]
    floors = [results[label] for label in present]
    vs = f" ({', '.join(present)})" if present else ""
    headers = ["manager", f"benchmark loop ({SEED_ITERATIONS} it.) ms", "x faster than default"]
    headers += [f"{size_label(s)} alloc+free us{vs}" for s in SIZES]
    rows = []
    for label, r in results.items():
        row = [label, _mark(f"{r['seed_loop_ms']:.3f}", SEED_LOOP, label, marked)]
        row.append(f"{ratios[label][SEED_LOOP]:.2f}" if ratios else "-")
        for s in SIZES:
            us = r["alloc_free_us"][str(s)]
            cell = f"{us:.2f}"
            if floors:
                cell += " (" + ", ".join(f"{us - f['alloc_free_us'][str(s)]:+.2f}" for f in floors) + ")"
            row.append(_mark(cell, str(s), label, marked))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)

