"""Functions that IPC tests run in spawned processes (importable there: spawn pickles them by
name).  Each returns plain data for the parent to check."""

from __future__ import annotations

import faulthandler
import functools
import os
import sys


def _watchdog() -> None:
    """GPU children: a hang prints where it is and ends the process after 45 s."""
    faulthandler.dump_traceback_later(45, exit=True, file=sys.stderr)


def receive_and_read(fd_source) -> bytes:
    """CPU: receive a descriptor the way an importer receives the exporter's pool descriptor
    and read what the parent wrote into the pipe behind it."""
    from numba_pool import ipc

    fd = ipc.receive_fd(fd_source)
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


def take_lease(folder: str, export: str, keep: bool) -> str:
    """CPU: an importer's claim; ``keep=False`` gives it back before returning."""
    from numba_pool import ipc

    path = ipc.Lease(folder, export).take()
    if not keep:
        os.unlink(path)
    return path


def open_double_close(array_handle, device: int = 0) -> dict:
    """GPU: open an exported array on ``device``, read it, double it in place, close; report
    what was read and this process's own pool use after the close."""
    _watchdog()
    import numpy as np
    from numba_pool.cuda.frontend import for_tools
    cuda = for_tools().cuda  # the parent's frontend: children inherit NUMBA_POOL_FRONTEND

    import numba_pool

    with cuda.gpus[device]:
        with array_handle as arr:
            seen = arr.copy_to_host()
            arr.copy_to_device(seen * 2)
            cuda.synchronize()
        stats = numba_pool.stats(device)
    return {"seen": seen.tolist(), "manager": type(cuda.current_context().memory_manager).__name__,
            "own_pool_used": stats.pool_used_bytes, "pid": os.getpid(), "dtype": str(np.dtype(seen.dtype))}


def hold_until_told(array_handle, conn) -> None:
    """GPU: open, tell the parent, keep it open until told, close, tell the parent."""
    _watchdog()
    from numba_pool.cuda.frontend import for_tools
    cuda = for_tools().cuda  # the parent's frontend: children inherit NUMBA_POOL_FRONTEND

    with array_handle as arr:
        conn.send(float(arr.copy_to_host()[0]))
        conn.recv()
        cuda.synchronize()
    conn.send("closed")


def export_then_exit(conn) -> None:
    """GPU: allocate and fill an array, send its handle, wait until the parent has opened it,
    then exit with the array still exported."""
    _watchdog()
    import numpy as np
    from numba_pool.cuda.frontend import for_tools
    cuda = for_tools().cuda  # the parent's frontend: children inherit NUMBA_POOL_FRONTEND

    d = cuda.to_device(np.full(1000, 7.0, dtype=np.float32))
    conn.send(d.get_ipc_handle())
    conn.recv()  # opened
    conn.close()
    os._exit(0)  # no cleanup: the harshest exit


def warm_up() -> None:
    """GPU: make this process's context and compile the fill kernel, so that a later call
    starts writing at once."""
    _watchdog()
    import numpy as np
    from numba_pool.cuda.frontend import for_tools
    cuda = for_tools().cuda  # the parent's frontend: children inherit NUMBA_POOL_FRONTEND

    d = cuda.to_device(np.zeros(1024, dtype=np.float32))
    _fill_kernel()[4, 256](d, 1.0)
    cuda.synchronize()


def fill_at_once(array_handle, value: float) -> None:
    """GPU: open an exported array and write ``value`` to every element at once (a kernel),
    then synchronize and close: the producer that fills what a consumer exported."""
    _watchdog()
    from numba_pool.cuda.frontend import for_tools
    cuda = for_tools().cuda  # the parent's frontend: children inherit NUMBA_POOL_FRONTEND

    with array_handle as arr:
        _fill_kernel()[64, 256](arr, value)
        cuda.synchronize()


@functools.lru_cache(maxsize=None)
def _fill_kernel():
    """The fill kernel, compiled once per process."""
    from numba_pool.cuda.frontend import for_tools
    cuda = for_tools().cuda  # the parent's frontend: children inherit NUMBA_POOL_FRONTEND

    @cuda.jit
    def fill(a, value):
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, a.size, stride):
            a[i] = value

    return fill
