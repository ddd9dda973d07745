"""Rule 13's captured allocations (:mod:`.captures`), allocation nodes of a capture's graph.  Release (:mod:`.release`):
in the capture, a free node; after it, ``cuMemFreeAsync`` on the capture stream (after the graph's launches), or nothing
if the graph holds none (not launched, or ``CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH``)."""

from __future__ import annotations

from functools import partial
from typing import Callable

from ..cuda import driver as _driver
from ..cuda.driver import report_failure
from ..cuda.errors import api_error
from ..cuda.streams import StreamRef
from .block import Block, make_block
from .captures import Capture
from .release import gate
from .waits import Deferral

_INVALID_VALUE = _driver.cuda_driver.CUresult.CUDA_ERROR_INVALID_VALUE


class GraphBlocks:
    """Rule 13's captured allocations from ``pool()``; ``live``: pointer -> unreleased :class:`Block` (``ledger``)."""

    def __init__(self, cu, pool: Callable[[], object], waits):
        self._cu = cu
        self._pool = pool
        self.live: dict = {}  # atomic operations only
        self.left_to_graphs = 0  # releases after a capture that found no allocation to free
        self._waits = waits
        # Freed at its drop, never held by defer_cleanup (its capture stream may be destroyed before the exit): a
        # deferral of its own, never entered; no waits registered (record_stream finds only the sources' blocks).
        self._release = gate(self, cu, deferral=Deferral(), owner=waits.owner,
                             ordered=self._ordered, free=self._free_outside, ledger=True, graph=True)

    def allocate(self, size: int, capture: Capture) -> Block:
        """``size`` bytes as an allocation node of ``capture``'s graph.
        :raises CudaAPIError: the driver's error (out of memory too: no trim in a capture)."""
        cu, stream = self._cu, capture.stream
        err, ptr = cu.cuMemAllocFromPoolAsync(size, self._pool(), stream.handle)
        if err:
            raise api_error(err, f"numba_pool: cuMemAllocFromPoolAsync({size} bytes) in the capture of stream "
                                 f"{stream.value:#x} failed with {err.name}")
        live = self.live
        block = make_block(ptr, size, stream, self._release)
        block.capture, block.ledger = capture.id, live
        live[ptr] = block
        return block

    def _ordered(self, block: Block) -> None:  # the gate's: freed on the capture stream, whichever is named
        self._waits.release(block, block.stream, partial(self._publish, block))

    def _publish(self, block: Block, on: StreamRef | None) -> None:
        err = self._free_outside(block)
        if err:
            report_failure((err,), f"cuMemFreeAsync({block.address:#x}) of graph memory")

    def _free_outside(self, block: Block):
        # After the capture, on the capture stream after the graph's launches; the driver's error, for rule 10's retry.
        err, = self._cu.cuMemFreeAsync(block.ptr, block.stream.handle)
        if err == _INVALID_VALUE:  # not allocated now: the graph never ran, or freed it at a relaunch
            self.left_to_graphs += 1
            return None
        return err or None
