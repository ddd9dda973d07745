"""The seam between numba_pool and CUDA: everything below the allocator.

* :mod:`.frontend`: the one place numba_pool imports Numba's CUDA classes (the EMM plugin base
  classes, ``MemoryPointer``, ``CudaAPIError`` ...), or the CUDA simulator's stand-ins;
* :mod:`.simulator`: numba_pool under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``);
* :mod:`.driver`: the driver object every driver call goes through (the tests put a model of
  CUDA in its place), result checking and the never-raising reports of the release path;
* :mod:`.context`: the CUDA context a release must run in (rule 10 of :mod:`numba_pool.allocator`);
* :mod:`.mempool`: one device's stream-ordered memory pool (``cuMemPoolCreate`` ...);
* :mod:`.streams`: stream handles and each thread's allocation stream (``using_stream``);
* :mod:`.pointers`: the ``MemoryPointer`` and ``PinnedMemory`` numba_pool hands to Numba.

Nothing here decides when memory may be reused: that is :mod:`numba_pool.allocator`'s.
"""
