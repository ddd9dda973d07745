"""Plots of a replay (:mod:`numba_pool_tools.replay`): requested and reserved bytes over the
operations; and how the tools write sizes and check a figure's path before their work.

Needs matplotlib, an optional extra of the tools: ``pip install -e './tools[plot]'``.  Drawing uses the
object-oriented API (:class:`matplotlib.figure.Figure` on its own canvas), so it neither
imports pyplot nor changes the caller's backend or open figures.
"""

from __future__ import annotations

import os

import humanfriendly

#: File formats :func:`plot` writes, by extension (all built into matplotlib).
FORMATS = (".png", ".svg", ".pdf")
INSTALL_HINT = "pip install -e './tools[plot]' from a checkout, or pip install matplotlib"


class PlotError(ValueError):
    """A plot that cannot be written: unsupported format, missing folder, or no matplotlib."""


def require_matplotlib() -> None:
    """:raises PlotError: when matplotlib cannot be imported, saying how to install it."""
    try:
        import matplotlib  # noqa: F401  (first: a stubbed-out package must not hide behind cached submodules)
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
    except ImportError as err:
        raise PlotError(f"plotting needs matplotlib, which cannot be imported ({err}): {INSTALL_HINT}") from None


def plot_path(path: str | os.PathLike, option: str = "path") -> str:
    """The file :func:`plot` will write for ``path``: ``.png`` added when it has no extension.

    The path is tried now, by opening it for writing (a file this creates is removed again), so
    that a path the system refuses fails before a long replay, not after it.

    :param option: what to call the path in messages (the command line passes ``--plot``).
    :raises PlotError: for an empty path, a name that is only an extension (``.png``), an
        extension other than :data:`FORMATS`, an existing file that is not a regular file
        (``/dev/null``, a pipe), a folder that does not exist, an existing folder named as the
        file, or a file that cannot be opened for writing (naming the system's reason).
    """
    path = os.fspath(path)
    if not isinstance(path, str) or not path.strip():
        raise PlotError(f"{option} {path!r}: expected a file name ending in {', '.join(FORMATS)}")
    if os.path.basename(path).lower() in FORMATS:
        raise PlotError(f"{option} {path!r} has no name before its extension: expected e.g. replay{FORMATS[0]}")
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):
        raise PlotError(f"{option} {path!r} is not a regular file (a device, pipe or socket): name a file to write")
    root, ext = os.path.splitext(path)
    if not ext:
        path += ".png"
    elif ext.lower() not in FORMATS:
        raise PlotError(f"{option} {path!r}: cannot write {ext!r} files: use {', '.join(FORMATS)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise PlotError(f"{option} {path!r}: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise PlotError(f"{option} {path!r} is a folder")
    _try_writing(path, option)
    return path


def _try_writing(path: str, option: str) -> None:
    """Open ``path`` for writing without changing it; remove it when this created it.

    :raises PlotError: with the system's reason when it cannot be opened."""
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as err:
        raise PlotError(f"{option} {path!r}: cannot write it ({err.strerror or err})") from None
    if not existed:
        os.remove(path)


def checked_path(path: str | os.PathLike, option: str) -> str:
    """The file a figure will be written to (:func:`plot_path`: ``.png`` added without an
    extension), tried before a command's work, and matplotlib importable.

    :param option: the option that named it, for the messages (``--plot``, ``-o``).
    :raises PlotError: when it cannot be written there, or matplotlib cannot be imported (saying
        how to install it).
    """
    path = plot_path(path, option=option)
    require_matplotlib()
    return path


def size_text(nbytes: int) -> str:
    """A size as the command line's tables show it: binary units and the exact bytes."""
    return f"{humanfriendly.format_size(nbytes, binary=True)} ({nbytes} bytes)" if nbytes >= 1024 else f"{nbytes} bytes"


_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "bytes"))


def binary_unit(nbytes: int) -> tuple[int, str]:
    """``(scale, name)`` of the largest binary unit (KiB, MiB ...) not above ``nbytes``."""
    return next((size, name) for size, name in _UNITS if nbytes >= size or size == 1)


def plot(report, path: str | os.PathLike, title: str | None = None) -> str:
    """Draw requested and reserved bytes over the replay into ``path`` (see :func:`figure`).

    :param report: a :class:`numba_pool_tools.replay.ReplayReport`.
    :param path: the file: ``.png`` (100 dpi), ``.svg`` or ``.pdf``; ``.png`` is added to a path
        without extension.
    :param title: the title's start; by default the log's file name.
    :returns: the path written.
    :raises PlotError: as :func:`require_matplotlib` and :func:`plot_path`.
    :raises OSError: when the file cannot be written after all (a full disk).
    """
    path = plot_path(path)
    # The format named, so that matplotlib never appends an extension: the path returned is
    # the file written.
    figure(report, title).savefig(path, dpi=100, format=os.path.splitext(path)[1][1:].lower())
    return path


def figure(report, title: str | None = None):
    """A :class:`matplotlib.figure.Figure` (on an Agg canvas, outside pyplot) of requested and
    reserved bytes over the replay, in the binary unit that suits the peak (bytes to TiB).

    :param title: the title's start; by default the log's file name.
    :raises PlotError: as :func:`require_matplotlib`.
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    size = lambda n: humanfriendly.format_size(n, binary=True)  # noqa: E731
    scale, unit = binary_unit(max([report.peak_reserved, report.peak_requested, 1]))
    ops = [s[0] for s in report.series]
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(ops, [s[2] / scale for s in report.series],
            label=f"reserved: slabs + large blocks (peak {size(report.peak_reserved)})")
    ax.plot(ops, [s[1] / scale for s in report.series],
            label=f"requested, rounded to 256 B (peak {size(report.peak_requested)})")
    ax.set_xlabel("operation")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    name = title if title is not None else os.path.basename(report.source)
    threshold = "keep all" if report.release_threshold is None else size(report.release_threshold)
    ax.set_title(f"{name}: peak reserved / peak requested = {report.fragmentation:.3f}\n"
                 f"slabs up to {size(report.slab_size)}, blocks up to {size(report.max_block)}, "
                 f"release threshold {threshold}", fontsize=10)
    ax.legend()
    fig.tight_layout()
    return fig
