"""The cuda.core door on a real GPU, in both modes (issue 35, items 1 and 2): Numba's launches with
host-array arguments allocate through numba_pool, ``numba_pool.MemoryResource`` hands out cuda.core
``Buffer``s counted in ``stats()``, and a buffer freed on the stream of its last use is not reused
before that use finished (rule 14 of :mod:`numba_pool.allocator`)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver as cu

from helpers import GPU, cuda

pytestmark = pytest.mark.gpu

if GPU:
    import numba_pool
    from cuda.core import LEGACY_DEFAULT_STREAM, Device, DeviceMemoryResource
    from kernels import fill_kernel

    from gpu_helpers import POISON, THREADS, blocks, read_after_delay

    @cuda.jit
    def add_one(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1


def _default_pool_used_high() -> int:
    """The high watermark of used bytes of the device's default mempool, reset to its current use first
    when ``reset``."""
    err, device = cu.cuCtxGetDevice()
    assert not err, err
    err, pool = cu.cuDeviceGetDefaultMemPool(device)
    assert not err, err
    err, value = cu.cuMemPoolGetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    assert not err, err
    return int(value)


def _reset_default_pool_high() -> None:
    err, device = cu.cuCtxGetDevice()
    err, pool = cu.cuDeviceGetDefaultMemPool(device)
    err, = cu.cuMemPoolSetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_HIGH, cu.cuuint64_t(0))
    assert not err, err


def test_launches_with_a_host_array_allocate_from_numba_pool():
    host = np.zeros(1 << 18, dtype=np.float32)  # 1 MiB
    add_one[blocks(host.size), THREADS](host)  # the context, the manager and the door exist from here
    cuda.synchronize()
    assert isinstance(cuda.current_context().device._dev.memory_resource, numba_pool.MemoryResource)
    _reset_default_pool_high()
    before = numba_pool.stats().total_allocations
    default_before = _default_pool_used_high()
    for _ in range(200):
        add_one[blocks(host.size), THREADS](host)
    cuda.synchronize()
    grew = numba_pool.stats().total_allocations - before
    print(f"200 launches with a 1 MiB host array: total_allocations +{grew}; default pool's used high "
          f"{default_before} -> {_default_pool_used_high()} bytes")
    reuses = cuda.current_context().device._dev.memory_resource.native.reuses
    print(f"... of which {reuses} from the door's legacy-stream free list")
    assert grew >= 200
    assert _default_pool_used_high() == default_before, "a launch allocated from the device's default pool"
    assert np.all(host == 201)


def test_a_buffer_is_counted_until_closed_on_its_stream():
    cuda.current_context()
    device = Device(cuda.get_current_device().id)
    device.set_current()
    resource = numba_pool.MemoryResource(device.device_id)
    stream = device.create_stream()
    in_use = numba_pool.stats().bytes_in_use
    buffer = resource.allocate(1 << 20, stream=stream)
    assert buffer.memory_resource is resource and buffer.size == 1 << 20
    assert numba_pool.stats().bytes_in_use == in_use + (1 << 20)
    buffer.close()
    stream.sync()
    assert numba_pool.stats().bytes_in_use == in_use
    with pytest.raises(ValueError, match=r"size=-1 must be a positive number of bytes"):
        resource.allocate(-1, stream=stream)


def _as_array(buffer, n: int):
    interface = {"shape": (n,), "typestr": "<f4", "data": (int(buffer.handle), False), "version": 3,
                 "strides": None, "stream": None}
    return cuda.from_cuda_array_interface(interface, owner=buffer, sync=False)


def _race(resource, trials: int = 20, nbytes: int = 8 << 20, delay_us: int = 3000, legacy: bool = False,
          close_on_b: bool = True) -> tuple[int, int]:
    """A reader kernel on stream B reads buffer A (written first); the buffer is closed on B (the
    stream of its last use, the door's documented use; else, the planted bug, on its allocation stream with B's
    read not ordered before) and a buffer of the same size is allocated on stream A (``legacy``: the legacy
    stream) and filled with poison there.  Returns (trials in which the new buffer reused A's address,
    elements the reader saw poisoned)."""
    device = Device(cuda.get_current_device().id)
    device.set_current()
    stream_a, stream_b = LEGACY_DEFAULT_STREAM if legacy else device.create_stream(), device.create_stream()
    a_numba = cuda.legacy_default_stream() if legacy else cuda.external_stream(int(stream_a.handle))
    b_numba = cuda.external_stream(int(stream_b.handle))
    n = nbytes // 4
    hits = cuda.to_device(np.zeros(1, dtype=np.int64))
    reused = 0
    for _ in range(trials):
        first = resource.allocate(nbytes, stream=stream_a)
        fill_kernel[blocks(n), THREADS, a_numba](_as_array(first, n), np.float32(1.0))
        stream_a.sync()
        read_after_delay[32, THREADS, b_numba](_as_array(first, n), POISON, delay_us, hits)
        address = int(first.handle)
        first.close(stream_b if close_on_b else None)
        second = resource.allocate(nbytes, stream=stream_a)
        fill_kernel[blocks(n), THREADS, a_numba](_as_array(second, n), POISON)
        reused += int(second.handle) == address
        cuda.synchronize()
        second.close()
    cuda.synchronize()
    return reused, int(hits.copy_to_host()[0])


def test_a_buffer_closed_on_its_readers_stream_is_not_reused_under_the_reader():
    cuda.current_context()
    reused, corrupted = _race(numba_pool.MemoryResource(cuda.get_current_device().id))
    own_reused, own_corrupted = _race(DeviceMemoryResource(cuda.get_current_device().id))
    print(f"numba_pool.MemoryResource: {reused}/20 reused, {corrupted} corrupted elements; "
          f"cuda.core's DeviceMemoryResource: {own_reused}/20 reused, {own_corrupted} corrupted")
    assert corrupted == 0


def test_a_legacy_buffer_closed_on_its_readers_stream_is_not_reused_under_the_reader():
    # Note [The doors' free lists]: a buffer closed naming its reader's stream is never kept for the
    # legacy stream; one closed on the legacy stream with the read unordered (the planted bug, the program's) is
    # reused at once, as cuda.core's own pool reuses it: the experiment sees a missed wait.
    cuda.current_context()
    device_id = cuda.get_current_device().id
    facts = {name: _race(resource, legacy=True, close_on_b=close_on_b)
             for name, resource, close_on_b in [("closed on B", numba_pool.MemoryResource(device_id), True),
                                                ("planted", numba_pool.MemoryResource(device_id), False),
                                                ("own, planted", DeviceMemoryResource(device_id), False)]}
    print(f"legacy stream, (reused, corrupted) of 20: {facts}")
    assert facts["closed on B"][1] == 0, facts
    assert facts["planted"][0] > 0 and facts["planted"][1] > 0, facts


def test_a_buffer_closed_on_its_own_stream_serves_the_next_one_there_and_nothing_else():
    # Note [The doors' free lists]: on a stream of its own (cuda.core's are non-blocking), a buffer closed there is
    # kept for that stream; one closed naming its reader's stream is not.  Planted (the program's bug): closed on its
    # own stream with the reader unordered, it is reused at once, as cuda.core's own pool reuses it.
    cuda.current_context()
    device_id = cuda.get_current_device().id
    resources = {"closed on B": numba_pool.MemoryResource(device_id),
                 "planted": numba_pool.MemoryResource(device_id)}
    facts = {name: _race(resource, close_on_b=name == "closed on B") for name, resource in resources.items()}
    facts["own, planted"] = _race(DeviceMemoryResource(device_id), close_on_b=False)
    served = {name: resource.native.reuses_on_streams for name, resource in resources.items()}
    print(f"a stream of its own, (reused, corrupted) of 20: {facts}; served by the free list: {served}")
    assert facts["closed on B"][1] == 0, facts
    assert facts["planted"][0] > 0 and facts["planted"][1] > 0 and served["planted"] > 0, (facts, served)
    device = Device(device_id)
    stream = device.create_stream()
    resource = resources["closed on B"]
    before = resource.native.reuses_on_streams
    in_use = numba_pool.stats().bytes_in_use
    for _ in range(200):
        resource.allocate(1 << 20, stream=stream).close(stream)
    stream.sync()
    print(f"200 buffers allocated and closed on a stream: {resource.native.reuses_on_streams - before} reused")
    assert resource.native.reuses_on_streams - before >= 199
    assert numba_pool.stats().bytes_in_use == in_use  # the kept block counts as freed


@pytest.mark.parametrize("planted", [False, True], ids=["synchronized", "planted"])
def test_a_buffer_kept_for_a_stream_closed_since_is_given_back_after_that_streams_work(planted, monkeypatch):
    # Note [A kept block whose stream is gone]: the stream is closed while its reader still runs; the snapshot gives
    # the kept block back (after a synchronize, never naming the closed stream), and a buffer allocated on another
    # stream, filled with poison at once, must not reach the reader.  Planted: the give-back without its synchronize.
    if planted:
        monkeypatch.setattr("numba_pool.plugin.free_lists._synchronize", lambda allocator: True)
    cuda.current_context()
    device = Device(cuda.get_current_device().id)
    device.set_current()
    resource = numba_pool.MemoryResource(device.device_id)
    n, trials, hits = (8 << 20) // 4, 8, cuda.to_device(np.zeros(1, dtype=np.int64))
    other = device.create_stream()
    other_numba = cuda.external_stream(int(other.handle))
    given_back = resource.native.streams_given_back
    for _ in range(trials):
        stream = device.create_stream()
        on_stream = cuda.external_stream(int(stream.handle))
        first = resource.allocate(n * 4, stream=stream)
        fill_kernel[blocks(n), THREADS, on_stream](_as_array(first, n), np.float32(1.0))
        read_after_delay[32, THREADS, on_stream](_as_array(first, n), POISON, 3000, hits)
        first.close(stream)  # kept for the stream
        stream.close()  # legal: its buffers are closed; its read still runs
        numba_pool.snapshot()  # gives every kept block back
        second = resource.allocate(n * 4, stream=other)
        fill_kernel[blocks(n), THREADS, other_numba](_as_array(second, n), POISON)
        second.close(other)
        cuda.synchronize()
    corrupted = int(hits.copy_to_host()[0])
    given = resource.native.streams_given_back - given_back  # (the other stream's kept buffers too)
    print(f"a stream closed with a buffer kept for it{', planted' if planted else ''}: {given} blocks given back, "
          f"{trials} of them of a closed stream; {corrupted} corrupted elements")
    assert given >= trials
    if not planted:
        assert corrupted == 0
