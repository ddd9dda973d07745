"""``numba-pool-tools snapshot plot``: bytes held over time, stacked by allocation site, one panel per
device, from a snapshot's recorded events (:mod:`~numba_pool_tools.snapshot.timeline`).

Needs matplotlib (``pip install -e './tools[plot]'``), imported only here and only once the
output path is known to be writable; drawn on a :class:`matplotlib.figure.Figure` of its own
(no pyplot), as :mod:`numba_pool_tools.replay.figure` does (which checks the output path).
"""

from __future__ import annotations

import os

import click
import humanfriendly

from numba_pool.cli.errors import Failure

from ..replay.figure import PlotError, binary_unit, checked_path
from . import load
from .timeline import MARKED, OTHER, timelines

#: The longest site label in a legend.
LABEL_CHARS = 60
#: How the marked events are drawn.
MARK_STYLES = {"oom": dict(color="red", linestyle="--"), "trim": dict(color="gray", linestyle=":"),
               "reset": dict(color="black", linestyle="-.")}


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="The figure: a .png, .svg or .pdf file (.png added without an extension).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="Allocation sites drawn on each device (the rest stacked as one).")
def plot(file, output, top) -> None:
    """Draw the bytes held over time in a memory snapshot FILE, stacked by allocation site (one
    panel per device), from its recorded events: an allocation holds its bytes until its
    release completes.

    Needs the history (numba_pool.record_history()) while the program ran, and matplotlib
    (pip install -e './tools[plot]'). Only plain data is read from the pickle.
    """
    try:
        output = checked_path(output, "-o")  # before reading a large file
    except PlotError as err:
        raise Failure(str(err)) from None
    snapshot = load.load(file, need=("device_traces",))
    lines = timelines(snapshot["device_traces"], top)
    if not any(line.allocations for line in lines):
        what = "no events recorded (its 'device_traces' are empty)" if not lines else "no allocation events recorded"
        raise Failure(f"{file}: {what}: record them with numba_pool.record_history() before taking the snapshot")
    try:
        _figure(lines, os.path.basename(file)).savefig(output, dpi=100, format=os.path.splitext(output)[1][1:].lower(),
                                                       bbox_inches="tight")
    except OSError as err:
        raise Failure(f"-o {output!r}: cannot write it ({err.strerror or err})") from None
    click.echo(f"plot written to {output}")


def _figure(lines, name: str):
    """The figure: one panel per device, the x axes shared."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 1.5 + 3.2 * len(lines)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(lines), 1, sharex=True, squeeze=False)[:, 0]
    scale, unit = binary_unit(max([line.peak_total for line in lines] + [1]))
    for ax, line in zip(axes, lines):
        _panel(ax, line, scale, unit)
    axes[-1].set_xlabel("seconds since the first event")
    fig.suptitle(f"{name}: bytes held by allocation site", fontsize=11)
    fig.tight_layout()
    return fig


def _panel(ax, line, scale: int, unit: str) -> None:
    """One device: its sites stacked as steps (each value holds until the next event)."""
    import numpy as np

    times = np.asarray(line.times)
    held = np.asarray(line.held, dtype=float) / scale
    xs = np.repeat(times, 2)[1:]  # a step at each event: the value before it, then after it
    ys = np.repeat(held, 2, axis=0)[:-1]
    labels = [f"{_short(site, line.sites)} (peak {_human(peak)})" for site, peak in zip(line.sites, line.peaks)]
    colors = [f"C{k % 10}" for k in range(len(line.sites))]
    if line.sites and line.sites[-1] == OTHER:
        colors[-1] = "lightgray"
    ax.stackplot(xs, ys.T, labels=labels, colors=colors)
    for action in MARKED:
        times_marked = [t for t, a in line.marks if a == action]
        for k, t in enumerate(times_marked):
            ax.axvline(t, linewidth=1, label=MARKED[action] if k == 0 else None, **MARK_STYLES[action])
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.set_title(f"device {line.device}: peak {_human(line.peak_total)} held, "
                 f"{line.allocations:,} allocations recorded", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)


def _short(site: str, sites: list[str]) -> str:
    """``file.py:line`` for a site ``/path/to/file.py:line``, unless two sites of the device
    would read the same; at most :data:`LABEL_CHARS` characters, its middle left out (a file name
    can have thousands, and the legend would make the figure as wide)."""
    short = os.path.basename(site)
    same = [s for s in sites if os.path.basename(s) == short]
    label = short if len(same) == 1 else site
    if len(label) <= LABEL_CHARS:
        return label
    end = LABEL_CHARS * 2 // 3  # the end names the file and the line
    return f"{label[:LABEL_CHARS - end - 3]}...{label[-end:]}"


def _human(nbytes: int) -> str:
    return humanfriendly.format_size(nbytes, binary=True)
