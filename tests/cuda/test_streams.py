"""Allocation-stream bookkeeping that needs no GPU: normalization, nesting, thread locality."""

from __future__ import annotations

import threading

import pytest
from cuda.bindings import driver as cu

from numba_pool.cuda.streams import LEGACY, StreamRef, as_stream_ref, current_stream, using_stream


class ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0x1234)


def test_default_allocation_stream_is_the_legacy_default_stream():
    assert current_stream() is LEGACY and int(LEGACY) == cu.CU_STREAM_LEGACY


@pytest.mark.parametrize("stream, handle", [(5, 5), (cu.CUstream(7), 7), (ProtocolStream(), 0x1234)])
def test_stream_forms_normalize_and_keep_their_owner(stream, handle):
    ref = as_stream_ref(stream)
    assert int(ref) == handle
    if not isinstance(stream, int):
        assert ref.owner is stream


def test_not_a_stream_is_a_type_error_naming_the_type():
    with pytest.raises(TypeError, match="str is not a CUDA stream"):
        as_stream_ref("stream 3")


def test_scopes_nest_and_restore_even_on_error():
    with using_stream(11) as outer:
        assert current_stream() is outer
        with pytest.raises(KeyError):
            with using_stream(12):
                assert int(current_stream()) == 12
                raise KeyError
        assert current_stream() is outer
    assert current_stream() is LEGACY


def test_scope_is_per_thread():
    seen = []
    entered, release = threading.Event(), threading.Event()

    def other():
        entered.wait()
        seen.append(current_stream())
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with using_stream(StreamRef(cu.CUstream(99))):
        entered.set()
        release.wait()
    t.join()
    assert seen == [LEGACY]
