"""The seam between numba_pool and CUDA, everything below the allocator: the frontends (:mod:`.frontend`,
:mod:`.simulator`), the driver object (:mod:`.driver`, :mod:`.errors`), the release's context
(:mod:`.context`), the mempool, streams, pointers and captures (docs/architecture.md, "The layers").  Nothing
here decides when memory may be reused: that is :mod:`numba_pool.allocator`'s."""
