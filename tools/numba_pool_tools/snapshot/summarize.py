"""``numba-pool-tools snapshot summarize``: the top allocation sites, the segments per kind and the
reserved bytes against the allocated ones, from a snapshot file
(:func:`numba_pool.observe.snapshot.summarize`), with no GPU."""

from __future__ import annotations

import click

from numba_pool.observe import snapshot as _snapshot
from ..replay.figure import size_text
from . import load

#: The block states of memory released, not yet reusable: numba_pool's and PyTorch's name for it.
AWAITING = ("active_awaiting_free", "active_pending_free")
#: Where the bytes of the segments go: the rows of the fragmentation table, in order.
SPLIT = (("allocated", "allocated (requested)"),
         ("rounding", "free inside allocations (block size - requested)"),
         ("awaiting", "awaiting free (released, not yet reusable)"),
         ("free", "free (reusable)"))


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="Allocation sites shown (the rest summed in one row).")
def summarize(file, top) -> None:
    """Summarize a memory snapshot FILE: the top allocation sites by bytes held (file:line of
    the innermost frame outside numba_pool and Numba), the segments per kind, and the reserved
    bytes against the allocated ones (per device when there are several).

    Sites need the history (numba_pool.record_history()) when the snapshot was taken. Only
    plain data is read from the pickle.
    """
    from tabulate import tabulate

    snapshot = load.load(file, need=("segments",))
    summary = _snapshot.summarize(snapshot, limit=None)
    sections = [("top allocation sites by bytes held",
                 tabulate(_site_rows(summary, top), headers=("site", "bytes", "blocks"), tablefmt="plain",
                          disable_numparse=True, colalign=("left", "right", "right"))),
                ("segments per kind",
                 tabulate(_kind_rows(summary), headers=("kind", "segments", "reserved", "allocated"), tablefmt="plain",
                          disable_numparse=True, colalign=("left", "right", "right", "right"))),
                ("reserved against allocated", _split_table(snapshot["segments"], tabulate))]
    click.echo("\n\n".join(f"{title}\n{table}" for title, table in sections))


def _site_rows(summary: dict, top: int) -> list[tuple]:
    """The ``top`` sites, then one row for the rest; one row saying so when there are none."""
    sites = summary["sites"]
    if not sites:
        return [("(no active allocations)", size_text(0), "0")]
    rows = [(site, size_text(nbytes), f"{blocks:,}") for site, nbytes, blocks in sites[:top]]
    rest = sites[top:]
    if rest:
        rows.append((f"{len(rest):,} other site{'s' if len(rest) > 1 else ''}", size_text(sum(r[1] for r in rest)), f"{sum(r[2] for r in rest):,}"))
    return rows


def _kind_rows(summary: dict) -> list[tuple]:
    rows = [(kind, f"{segments:,}", size_text(reserved), size_text(allocated))
            for kind, segments, reserved, allocated in summary["kinds"]]
    return rows or [("(no segments)", "0", size_text(0), size_text(0))]


def split(segments: list[dict]) -> dict[str, int]:
    """The segments' reserved bytes split: ``allocated`` (requested sizes of the active
    blocks), ``rounding`` (their block sizes beyond the request), ``awaiting`` (blocks
    released, not yet reusable) and ``free`` (inactive blocks, and any part of a segment no
    block covers); the four add up to ``reserved``."""
    out = dict.fromkeys(("reserved", "allocated", "rounding", "awaiting", "free"), 0)
    for segment in segments:
        out["reserved"] += segment["total_size"]
        covered = 0
        for block in segment["blocks"]:
            covered += block["size"]
            if block["state"] == "active_allocated":
                out["allocated"] += block["requested_size"]
                out["rounding"] += max(block["size"] - block["requested_size"], 0)
            elif block["state"] in AWAITING:
                out["awaiting"] += block["size"]
            else:
                out["free"] += block["size"]
        out["free"] += max(segment["total_size"] - covered, 0)
    return out


def _split_table(segments: list[dict], tabulate) -> str:
    """Reserved, then where it goes (:data:`SPLIT`), each with its share of reserved: one
    column, or one per device and one for them all when the segments are on several."""
    devices = sorted({segment["device"] for segment in segments})
    columns = [split(segments)]
    headers: tuple = ()
    if len(devices) > 1:
        columns = [split([s for s in segments if s["device"] == d]) for d in devices] + columns
        headers = ("", *(f"device {d}" for d in devices), "all devices")
    rows = [("reserved (segments)", *(size_text(c["reserved"]) for c in columns))]
    for key, name in SPLIT:
        rows.append((name, *(f"{size_text(c[key])}, {_share(c[key], c['reserved'])}" for c in columns)))
    return tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True,
                    colalign=("left", *("right" for _ in columns)))


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"
