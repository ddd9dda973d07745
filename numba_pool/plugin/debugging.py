"""Memory debugging across the process's managers: every device's snapshots, out-of-memory observers and
``NUMBA_POOL_OOM_SNAPSHOT``'s file, ``NUMBA_POOL_LEAK_REPORT``'s report.  The managers' registry is an argument;
the history itself is :mod:`numba_pool.observe.history`'s, the recording and observers the process state's."""

from __future__ import annotations

import atexit
import inspect
import sys
from typing import Callable, Iterable

from ..cuda.driver import warn
from ..observe import history as _history
from ..observe import snapshot as _snapshot
from .state import process


def segments_of(manager) -> list[dict]:
    """One manager's segments: its device allocator's, then its pinned and managed caches'."""
    if manager.allocator is None:
        return []
    segments = manager.allocator.segments()
    for cache in (manager.host, manager.managed):
        if cache is not None:
            segments += cache.segments()
    return segments


def snapshot_of(managers: Iterable, segments: Callable = segments_of) -> dict:
    """``managers``' snapshot with the history; ``segments(manager)`` reads each one's (Dask's pushes its context)."""
    by_device: dict[int, list[dict]] = {}
    for door in process.free_list_doors():  # the blocks a door's free list keeps (their owners freed them), shown freed
        door.give_back()
    for manager in managers:
        by_device.setdefault(manager.device_id, []).extend(segments(manager))
    return _snapshot.build(by_device, process.recording)


def ensure_recording() -> None:
    """Start the history with Python stacks unless on (the reports name allocation sites)."""
    if process.recording is None:
        process.set_recording(_history.History())


def add_observer(callback: Callable) -> None:
    """Run ``callback(device, size, snapshot)`` at each out of memory, after the retry, before raising (same thread)."""
    if not callable(callback):
        raise TypeError(f"numba_pool.on_out_of_memory: {callback!r} is not callable")
    try:
        inspect.signature(callback).bind(0, 0, {})
    except TypeError:
        raise TypeError(f"numba_pool.on_out_of_memory: {callback!r:.80} cannot be called as callback(device, size, "
                        "snapshot)") from None
    except ValueError:  # no signature to read (some builtins): taken as given
        pass
    process.add_observer(callback)
    ensure_recording()


def out_of_memory(managers: Callable[[], Iterable], oom_snapshot: str | None, device: int, size: int, error) -> None:
    """Out of memory after the retry: one snapshot, to the ``oom_snapshot`` file once and to observers; never raises."""
    observers, write = process.out_of_memory_targets(oom_snapshot)
    if not observers and not write:
        return
    snapshot = snapshot_of(managers())
    if write:
        try:
            _snapshot.dump(snapshot, oom_snapshot)
        except OSError as err:
            warn(f"NUMBA_POOL_OOM_SNAPSHOT={oom_snapshot!r}: the snapshot could not be written ({err.strerror})")
    for observer in observers:
        try:
            observer(device, size, snapshot)
        except Exception as err:  # noqa: BLE001 - the out-of-memory error is what the program gets
            warn(f"an out-of-memory observer ({observer!r}) raised {err!r}")


def live_allocations(group_by: str | None = "site", device: int | None = None) -> list:
    """What the history says is held now (:func:`numba_pool.live_allocations`)."""
    recording = process.recording
    if recording is None:
        raise RuntimeError("numba_pool.live_allocations: no history is being recorded: call "
                           "numba_pool.record_history() first (or set NUMBA_POOL_LEAK_REPORT=1)")
    if group_by == "site":
        return _history.top_sites(recording, device)
    if group_by is None:
        return sorted(((_history.site_of(e.frames), e.size, e.device, e.address, e.kind)
                       for e in list(recording.live.values())), key=lambda r: (-r[1], r[0]))
    raise ValueError(f"numba_pool.live_allocations: group_by={group_by!r} must be 'site' or None")


def enable_leak_report(managers: Callable[[], Iterable]) -> None:
    """Print the leak report at exit (once per process), and record from now on."""
    ensure_recording()
    if process.leak_report_once():
        atexit.register(print_leak_report)


def leak_report(limit: int = 10) -> str:
    """The report: the top ``limit`` sites holding memory, a line each (bytes, arrays); ``""`` if none."""
    recording = process.recording
    rows = _history.top_sites(recording) if recording is not None else []
    if not rows:
        return ""
    total = sum(nbytes for _, nbytes, _ in rows)
    lines = [f"numba_pool: memory still held at exit (NUMBA_POOL_LEAK_REPORT): {_history._size(total)} "
             f"from {len(rows)} site{'s' * (len(rows) != 1)}"]
    lines += [f"  {site}: {_history._size(nbytes)} in {count} array{'s' * (count != 1)}"
              for site, nbytes, count in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"  ... and {len(rows) - limit} more sites")
    return "\n".join(lines)


def print_leak_report() -> None:
    report = leak_report()
    if report:
        print(report, file=sys.stderr, flush=True)
