"""numba_pool's seam to CUDA, below the allocator: the frontends (:mod:`.frontend`, :mod:`.simulator`), the driver
object (:mod:`.driver`, :mod:`.errors`), the release's context (:mod:`.context`), the mempool, streams, pointers and
captures (docs/architecture.md, "The layers").  Reuse is decided in :mod:`numba_pool.allocator`, not here."""
