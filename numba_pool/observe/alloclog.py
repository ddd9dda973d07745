"""The allocation log: every allocate and free as CSV in RMM's logging format (its readers take the six columns
unchanged) plus the memory's kind: header ``Thread,Time,Action,Pointer,Size,Stream,Kind``.  Kinds: :data:`KINDS`;
actions ``allocate``, ``free``, ``allocate failure``; pointer and stream in hex; time ``%H:%M:%S.%f`` as RMM's
``logging_resource_adaptor``.  Rows are buffered, written when the buffer fills, at :meth:`AllocationLog.flush`
(``reset`` calls it) and at exit.  The adaptor, :class:`LoggedAllocations`, is in the path only while a log is set."""

from __future__ import annotations

import atexit
import csv
import datetime
import threading
from collections import deque
from typing import Callable

from ..cuda.errors import CudaAPIError
from ..cuda.pointers import PoolPointer
from ..cuda.streams import per_thread

HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream", "Kind")
ACTIONS = ("allocate", "free", "allocate failure")
DOOR_KINDS = ("cuda.core", "cupy", "torch")  #: Device memory of MemoryResource, cupy_allocator, torch_allocator
KINDS = ("device", "managed", "graph") + DOOR_KINDS  #: device: memalloc, managed: memallocmanaged, graph: capturing
GRAPH = "graph"
FLUSH_EVERY = 4096  #: Rows buffered before they are written.


class AllocationLog:
    """Appends rows to ``path``, a CSV file in RMM's logging format (truncated and given the header at once).
    :raises OSError: when the file cannot be written."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "w", newline="")
        self._writer = csv.writer(self._file, lineterminator="\n")
        self._writer.writerow(HEADER)
        self._file.flush()
        self._rows: deque = deque()
        self._lock = threading.Lock()
        atexit.register(self.flush)

    def _add(self, action: str, pointer: int, size: int, stream: int, kind: str) -> None:
        now = datetime.datetime.now().strftime("%H:%M:%S.%f")
        self._rows.append((threading.get_ident(), now, action, f"{pointer:#x}", size, f"{stream:#x}", kind))
        if len(self._rows) >= FLUSH_EVERY:
            self.flush(wait=False)

    def allocate(self, pointer: int, size: int, stream: int, kind: str = "device") -> None:
        """Log ``size`` bytes of ``kind`` (:data:`KINDS`) allocated at ``pointer`` on stream ``stream``."""
        self._add("allocate", pointer, size, stream, kind)

    def free(self, pointer: int, size: int, stream: int, kind: str = "device") -> None:
        self._add("free", pointer, size, stream, kind)

    def failure(self, size: int, stream: int, kind: str = "device") -> None:
        self._add("allocate failure", 0, size, stream, kind)

    def close(self) -> None:
        """Write the buffered rows and close the file; rows added later are dropped."""
        atexit.unregister(self.flush)
        with self._lock:
            if not self._file.closed:
                while self._rows:
                    self._writer.writerow(self._rows.popleft())
                self._file.close()

    def flush(self, wait: bool = True) -> None:
        """Write the buffered rows (``wait=False``: not if another thread, or a finalizer in this one, is writing)."""
        if not self._lock.acquire(blocking=wait):
            return
        try:
            if self._file.closed:
                return
            rows = self._rows
            while rows:
                self._writer.writerow(rows.popleft())
            self._file.flush()
        finally:
            self._lock.release()


class LoggedAllocations:
    """Logging adaptor over ``upstream``: ``kind`` rows per allocation or failure, and per free before its release."""

    def __init__(self, upstream: Callable[[int], PoolPointer], log: AllocationLog, kind: str = "device"):
        self._upstream = upstream
        self._log = log
        self._kind = kind
        self._then_release = self._log_then_release  # bound once, not per allocation

    def allocate(self, size: int) -> PoolPointer:
        """``size`` bytes from upstream, logged; the pointer's release logs the free first.
        :raises CudaAPIError: upstream's, after logging an ``allocate failure`` row."""
        stream = per_thread.stream.value
        try:
            mem = self._upstream(size)
        except CudaAPIError:
            self._log.failure(size, stream, self._kind)
            raise
        address = mem.device_pointer_value
        kind = GRAPH if mem.captured else self._kind  # rule 13: an allocation node of a capture
        self._log.allocate(address, size, stream, kind)
        mem.wrap_release(self._then_release, address, size, stream, kind)
        return mem

    def _log_then_release(self, address: int, size: int, stream: int, kind: str, release: Callable[[], None]) -> None:
        self._log.free(address, size, stream, kind)  # any thread, a finalizer: never raises (deque; flush(wait=False))
        release()
