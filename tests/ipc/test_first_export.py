"""Issue 34, defect 4: two threads exporting a pool for the first time at once.

``MemPool.export_fd`` published the descriptor before the pool's key: a second thread that saw
the descriptor returned it and read ``export_key`` before it existed (``AttributeError``, after
``get_ipc_handle`` had synchronized and registered its hold).  Run on the CUDA model; the second
thread is injected at the exact point of the first one's export where it landed: after the
driver's export, as the key is made (``uuid.uuid4``).  Failed before the fix (seen once):
``AttributeError: 'MemPool' object has no attribute 'export_key'``."""

from __future__ import annotations

import concurrent.futures
import uuid
from types import SimpleNamespace

from cuda_model.harness import Program
from numba_pool.cuda import mempool

#: How long the first export waits for the second thread at the injection point.  A fixed
#: export holds the second one back (it waits for the first), so this wait runs out; before the
#: fix the second thread returned at once, with the error.
BLOCKED_AFTER = 1.0


def test_two_threads_exporting_a_pool_for_the_first_time(monkeypatch):
    p = Program(arena=False)
    try:
        pool = p.mm.allocator.pool
        assert pool.exportable
        second: list = []

        def uuid4():  # injection point: the first export is between its driver call and its key
            if not second:
                second.append(p.workers[0].submit(lambda: (pool.export_fd(), pool.export_key)))
                concurrent.futures.wait(second, timeout=BLOCKED_AFTER)
            return uuid.uuid4()

        monkeypatch.setattr(mempool, "uuid", SimpleNamespace(uuid4=uuid4))
        exports: list = []
        export = pool._cu.cuMemPoolExportToShareableHandle

        def counted(*args):
            exports.append(args)
            return export(*args)

        monkeypatch.setattr(pool._cu, "cuMemPoolExportToShareableHandle", counted)
        first = (pool.export_fd(), pool.export_key)
        assert second, "the first export made no key"
        assert second[0].result(60) == first  # one descriptor, one key, for both threads
        assert len(exports) == 1  # the pool exported once: no descriptor left open unused
    finally:
        p.close()
