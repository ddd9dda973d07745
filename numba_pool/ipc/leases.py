"""IPC leases: the importers' claims on an export, as files, and the hold that keeps an exported
block from reuse while a living importer claims it (:mod:`numba_pool.ipc`, "Lifetimes")."""

from __future__ import annotations

import glob
import itertools
import os
import tempfile
import threading
import time
from typing import Callable

LEASE_CHECK_S = 0.05  #: How often the daemon thread looks at the leases of released exports (seconds).


def lease_folder() -> str:
    """Where leases live: ``/dev/shm`` (memory, gone at reboot) when writable, else the temporary folder."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class Lease:
    """The importers' claims on one export: files ``numba_pool-ipc-<export>-<pid>-<n>`` in ``folder``."""

    _opened = itertools.count(1)

    def __init__(self, folder: str, export: str):
        self.folder, self.export = folder, export

    def take(self) -> str:
        """An importer's claim (this process): returns the file to give back."""
        path = os.path.join(self.folder, f"numba_pool-ipc-{self.export}-{os.getpid()}-{next(self._opened)}")
        with open(path, "x"):
            pass
        return path

    def held(self) -> bool:
        """Whether a living process holds a claim; the claims of dead ones are removed."""
        held = False
        for path in glob.glob(os.path.join(self.folder, f"numba_pool-ipc-{self.export}-*")):
            pid = int(path.rsplit("-", 2)[-2])
            if _alive(pid):
                held = True
            else:
                remove_lease(path)
        return held


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_lease(path: str) -> None:
    """Remove a lease file (gone already: nothing to do)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class LeaseHold:
    """A hold (:mod:`numba_pool.allocator.waits`) on an exported block: its release waits while a living
    importer claims the export's lease (``lease``; ``queue``: the process's :class:`LeaseQueue`)."""

    def __init__(self, lease: Lease, queue: "LeaseQueue"):
        self.lease, self.queue = lease, queue

    def defer(self, release: Callable[[], None]) -> bool:
        """Never raises: True while the lease is held (``release`` runs later, in the lease thread), else False."""
        if not self.lease.held():
            return False
        self.queue.add(_Pending(release, self.lease))
        return True


class _Pending:
    """A release that waits for a lease to go."""

    def __init__(self, release: Callable[[], None], lease: Lease):
        self.release, self.lease = release, lease


class LeaseQueue:
    """Exported arrays released while importers hold them; a daemon thread (started at the first, kept for the
    process's life) runs each release once its lease goes.  ``add`` runs in a finalizer, so nothing blocks on
    a lock: atomic list operations only, and the thread is started under a lock taken without waiting."""

    def __init__(self):
        self._pending: list[_Pending] = []  # atomic operations only
        self._start = threading.Lock()  # acquired without blocking, by whoever starts the thread
        self._started = False

    def add(self, release: _Pending) -> None:
        self._pending.append(release)
        if not self._started and self._start.acquire(blocking=False):
            try:  # else someone is starting it: it will see this release
                if not self._started:
                    threading.Thread(target=self._run, name="numba_pool-ipc-leases", daemon=True).start()
                    self._started = True
            finally:
                self._start.release()

    def pending(self) -> int:
        """Releases of exported arrays that wait for an importer to close."""
        return len(self._pending)

    def _run(self) -> None:
        while True:
            time.sleep(LEASE_CHECK_S)
            for waiting in list(self._pending):
                if waiting.lease.held():  # files: no lock
                    continue
                try:
                    self._pending.remove(waiting)
                except ValueError:  # not ours to run
                    continue
                waiting.release()
