"""The CUDA-graph part run from the parent (``numba-pool-tools bench --part graphs``): one process per
manager and run (:mod:`numba_pool_tools.bench.graphs`), then a table per run: µs per iteration of the
pipeline launched eagerly and replayed from a graph, and their ratios."""

from __future__ import annotations

import click
from tabulate import tabulate

from . import launch
from .end_to_end import ARENA, DEFAULT, NUMBA_POOL
from .graphs import ITERATIONS, REPEATS
from .labels import size_label
from .timing import CORE_VARIABLE

GRAPHS_MODULE = "numba_pool_tools.bench.graphs"
MANAGERS = (DEFAULT, NUMBA_POOL, ARENA)
LABELS = [m.label for m in MANAGERS]
#: How each run's figures are taken, for its heading.
METHOD = f"median of {REPEATS} blocks of {ITERATIONS} iterations"


def measure_run(core: int, run: int, runs: int) -> dict:
    """One run: each manager's process, in turn; ``{label: worker JSON}``.

    :raises RuntimeError: when a process failed, with its exit status and standard error."""
    click.echo(f"measuring the graph pipeline (run {run + 1}/{runs}) ...", err=True)
    return {m.label: launch.run_module(GRAPHS_MODULE, [], {**m.env, CORE_VARIABLE: str(core)}) for m in MANAGERS}


def render(results: dict) -> str:
    """The run's table: per size and manager, eager and captured µs per iteration, captured /
    eager, and eager against default's eager."""
    default = {row["bytes"]: row["eager_us"] for row in results[DEFAULT.label]["sizes"]}
    rows = []
    for label, result in results.items():
        for row in result["sizes"]:
            eager, captured = row["eager_us"], row.get("captured_us")
            rows.append([size_label(row["bytes"]), label, f"{eager:.2f}",
                         f"{captured:.2f}" if captured is not None else f"cannot: {row.get('capture_error', '?')[:60]}",
                         f"{captured / eager:.2f}" if captured is not None else "",
                         f"{eager / default[row['bytes']]:.2f}",
                         {True: "yes", False: "NO"}.get(row.get("correct"), "")])
    rows.sort(key=lambda r: (r[0], LABELS.index(r[1])))
    return tabulate(rows, headers=["size", "manager", "eager, us per iteration", "captured (graph replay), us",
                                   "captured / eager", "eager / default's eager", "replay correct"],
                    tablefmt="github", disable_numparse=True)
