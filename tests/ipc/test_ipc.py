"""IPC's host side, for real: export data, the pool descriptor's journey to another process,
leases (claims, dead importers, held-back releases) and the handle's pickled form."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import time

import pytest

from helpers import FRONTEND
from numba_pool import ipc
from numba_pool.cuda import frontend as frontends
from numba_pool.ipc.handle import handle_class

SPAWN = mp.get_context("spawn")


def test_export_data_is_64_bytes_both_ways():
    from cuda.bindings import driver as cu

    data = ipc.ExportData(bytes(range(64)))
    assert ipc.ExportData.from_driver(data.to_driver(cu)).reserved == bytes(range(64))
    with pytest.raises(ValueError, match="must be 64 bytes, got 63"):
        ipc.ExportData(bytes(63))


@pytest.mark.parametrize("how", ["spawn-argument", "pipe"])
def test_the_pool_descriptor_reaches_a_spawned_process(how):
    import ipc_children

    read_end, write_end = os.pipe()
    os.write(write_end, b"pool descriptor")
    os.close(write_end)
    try:
        handle = handle_class(FRONTEND)(object(), ipc.ExportData(bytes(64)), 8, None, pool_key="k", fd=read_end,
                                        lease=ipc.Lease("/tmp", "x"))
        source = pickle.loads(pickle.dumps(handle))._fd  # what the importer gets: (DupFd, pid, fd)
        assert source[1:] == (os.getpid(), read_end)
        if how == "spawn-argument":
            with SPAWN.Pool(1) as pool:
                assert pool.apply(ipc_children.receive_and_read, (source,)) == b"pool descriptor"
        else:
            parent, child = SPAWN.Pipe()
            p = SPAWN.Process(target=_read_from_pipe, args=(child,))
            p.start()
            parent.send(source)
            assert parent.recv() == b"pool descriptor"
            p.join(30)
    finally:
        os.close(read_end)


def _read_from_pipe(conn):
    import ipc_children

    conn.send(ipc_children.receive_and_read(conn.recv()))


def test_a_descriptor_from_an_unrelated_process_falls_back_to_pidfd_getfd_or_says_why():
    read_end, write_end = os.pipe()
    os.write(write_end, b"x")

    class Refused:
        def detach(self):
            raise ConnectionRefusedError("another authentication key")

    try:
        try:
            fd = ipc.receive_fd((Refused(), os.getpid(), read_end))
        except RuntimeError as err:  # no right to trace ourselves here: the message says what to do
            assert "pidfd_getfd failed" in str(err) and f"pid {os.getpid()}" in str(err)
        else:
            assert os.read(fd, 1) == b"x"
            os.close(fd)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_lease_is_held_while_a_living_importer_claims_it(tmp_path):
    lease = ipc.Lease(str(tmp_path), "123-1")
    assert not lease.held()
    path = lease.take()
    assert lease.held() and os.path.exists(path)
    os.unlink(path)
    assert not lease.held()


def test_a_dead_importers_lease_is_removed(tmp_path):
    import ipc_children

    lease = ipc.Lease(str(tmp_path), "123-2")
    with SPAWN.Pool(1) as pool:
        path = pool.apply(ipc_children.take_lease, (str(tmp_path), "123-2", True))
        assert lease.held()  # the importer lives
    # the pool's worker has exited without giving it back
    deadline = time.monotonic() + 10
    while lease.held() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not lease.held() and not os.path.exists(path)


def test_a_release_waits_for_the_leases_and_then_runs_once(tmp_path):
    lease = ipc.Lease(str(tmp_path), "123-3")
    released = []
    claim = lease.take()
    queue = ipc.LeaseQueue()
    assert ipc.LeaseHold(lease, queue).defer(lambda: released.append(1))  # kept: it runs later
    time.sleep(3 * ipc.LEASE_CHECK_S)
    assert released == [] and queue.pending() == 1
    os.unlink(claim)
    deadline = time.monotonic() + 5
    while not released and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(3 * ipc.LEASE_CHECK_S)
    assert released == [1] and queue.pending() == 0


def test_a_release_without_leases_is_not_kept(tmp_path):
    released = []
    queue = ipc.LeaseQueue()
    assert not ipc.LeaseHold(ipc.Lease(str(tmp_path), "123-4"), queue).defer(lambda: released.append(1))
    assert released == [] and queue.pending() == 0  # the caller releases now


def test_the_pickled_handle_carries_what_numba_checks(frontend_name):
    frontend = frontends.load(frontend_name)
    handle = handle_class(frontend)(object(), ipc.ExportData(bytes(range(64))), 80, {"pci_bus_id": 3}, offset=24,
                                    pool_key="pid-uuid", fd=0, lease=ipc.Lease("/dev/shm", "9-9"))
    assert isinstance(handle, frontend.IpcHandle) and isinstance(handle, ipc.PoolIpcHandle)
    again = pickle.loads(pickle.dumps(handle))
    # Rebuilt on the exporter's frontend, which this process uses too (the test imports both).
    assert type(again).frontend is frontend and isinstance(again, frontend.IpcHandle)
    assert again.base is None and again.size == 80 and again.offset == 24
    assert again.handle.reserved == handle.handle.reserved and again.source_info == {"pci_bus_id": 3}
    assert (again.pool_key, again.lease.folder, again.lease.export) == ("pid-uuid", "/dev/shm", "9-9")
    with pytest.raises(ValueError, match="opening IpcHandle from original process"):
        handle.open_direct(None)
    with pytest.raises(ValueError, match="IpcHandle not opened"):
        again.close()
