"""A blocking stream destroyed between a default-stream array's drop and numba_pool's next fence (found by the
fuzzer in CI on 2026-11-27, with the model then assuming no ordering of the legacy stream after destroyed streams).

A block allocated on the legacy stream and used on a blocking stream (legal: Numba's streams are blocking) is
released with no driver call; a later allocation records one legacy-stream fence for the batch (Note [A release
records nothing on the legacy stream], issue 33), which orders every blocking stream's earlier work, also a
stream destroyed meanwhile: the driver keeps a destroyed blocking stream's remaining work before later
legacy-stream work (measured: docs/perf-notes.md, "A destroyed stream and the legacy stream"; GPU test
``test_gpu_ordering.py::test_a_blocking_stream_destroyed_before_the_fence_still_orders_the_reuse``).  The
CUDA model assumes so by default; under the documented minimum (``legacy_waits_for_destroyed=False``) the same
program is a violation, which is what numba_pool relies on the driver for."""

from __future__ import annotations

import gc

import pytest
from cuda.bindings import driver as real_cu

from cuda_model.harness import LEGACY, Program


def _destroy_before_the_fence(p: Program, kind: str) -> list:
    """The program: the violations the model saw."""
    s = p.create_stream(blocking=True)
    allocate = p.allocate_managed if kind == "managed" else p.allocate
    f = allocate(512)
    address = f.address
    p.launch(s, [f])
    p.drop(f, legalize="record")
    gc.collect()
    assert p.destroy_stream(s)
    (p.mm.managed if kind == "managed" else p.mm.allocator.mempool_blocks).fences.fence_blocks = 1
    allocate(1024)  # records the released block's fence, after the destroy
    assert p.model.cuStreamSynchronize(real_cu.CUstream(LEGACY))[0] == 0
    g = allocate(512)
    assert g.address == address  # reused
    if kind == "device":
        p.launch(p.create_stream(blocking=False), [g])
    return [str(v) for v in p.model.violations]


@pytest.mark.parametrize("driver_orders_it", [True, False])
@pytest.mark.parametrize("kind", ["device", "managed"])
def test_a_stream_destroyed_before_the_fence_is_waited_for_by_the_fence(kind, driver_orders_it):
    p = Program(arena=False, legacy_waits_for_destroyed=driver_orders_it)
    try:
        violations = _destroy_before_the_fence(p, kind)
        assert bool(violations) is not driver_orders_it, violations
    finally:
        p.model.violations.clear()
        p.close()
