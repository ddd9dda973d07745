"""The allocation history's cost, in the allocator part (:mod:`numba_pool_tools.bench.allocator_cost`):
rows that take turns with the allocators in the same repeats, so that their paired differences
say what :func:`numba_pool.record_history` adds per allocate+free pair, and what it leaves
behind once off.

Worker side (inside ``python -m numba_pool_tools.bench.allocator_cost``):

* **Off.** The ``numba_pool`` and ``numba_pool arena`` rows of every table are measured after the
  history was switched on and off in the process (:func:`switch_on_and_off`): the worker checks
  that each of numba_pool's paths had the recording adaptor outermost while on, and is, once
  off, the very path it was before (the same layers, the same bound ``allocate``, no
  ``history``), and fails otherwise.  Beside them, ``numba_pool (history never on)`` and
  ``numba_pool arena (history never on)``: managers made after the switch, whose paths it never
  touched.  An off row's paired difference from its never-on row is what switching leaves
  behind.  Against numba_pool from before the history existed, run the bench with
  ``--baseline`` of that checkout: the main table's ``vs baseline`` column.
* **On.** ``<path> + history, depth N`` (N in :data:`~numba_pool_tools.bench.labels.HISTORY_DEPTHS`):
  the same manager's allocator through the path the plugin composes while the history records
  Python stacks (:func:`numba_pool.plugin.path.compose` with a recording: the adaptor outermost,
  over the same layers), each block of pairs called from a recursion (:func:`at_depth`) so that
  every allocation's recorded stack has N frames.  The frames below the bench's own count too
  (``runpy``'s, ``<module>``, ``run``, ``time_in_turns``), so the smallest N may be out of
  reach: each row carries the frames the history recorded (``frames``, read back from it after
  timing), and a note says where they are not N.  ``<path> + history, no stacks``: the same
  with ``stacks="none"``.  Each recorded row has a recording of its own, with the default
  ``max_entries``, filled before timing (:func:`ready`): its ring is full, as in a program that
  has recorded a while, so every event appended drops the oldest (and with an allocation's last
  event, its frames).

A recorded row's added cost is its paired difference from the same path without the adaptor
(µs per pair, the median and its 95 % interval, per repeat as every difference of the
allocator part); the checks are :func:`numba_pool_tools.bench.checks.history_flags`'s.  As for every
row of the bench, the collector is off while timing: in a program, the tuples a recorded stack
is made of also bring its young-generation collections sooner, which these figures leave out.

Parent side: :func:`render`, the history's table, from the run's JSON.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from typing import Callable

from . import checks
from .core import MAX_FRAMES, History, Recording, compose, record_history
from .labels import ARENA, HISTORY_DEPTHS, NEVER_RECORDED_SUFFIX, NUMBA_POOL, history_label, size_label

#: The paths whose cost with the history is measured (the rows of every table).
PATHS = (NUMBA_POOL, ARENA)


class HistoryBenchError(RuntimeError):
    """The history's rows cannot be measured as they claim: the switch left the path changed,
    or the recorded path is not the plugin's path with the adaptor outermost."""


# -- worker side --------------------------------------------------------------------------------

def switch_on_and_off(managers: dict) -> None:
    """Switch the history on, then off (:func:`numba_pool.record_history`), as a program would,
    and check what it did to ``managers`` (``{label: numba_pool manager}``, initialized): while
    on, each path has ``history`` outermost; off again, each path is the one it had before,
    with no ``history`` in its layers, and is the manager's ``memalloc``.

    :raises HistoryBenchError: naming the manager and its path, where either does not hold.
    """
    record_history(False)
    before = {label: m.path for label, m in managers.items()}
    record_history(True)
    try:
        missed = [f"{label} {m.path.layers}" for label, m in managers.items() if m.path.layers[:1] != ("history",)]
    finally:
        record_history(False)
    if missed:
        raise HistoryBenchError(f"bench: numba_pool.record_history() put no history in the path of {', '.join(missed)}")
    for label, manager in managers.items():
        path, was = manager.path, before[label]
        if "history" in path.layers or path.layers != was.layers or path.allocate != was.allocate \
                or manager.memalloc != path.allocate:
            raise HistoryBenchError(f"bench: {label}: after numba_pool.record_history() on and off, its path is "
                                    f"{path.layers} through {path.allocate!r}, not {was.layers} through "
                                    f"{was.allocate!r} as before: switching the history left something behind")


@dataclass(frozen=True)
class Recorded:
    """One recorded row: its ``label``, the path it is measured against (``of``), ``stacks``
    (``"python"``, ``"none"``), the stack ``depth`` wanted (None without stacks), its
    ``memalloc`` (the composed path's ``allocate``) and its ``history``."""

    label: str
    of: str
    stacks: str
    depth: int | None
    memalloc: Callable[[int], object]
    history: History


def recorded(managers: dict, depths=HISTORY_DEPTHS) -> list[Recorded]:
    """The recorded rows of each path of :data:`PATHS` in ``managers`` (``{label: manager}``):
    one without stacks, one with Python stacks per depth of ``depths``; each through
    :func:`numba_pool.plugin.path.compose` over the manager's allocator, with a recording of its
    own (the default ``max_entries``).

    :raises HistoryBenchError: when a composed path is not the manager's with the history
        outermost.
    """
    rows = []
    for path in PATHS:
        manager = managers.get(path)
        if manager is None:
            continue
        for depth in (None, *depths):
            stacks = "none" if depth is None else "python"
            history = History(stacks=stacks)
            composed = compose(manager.allocator, log=manager.log,
                               recording=Recording(history=history, device=manager.device_id,
                                                   deferral=manager.deferral, device_free=_no_figure,
                                                   on_oom=_nothing))
            if composed.layers != ("history", *manager.path.layers):
                raise HistoryBenchError(f"bench: {path}: the recorded path is {composed.layers}, not the manager's "
                                        f"{manager.path.layers} with the history outermost")
            rows.append(Recorded(history_label(path, depth), path, stacks, depth, composed.allocate, history))
    return rows


def _no_figure() -> int:
    return 0


def _nothing(*args) -> None:
    pass


def stack_depth(frame) -> int:
    """Frames from ``frame`` to the bottom of its thread's stack, ``frame`` included."""
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def at_depth(depth: int, block: Callable, *args):
    """``block(*args)`` called from a recursion, so that ``block``'s frame is the ``depth``-th
    from the bottom of the stack (:func:`stack_depth`), or as shallow as this call allows (the
    caller's frame, this one, then ``block``'s)."""
    more = depth - stack_depth(sys._getframe(1)) - 2  # frames to add between this one and block's
    return _down(more, block, args) if more > 0 else block(*args)


def _down(more: int, block: Callable, args: tuple):
    """``more`` frames of this function, the last one calling ``block(*args)``."""
    return _down(more - 1, block, args) if more > 1 else block(*args)


def frames_recorded(history: History) -> int:
    """The frames of the newest allocation ``history`` recorded (0 when it recorded none)."""
    for event in reversed(history.ring):  # the raw events: History.entries converts the whole ring
        if event[0] == "alloc":
            return len(event[8]) // 2  # its frames, a flat list: code, offset per frame
    return 0


def _probe(memalloc: Callable[[int], object], size: int) -> int:
    """One pair through ``memalloc``, called from this frame as ``block`` calls it; returns this
    frame's :func:`stack_depth`."""
    depth = stack_depth(sys._getframe())
    pointer = memalloc(size)
    del pointer
    return depth


def offset(row: Recorded, size: int) -> int:
    """Frames ``row``'s history records for an allocation called from a frame at a given
    :func:`stack_depth`, minus that depth (0 when the stack starts at the caller, as
    numba_pool's adaptor means it to); 0 where the stack is deeper than the frames it keeps."""
    depth = _probe(row.memalloc, size)
    frames = frames_recorded(row.history)
    return frames - depth if frames < MAX_FRAMES else 0


def ready(rows: list[Recorded], block: Callable, size: int, pairs: int,
          synchronize: Callable[[], None] = lambda: None) -> dict[str, Callable]:
    """The block of each recorded row (``block(memalloc, size, pairs)`` for the turns, called at
    the row's depth through :func:`at_depth`), each row's ring filled first: blocks of ``pairs``
    pairs of ``size`` bytes until it holds ``max_entries`` events, ``synchronize()`` after each.
    Returns ``{label: block}``."""
    blocks = {}
    for row in rows:
        blocks[row.label] = block if row.depth is None else partial(at_depth, row.depth - offset(row, size), block)
        ring = row.history.ring
        while len(ring) < ring.maxlen:
            blocks[row.label](row.memalloc, size, pairs)
            synchronize()
    return blocks


def about(rows: list[Recorded]) -> dict[str, dict]:
    """What the table says of each recorded row: ``{label: {"of", "stacks", "depth", "frames"}}``
    (``frames``: what its history recorded last)."""
    return {row.label: {"of": row.of, "stacks": row.stacks, "depth": row.depth,
                        "frames": frames_recorded(row.history)} for row in rows}


def notes(rows: list[Recorded]) -> list[str]:
    """One note per row with Python stacks whose history recorded other than the depth wanted."""
    out = []
    for row in rows:
        frames = frames_recorded(row.history)
        if row.depth is not None and frames != row.depth:
            why = ("the fewest this process can: the frames below the bench's own count too" if frames > row.depth
                   else f"the history keeps {MAX_FRAMES} at most")
            out.append(f"{row.label}: {frames} frames recorded ({why})")
    return out


# -- parent side ----------------------------------------------------------------------------------

def present(results: dict) -> bool:
    """Whether a run's table (``{size: {label: row}}``) has the history's rows."""
    return any(row.get("history") or row.get("vs_never_recorded") for rows in results.values() for row in rows.values())


def render(results: dict, flags: list = ()) -> str:
    """The history's table: per size and path, the path never switched on, the path off (after
    on and off; added: vs the path never on), then without stacks and with Python stacks at
    each depth (the frames recorded; added: vs the path off), each with its µs per pair and
    the added µs with their 95 % interval.  A row a check flagged has ``!`` after its label."""
    from tabulate import tabulate

    marked = set().union(*(checks.flagged(list(flags), table) for table in ("history", "allocator", "allocator runs")))
    rows = []
    for size, per_label in results.items():
        for path in PATHS:
            recorded_rows = [label for label, r in per_label.items() if (r.get("history") or {}).get("of") == path]
            if not recorded_rows and path + NEVER_RECORDED_SUFFIX not in per_label:
                continue
            for label in [path + NEVER_RECORDED_SUFFIX, path, *recorded_rows]:
                row = per_label.get(label)
                if row is not None:
                    shown = label + " !" if (size, label) in marked else label
                    rows.append([size_label(int(size)), shown, *_cells(label, path, row)])
    headers = ["size", "allocator", "history", "frames recorded", "us per pair",
               "added, us [95% CI] (on: vs off; off: vs never on)"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _cells(label: str, path: str, row: dict) -> list[str]:
    history = row.get("history")
    if history is not None:
        python = history["stacks"] == "python"
        what = f"Python stacks, depth {history['depth']}" if python else "no stacks"
        return [what, str(history["frames"]) if python else "-", f"{row['median_us']:.2f}", _difference(history["added"])]
    what = "off (switched on, then off)" if label == path else "never switched on"
    return [what, "", f"{row['median_us']:.2f}", _difference(row.get("vs_never_recorded"))]


def _difference(d: dict | None) -> str:
    return "" if d is None else f"{d['median']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"
