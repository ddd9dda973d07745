"""Rule 13's bookkeeping (numba_pool.allocator.captures), host-side: which captures are known,
when they end, and the releases held back meanwhile run once, in order, when the last one ends.
The stream-ordering side (what the allocator does during a capture) is the model's and the
fuzzer's (tests/cuda_model, tests/allocator/test_fuzz.py), and the GPU's (tests/gpu/test_gpu_graphs.py)."""

from __future__ import annotations

import threading
import warnings

import pytest
from cuda.bindings import driver as cu

from numba_pool.allocator import captures
from numba_pool.cuda.streams import StreamRef

SUCCESS = cu.CUresult.CUDA_SUCCESS
ACTIVE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
NONE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class CaptureIds:
    """``cuStreamGetCaptureInfo`` of streams whose capture ids the test sets (0: none)."""

    def __init__(self):
        self.ids: dict[int, int] = {}

    def cuStreamGetCaptureInfo(self, handle):
        cid = self.ids.get(int(handle), 0)
        return SUCCESS, ACTIVE if cid else NONE, cu.cuuint64_t(cid)


@pytest.fixture(autouse=True)
def empty_registry():
    captures.underway.clear()
    captures._deferred.take()
    yield
    captures.underway.clear()
    captures._deferred.take()


def test_releases_held_back_run_in_order_once_the_last_capture_ends():
    driver = CaptureIds()
    a, b = StreamRef(cu.CUstream(0x100)), StreamRef(cu.CUstream(0x200))
    driver.ids = {0x100: 7, 0x200: 8}
    captures.note(a, 7)
    captures.note(b, 8)
    captures.note(a, 7)  # known once
    ran = []
    for i in range(3):
        captures.defer(lambda i=i: ran.append(i))
    assert captures.refresh(driver) is True and ran == [] and captures.held_back() == 3
    del driver.ids[0x100]  # the first capture ended: the other still holds them back
    assert captures.refresh(driver) is True and ran == [] and [c.id for c in captures.underway] == [8]
    driver.ids[0x200] = 9  # a new capture on the same stream is another capture: 8 ended
    assert captures.refresh(driver) is False
    assert ran == [0, 1, 2] and captures.held_back() == 0 and captures.underway == []


def test_a_release_that_raises_is_reported_and_the_others_still_run():
    ran = []

    def broken():
        raise RuntimeError("planted")

    captures.defer(broken)
    captures.defer(lambda: ran.append("after"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert captures.refresh(CaptureIds()) is False
    assert ran == ["after"]
    assert any("planted" in str(w.message) for w in caught)


def test_a_release_held_back_by_a_capture_that_starts_again_waits_again():
    driver = CaptureIds()
    s = StreamRef(cu.CUstream(0x300))
    ran = []

    def release():  # as a real release does: defer itself while a capture is under way
        if captures.underway:
            captures.defer(release)
        else:
            ran.append(True)

    driver.ids = {0x300: 1}
    captures.note(s, 1)
    release()
    driver.ids = {}
    assert captures.refresh(driver) is False and ran == [True]


def test_the_capture_of_this_thread_is_the_one_it_noted():
    s, t = StreamRef(cu.CUstream(0x400)), StreamRef(cu.CUstream(0x500))
    captures.note(s, 3)
    other = threading.Thread(target=captures.note, args=(t, 4))
    other.start()
    other.join()
    assert captures.capture_of_thread().id == 3
    seen = []
    thread = threading.Thread(target=lambda: seen.append(captures.capture_of_thread()))
    thread.start()
    thread.join()
    assert seen[0] is None or seen[0].id == 4  # (a new thread may reuse the ident of the one that noted 4)
