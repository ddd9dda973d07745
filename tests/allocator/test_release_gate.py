"""Regressions of the release gate (numba_pool/allocator/release.py), found by a review of its
first version on the CUDA model; each test failed there (0f3699b) and passes now.

* Two takers of a :class:`Pending` list at once (a finalizer's ``free_after_reset`` beside
  another's, after a reset began) took one block twice: a double free.
* A mempool block of another stream released inside ``defer_cleanup`` or under a hold kept its
  stream's object alive (the held release held the Block, the Block its ``StreamRef``).
* A graph array dropped inside ``defer_cleanup`` was held to the exit and freed on its capture
  stream, which the program may destroy first (graph memory is freed at its drop).
* A graph array dropped in a thread with no CUDA context was never freed (the gate's rule 10
  did not apply to graph blocks): this one also failed before the gate (491afb7).
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from cuda.bindings import driver as cu

from cuda_model.harness import Program
from numba_pool.allocator.release import Pending
from pausing import Paused
from test_capture_model import _capture_one_array

R = cu.CUresult


pytestmark = pytest.mark.usefixtures("no_capture_left")


@pytest.mark.parametrize("pause_at", [1, 2, 3, 4, 5])
def test_two_takers_of_a_pending_list_never_take_one_block_twice(programs, pause_at):
    # A reset began (``dropped``, take_all's first step, before its ledger pops); two arrays of
    # that generation are released in two threads.  Thread A pauses before the pause_at-th line
    # of Pending.take; thread B's release appends and takes; then A goes on.
    p = programs(arena=False)
    a, b = p.mm.memalloc(1000), p.mm.memalloc(1000)  # legacy-stream mempool blocks
    p.mm.allocator.mempool_blocks.dropped = True
    a_taking = Paused(Pending.take.__code__, pause_at, a.free)
    other = threading.Thread(target=b.free)  # may wait for A's take to finish: then it must
    other.start()
    other.join(0.5)
    a_taking.resume()
    other.join(10)
    p.model.assert_no_violations()


@pytest.mark.parametrize("how", ["defer_cleanup", "hold"])
def test_a_released_block_keeps_no_stream_alive(how):
    p = Program(arena=False)
    try:
        s = p.create_stream(blocking=False)
        ref = weakref.ref(p.stream_objects[s])
        f = p.allocate(1 << 16, stream=s)
        if how == "defer_cleanup":
            p.open_defer()
            p.drop(f, legalize="sync")
            p.close_defer()
        else:
            assert p.hold(f)
            p.drop(f, legalize="sync")
            p.let_go(0)
        p.model.cuCtxSynchronize()
        del p.stream_objects[s]  # the program forgets its stream (it may be destroyed now: README)
        gc.collect()
        assert ref() is None, f"kept alive by {[type(r).__name__ for r in gc.get_referrers(ref())]}"
    finally:
        p.close()


def _launched_graph_array(p):
    # An array allocated in a capture of a blocking stream, its graph launched once, the capture
    # known to have ended: (array, stream).
    stream = p.create_stream(True)
    pointer, exe = _capture_one_array(p, stream, False)
    assert p.model.cuGraphLaunch(exe, cu.CUstream(stream))[0] == R.CUDA_SUCCESS
    p.mm.statistics()  # numba_pool learns that the capture ended
    assert p.model.graph_memory_live() == 1024
    return pointer, stream


def test_a_graph_array_dropped_in_defer_cleanup_is_freed_before_its_stream_goes(programs):
    p = programs(arena=False)
    pointer, stream = _launched_graph_array(p)
    p.open_defer()
    del pointer
    gc.collect()
    p.model.cuCtxSynchronize()
    assert p.destroy_stream(stream)  # no array needs it any more
    p.close_defer()
    assert p.model.graph_memory_live() == 0, "the graph allocation was never freed"
    p.check()


def test_a_graph_array_dropped_in_a_thread_without_a_context_is_freed(programs):
    p = programs(arena=False)
    pointer, _ = _launched_graph_array(p)
    holder = [pointer]
    del pointer
    p.bare.submit(holder.clear).result()
    gc.collect()
    assert p.model.graph_memory_live() == 0
    p.check()
