"""CUDA-graph capture on a real GPU, in both modes with the default configuration (rule 13 of
numba_pool.allocator): arrays allocated while a stream is captured become the graph's
allocation nodes, the graph replays right, and a second thread allocating and dropping arrays
throughout a global-mode capture neither breaks the capture nor sees corruption.

Run in both modes: ``pytest -m gpu`` and ``NUMBA_POOL_ARENA=1 pytest -m gpu``.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time

import numpy as np
import pytest

from helpers import GPU, cuda

pytestmark = pytest.mark.gpu

if GPU:
    from cuda.bindings import driver as cu

    import numba_pool

    from gpu_helpers import THREADS, blocks

    GLOBAL = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    AUTO_FREE = int(cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)

    @cuda.jit
    def fill(a, value):
        i = cuda.grid(1)
        if i < a.size:
            a[i] = value

    @cuda.jit
    def add(x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = x[i] + y[i]

    @cuda.jit
    def count_wrong(out, x, add_value, bad):
        i = cuda.grid(1)
        if i < out.size and out[i] != x[i] + add_value:
            cuda.atomic.add(bad, 0, 1)

    @cuda.jit
    def hold_then_count(a, value, rounds, bad):
        """Write ``value``, spin, then count elements that are no longer ``value``: another
        owner's writes, if the block was handed over while this kernel ran."""
        i = cuda.grid(1)
        if i < a.size:
            a[i] = value
            v = i
            for _ in range(rounds):
                v = (v * 3 + 1) % 1000003
            if a[i] != value or v == -1:
                cuda.atomic.add(bad, 0, 1)


def _warm(stream=None):
    """Load every kernel into the context before a capture: a module load inside a global-mode
    capture would invalidate it (numba_pool is not what is tested there)."""
    a = cuda.device_array(THREADS, np.float32)
    bad = cuda.to_device(np.zeros(1, np.int64))
    for s in (0, stream) if stream is not None else (0,):
        fill[1, THREADS, s](a, np.float32(0))
        add[1, THREADS, s](a, a, a)
        count_wrong[1, THREADS, s](a, a, np.float32(0), bad)
        hold_then_count[1, THREADS, s](a, np.float32(0), 1, bad)
    cuda.synchronize()


def _check(result):
    err = result[0]
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return result[1] if len(result) == 2 else result[1:]


def _node_kinds(graph) -> dict:
    _, nodes, count = cu.cuGraphGetNodes(graph, 0)
    _, nodes, count = cu.cuGraphGetNodes(graph, count)
    kinds: dict = {}
    for node in nodes:
        kind = _check(cu.cuGraphNodeGetType(node)).name.replace("CU_GRAPH_NODE_TYPE_", "")
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


@contextlib.contextmanager
def _captured(stream, mode=None):
    """Capture ``stream`` (a Numba stream) in ``mode`` (global by default); yields a dict that
    gets ``end`` (cuStreamEndCapture's result) and ``graph``."""
    _check((cu.cuStreamBeginCapture(stream.handle, GLOBAL if mode is None else mode)[0], None))
    out: dict = {}
    try:
        yield out
    finally:
        err, graph = cu.cuStreamEndCapture(stream.handle)
        out["end"] = err.name
        out["graph"] = graph if err == cu.CUresult.CUDA_SUCCESS else None


@pytest.mark.parametrize("nbytes", [4 << 10, 256 << 10, 64 << 20], ids=["4KiB", "256KiB", "64MiB"])
@pytest.mark.parametrize("dropped", ["inside", "after"])
def test_a_captured_pipeline_replays_right_100_times(nbytes, dropped):
    n = nbytes // 4
    grid = blocks(n)
    stream = cuda.stream()
    _warm(stream)
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    out = cuda.device_array(n, np.float32)
    bad = cuda.to_device(np.zeros(1, np.int64))
    fill[grid, THREADS](out, np.float32(0))
    cuda.synchronize()
    before = numba_pool.stats()
    with _captured(stream) as capture:
        with numba_pool.using_stream(stream):
            tmp = cuda.device_array(n, np.float32, stream=stream)
            captured_id = tmp.gpu_data.captured
            fill[grid, THREADS, stream](tmp, np.float32(2))
            add[grid, THREADS, stream](x, tmp, out)
            if dropped == "inside":
                del tmp
                gc.collect()
    assert capture["end"] == "CUDA_SUCCESS", capture
    graph = capture["graph"]
    kinds = _node_kinds(graph)
    print(f"{nbytes} bytes, dropped {dropped}: graph nodes {kinds}")
    assert captured_id != 0  # the temporary was an allocation node, not an arena or scratch block
    assert kinds.get("MEM_ALLOC") == 1 and kinds.get("KERNEL") == 2
    assert kinds.get("MEM_FREE", 0) == (1 if dropped == "inside" else 0)
    during = numba_pool.stats()
    executable = _check(cu.cuGraphInstantiate(graph, AUTO_FREE if dropped == "after" else 0))
    for _ in range(100):
        fill[grid, THREADS, stream](out, np.float32(-1))
        _check((cu.cuGraphLaunch(executable, stream.handle)[0], None))
        count_wrong[grid, THREADS, stream](out, x, np.float32(2), bad)
    stream.synchronize()
    wrong = int(bad.copy_to_host()[0])
    graph_memory = numba_pool.stats().graph_reserved_bytes
    if dropped == "after":  # the graph's output stays valid after a launch
        assert bool((tmp.copy_to_host() == 2).all())
        assert during.graph_arrays == before.graph_arrays + 1
        del tmp
        gc.collect()
    cuda.synchronize()
    _check((cu.cuGraphExecDestroy(executable)[0], None))
    _check((cu.cuGraphDestroy(graph)[0], None))
    after = numba_pool.stats()
    print(f"wrong elements over 100 replays: {wrong}; graph memory reserved {graph_memory} bytes; "
          f"arrays in graph memory after: {after.graph_arrays}")
    assert wrong == 0
    assert graph_memory >= nbytes
    assert after.graph_arrays == before.graph_arrays
    numba_pool.trim()  # cuDeviceGraphMemTrim too
    assert numba_pool.stats().graph_reserved_bytes <= graph_memory


def test_a_second_thread_allocates_and_drops_throughout_a_global_capture():
    n_small, n_large = 1024, 64 << 10
    stream, own = cuda.stream(), cuda.stream()  # created before the capture: creation is not allowed in one
    _warm(stream)
    _warm(own)
    x = cuda.to_device(np.arange(n_large, dtype=np.float32))
    out = cuda.device_array(n_large, np.float32)
    cuda.synchronize()
    bad = cuda.to_device(np.zeros(1, np.int64))
    started, stop = threading.Event(), threading.Event()
    report: dict = {"iterations": 0, "beside": 0, "errors": []}

    def worker():
        try:
            cuda.device_array(1)  # this thread's context, before the capture
            ready.set()
            started.wait(30)
            i = 0
            while not stop.is_set():
                n = n_small if i % 2 else n_large
                if i % 3 == 0:  # outside using_stream: numba_pool allocates it beside the capture
                    a = cuda.device_array(n, np.float32)
                    report["beside"] += 1
                else:
                    with numba_pool.using_stream(own):
                        a = cuda.device_array(n, np.float32)
                hold_then_count[blocks(n), THREADS, own](a, np.float32(i), 2000, bad)
                del a
                i += 1
                report["iterations"] = i
        except Exception as err:  # noqa: BLE001 - reported to the test
            report["errors"].append(repr(err))

    ready = threading.Event()
    thread = threading.Thread(target=worker)
    thread.start()
    ready.wait(30)
    with _captured(stream) as capture:
        with numba_pool.using_stream(stream):
            first = cuda.device_array(n_large, np.float32, stream=stream)  # the capture is now known
            started.set()
            rounds = 0
            for rounds in range(1, 51):  # about 0.5 s, while the second thread works
                tmp = cuda.device_array(n_large, np.float32, stream=stream)
                fill[blocks(n_large), THREADS, stream](tmp, np.float32(2))
                add[blocks(n_large), THREADS, stream](x, tmp, out)
                del tmp
                time.sleep(0.01)
            del first
        stop.set()
        thread.join()
    print(f"capture ended: {capture['end']}; captured rounds {rounds}; second thread: {report}")
    assert not report["errors"], report["errors"]
    assert capture["end"] == "CUDA_SUCCESS"
    assert report["iterations"] > 3 and report["beside"] > 0
    executable = _check(cu.cuGraphInstantiate(capture["graph"], 0))
    _check((cu.cuGraphLaunch(executable, stream.handle)[0], None))
    stream.synchronize()
    cuda.synchronize()
    assert bool((out.copy_to_host() == np.arange(n_large, dtype=np.float32) + 2).all())
    assert int(bad.copy_to_host()[0]) == 0
    cuda.device_array(1)  # an allocation after the capture runs the releases held back
    assert numba_pool.stats().releases_held_for_capture == 0
    cu.cuGraphExecDestroy(executable)
    cu.cuGraphDestroy(capture["graph"])


def _drop_during_a_global_capture(stream, n: int, arrays: list) -> tuple[int, dict]:
    """Capture ``stream`` (a Numba stream) in global mode, numba_pool knowing of it (an array of ``n`` float32
    allocated in it first), and drop ``arrays`` (emptied: the caller keeps no other reference) inside; returns the
    releases held back right after the drop (``stats().releases_held_for_capture``) and :func:`_captured`'s dict."""
    with _captured(stream) as capture:
        with numba_pool.using_stream(stream):
            first = cuda.device_array(n, np.float32, stream=stream)  # the capture is now known
            arrays.clear()
            gc.collect()
            held = numba_pool.stats().releases_held_for_capture
            del first
    return held, capture


def _fill_later_arrays(n: int) -> None:
    """Eight new arrays of ``n`` float32 written with -1 on the legacy stream, then the device synchronized: a
    foreign write for a kernel still reading a block one of them got too early (the pool reuses a block only after
    its free)."""
    later = [cuda.device_array(n, np.float32) for _ in range(8)]
    for b in later:
        fill[blocks(n), THREADS](b, np.float32(-1))
    cuda.synchronize()


@pytest.mark.parametrize("n", [64 << 10, 1 << 10], ids=["pool block", "small block"])  # small: an arena block
@pytest.mark.parametrize("flags", ["CU_STREAM_NON_BLOCKING", "CU_STREAM_DEFAULT"], ids=["non-blocking", "blocking"])
def test_a_streams_array_dropped_during_a_global_capture_is_released_at_once(flags, n):
    """Note [Released beside a capture] in numba_pool/allocator/release.py: an array of a stream S (non-blocking, or
    blocking), still read by a kernel on S, dropped while another (blocking) stream is captured in global mode, is
    released at the drop (kept idle for S, or freed on it, or with the arena on and ``n`` float32 within its largest
    block, its domain's event recorded on S, in relaxed mode), not held back past the capture; S is
    then destroyed (legal: its arrays are dropped) before numba_pool learns the capture ended, the capture ends
    valid, and trim frees what S kept idle.  (A block kept idle for S goes back to the pool only at the trim, after a
    synchronize: the kernel's count of foreign writes is a check of the later allocations, not of the release's
    order.)"""
    stream = cuda.stream()
    _warm(stream)
    err, handle = cu.cuStreamCreate(getattr(cu.CUstream_flags, flags))
    assert not err, err
    s = cuda.external_stream(int(handle))
    _warm(s)
    bad = cuda.to_device(np.zeros(1, np.int64))
    with numba_pool.using_stream(s):
        arrays = [cuda.device_array(n, np.float32, stream=s)]
    hold_then_count[blocks(n), THREADS, s](arrays[0], np.float32(7), 200_000, bad)  # still reading when dropped
    held, capture = _drop_during_a_global_capture(stream, n, arrays)
    _check((cu.cuStreamDestroy(handle)[0], None))  # the kernel on it runs on; the driver frees the stream after
    _fill_later_arrays(n)
    assert (held, capture["end"]) == (0, "CUDA_SUCCESS")
    assert int(bad.copy_to_host()[0]) == 0
    assert numba_pool.stats().releases_held_for_capture == 0
    numba_pool.trim()
    assert numba_pool.stats().pool_released_bytes == 0
    cu.cuGraphDestroy(capture["graph"])


@pytest.mark.parametrize("n", [64 << 10, 1 << 10], ids=["pool block", "small block"])  # small: an arena block
def test_an_array_recorded_for_a_reader_dropped_during_a_global_capture_is_released_at_once(n):
    """Note [Released beside a capture]: an array of a non-blocking stream S, still read by a kernel on another
    non-blocking stream R (``numba_pool.record_stream``), dropped while a blocking stream is captured in global mode,
    is released at the drop (events on R and S recorded in relaxed mode; the block free after the next fence once
    the host sees them done), not held back past the capture; R and S are then destroyed before numba_pool learns
    the capture ended (held back, the release's event on R crashed the driver then), and the capture ends valid.
    (The later arrays reach no fence: the reader's count of foreign writes checks them, not the release's order,
    which the model checks: test_capture_model.py.)"""
    stream = cuda.stream()
    _warm(stream)
    handles = []
    for _ in range(2):
        err, handle = cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
        assert not err, err
        handles.append(handle)
    s, r = (cuda.external_stream(int(handle)) for handle in handles)
    _warm(s)
    _warm(r)
    bad = cuda.to_device(np.zeros(1, np.int64))
    with numba_pool.using_stream(s):
        arrays = [cuda.device_array(n, np.float32, stream=s)]
    s.synchronize()  # R may use it now
    hold_then_count[blocks(n), THREADS, r](arrays[0], np.float32(7), 200_000, bad)  # still reading when dropped
    numba_pool.record_stream(arrays[0], r)
    held, capture = _drop_during_a_global_capture(stream, n, arrays)
    for handle in handles:  # the kernel on R runs on; the driver frees the streams after
        _check((cu.cuStreamDestroy(handle)[0], None))
    _fill_later_arrays(n)
    assert (held, capture["end"]) == (0, "CUDA_SUCCESS")
    assert int(bad.copy_to_host()[0]) == 0
    assert numba_pool.stats().releases_held_for_capture == 0
    cu.cuGraphDestroy(capture["graph"])


def test_the_statistics_calls_inside_a_global_capture_leave_it_valid():
    """``stats()``, ``reset_peak()``, ``memory_summary()`` and Numba's ``get_memory_info()`` from the capturing thread,
    during a global-mode capture numba_pool knows of (an array allocated in it): the pool's attributes are read and
    its high watermarks reset in relaxed capture mode (the driver refused ``cuMemPoolGetAttribute`` there), and the
    completed fences are looked at in relaxed mode too; the capture ends valid and the peaks were reset."""
    stream = cuda.stream()
    _warm(stream)
    big = cuda.device_array(256 << 20, np.uint8)  # the pool's used high watermark above 256 MiB
    del big
    numba_pool.trim()
    assert numba_pool.stats().pool_used_high >= 256 << 20
    with _captured(stream) as capture:
        with numba_pool.using_stream(stream):
            kept = cuda.device_array(1 << 20, np.float32, stream=stream)  # the capture is now known
            numba_pool.reset_peak()
            during = numba_pool.stats()
            numba_pool.memory_summary()
            cuda.current_context().get_memory_info()
            del kept
    assert capture["end"] == "CUDA_SUCCESS"
    assert during.peak_bytes_in_use == during.bytes_in_use and during.pool_used_high < 256 << 20
    cuda.synchronize()
    cu.cuGraphDestroy(capture["graph"])


def test_using_stream_takes_a_graph_builder():
    core = pytest.importorskip("cuda.core")
    n = 4096
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    out = cuda.device_array(n, np.float32)
    _warm()
    device = core.Device()
    builder = device.create_graph_builder()
    builder.begin_building("global")
    try:
        with numba_pool.using_stream(builder):
            tmp = cuda.device_array(n, np.float32)
            captured = tmp.gpu_data.captured
            try:
                fill[blocks(n), THREADS, builder](tmp, np.float32(3))
                add[blocks(n), THREADS, builder](x, tmp, out)
            except Exception as err:  # noqa: BLE001 - a frontend that cannot launch into a builder
                launch_error = err
            else:
                launch_error = None
            del tmp
            gc.collect()
    finally:
        builder.end_building()
    if launch_error is not None:
        pytest.skip(f"this frontend does not launch kernels into a GraphBuilder: {launch_error}")
    graph = builder.complete()
    stream = device.create_stream()
    for _ in range(3):
        graph.launch(stream)
    stream.sync()
    assert captured != 0
    assert bool((out.copy_to_host() == np.arange(n, dtype=np.float32) + 3).all())
