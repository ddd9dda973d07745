"""PoolPointer: a frontend's MemoryPointer released from __del__, exactly once, never at exit.

Each frontend's MemoryPointer and PinnedMemory need no GPU to exist, so CI tests numba_pool's
classes on both frontends for real (``frontend_name``: once per frontend)."""

from __future__ import annotations

import gc

import pytest
from cuda.bindings import driver as cu
from helpers import run_python
from numba_pool.cuda import frontend as frontends
from numba_pool.cuda import pointers


class Releases:
    """A stand-in for a Block: the pointer calls ``block.release(block)``."""

    def __init__(self):
        self.count = 0

    def release(self, block):
        assert block is self
        self.count += 1

    def __call__(self):  # a pinned memory's release
        self.count += 1


@pytest.fixture
def frontend(frontend_name):
    return frontends.load(frontend_name)


@pytest.fixture
def PoolPointer(frontend):
    return frontend.PoolPointer


def test_each_frontend_gets_its_own_pointer_classes(frontend):
    assert issubclass(frontend.PoolPointer, frontend.MemoryPointer)
    assert issubclass(frontend.PoolPointer, pointers.PoolPointer)
    assert issubclass(frontend.PooledPinnedMemory, frontend.PinnedMemory)
    assert frontend.PoolPointer.frontend is frontend
    assert frontends.name_of(frontend.PoolPointer(None, cu.CUdeviceptr(256), 8, Releases())) == frontend.name


def test_has_every_attribute_numba_memory_pointer_sets(frontend, PoolPointer):
    # PoolPointer sets MemoryPointer's attributes itself (for speed): a new attribute in a
    # frontend's release must show up here, not as an AttributeError in a user's program.
    MemoryPointer = frontend.MemoryPointer
    numba_attributes = set(vars(MemoryPointer(None, cu.CUdeviceptr(256), 8, finalizer=lambda: None)))
    ours = set(vars(PoolPointer(None, cu.CUdeviceptr(256), 8, Releases())))
    assert numba_attributes - {"_finalizer"} <= ours
    assert ours - numba_attributes == {"_block"}


def test_behaves_as_an_owning_memory_pointer(PoolPointer):
    pointer = PoolPointer("context", cu.CUdeviceptr(0x1000), 300, Releases())
    assert pointer.device_pointer_value == 0x1000 and int(pointer.handle) == 0x1000
    assert pointer.size == pointer._cuda_memsize_ == 300
    assert pointer.is_managed and pointer.refct == 1 and pointer.owner is pointer
    view = pointer.view(256)
    assert view.device_pointer_value == 0x1100 and view.size == 44


def test_released_once_when_collected(PoolPointer):
    releases = Releases()
    pointer = PoolPointer(None, cu.CUdeviceptr(256), 8, releases)
    assert releases.count == 0
    del pointer
    assert releases.count == 1


def test_released_once_when_collected_from_a_reference_cycle(PoolPointer):
    releases = Releases()
    pointer = PoolPointer(None, cu.CUdeviceptr(256), 8, releases)
    pointer.cycle = pointer
    del pointer
    gc.collect()
    assert releases.count == 1


def test_free_releases_now_and_only_once(PoolPointer):
    releases = Releases()
    pointer = PoolPointer(None, cu.CUdeviceptr(256), 8, releases)
    pointer.free()
    assert releases.count == 1
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        pointer.free()
    del pointer
    assert releases.count == 1


def test_wrap_release_runs_the_adaptors_part_first_then_the_release_once(PoolPointer):
    releases = Releases()
    order = []
    pointer = PoolPointer(None, cu.CUdeviceptr(0x1000), 8, releases)

    def adaptor(tag, release):
        order.append((tag, releases.count))  # the adaptor's part runs before the release below
        release()

    pointer.wrap_release(adaptor, "inner")
    pointer.wrap_release(adaptor, "outer")
    pointer.free()
    del pointer
    gc.collect()
    assert order == [("outer", 0), ("inner", 0)]
    assert releases.count == 1
    dead = PoolPointer(None, cu.CUdeviceptr(0x1000), 8, Releases())
    dead.free()
    with pytest.raises(RuntimeError, match="Freeing dead memory"):
        dead.wrap_release(adaptor, "late")


def test_nothing_is_released_or_reported_while_the_interpreter_exits(frontend_name):
    # A pointer alive at exit is collected during the interpreter's teardown, when module
    # globals may be gone; its release must not run (the context takes the memory).
    code = f"""
import sys
from cuda.bindings import driver as cu
from numba_pool.allocator.block import make_block
from numba_pool.cuda import frontend
PoolPointer = frontend.load({frontend_name!r}).PoolPointer

def release(block):
    sys.stdout.write("released\\n")

freed = PoolPointer(None, cu.CUdeviceptr(256), 8, make_block(0x100, 8, None, release))
del freed
alive_at_exit = PoolPointer(None, cu.CUdeviceptr(512), 8, make_block(0x200, 8, None, release))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "released\n"
    assert proc.stderr == ""


# -- PooledPinnedMemory: the host cache's PinnedMemory ---------------------------------------

@pytest.fixture
def pinned(frontend):
    def make(releases, size=64):
        import ctypes

        buffer = ctypes.create_string_buffer(size)
        return buffer, frontend.PooledPinnedMemory("context", ctypes.addressof(buffer), size, releases)
    return make


def test_pinned_has_every_attribute_numba_pinned_memory_sets(frontend, pinned):
    numba_attributes = set(vars(frontend.PinnedMemory(None, 0x1000, 8, finalizer=lambda: None)))
    _, ours = pinned(Releases())
    assert numba_attributes <= set(vars(ours))
    assert set(vars(ours)) - numba_attributes == {"_release"}


def test_pinned_memory_backs_a_numpy_array_and_is_released_when_the_array_goes(pinned):
    import numpy as np

    releases = Releases()
    buffer, memory = pinned(releases)
    array = np.ndarray(shape=(16,), dtype=np.float32, buffer=memory)
    array[:] = 3.0
    assert np.frombuffer(buffer.raw, dtype=np.float32).tolist() == [3.0] * 16
    del memory
    assert releases.count == 0  # the array holds it
    del array
    assert releases.count == 1


def test_pinned_copies_are_the_object_itself_so_the_block_goes_back_once(pinned):
    import copy

    releases = Releases()
    _, memory = pinned(releases)
    assert copy.copy(memory) is memory and copy.deepcopy(memory) is memory
    del memory
    gc.collect()
    assert releases.count == 1


def test_pinned_released_once_from_a_reference_cycle(pinned):
    releases = Releases()
    _, memory = pinned(releases)
    memory.cycle = memory
    del memory
    gc.collect()
    assert releases.count == 1
