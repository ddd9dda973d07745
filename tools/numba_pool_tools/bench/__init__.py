"""``numba-pool-tools bench``: how fast Numba's allocations are under each memory manager.

Its parts (``--part``).  The **allocator** part times ``memalloc`` + release of every allocator in one
process, taking turns in short blocks.  The **end-to-end** part times ``cuda.device_array`` (and
pinned host memory, a batch pipeline, managed memory and a managed pipeline) under each manager
in a process of its own, since Numba binds the manager when it creates a context; the processes
of a round take lock-step turns on one CPU core.  The **overlap** part times streams that each
allocate and drop a temporary per kernel, whether they still run at once, the same way (a
process per manager, in turns).  Every table is self-checked (the managed rows against issue
21's targets, the overlap against issue 33's, too).

The modules, lowest first (each imports only modules above it in this list):

=====================  ================================================================================
``labels``             the rows' labels (default, numba_pool, the floors, the anchors) and size names
``turns``              lock-step turns between a round's workers: the worker's side and the parent's
``core``               what the bench takes from numba_pool's allocator core and from the frontend
                       (``numba.cuda`` or ``numba_cuda_mlir.cuda``, ``NUMBA_POOL_FRONTEND``), in one place
``kernels``            the kernels the workers launch (fill, increment, sqrt), for the bench's frontend
``timing``             how a bench process times: one core, collector off, turns, calibrated counts
``checks``             the self-checks: floor inversions, rounds and runs that disagree, targets missed
``noop``               the no-op floors, EMM plugins (``NUMBA_CUDA_MEMORY_MANAGER=numba_pool_tools.bench.noop``)
``anchors``            the other plugins measured beside numba_pool: RMM's, and one on CuPy's pool
                       (``NUMBA_CUDA_MEMORY_MANAGER=numba_pool_tools.bench.anchors``)
``launch``             running a bench module in a fresh process and reading its JSON line (parent)
``host_worker``        worker: the host rows (pinned, mapped and managed allocate+free, the two pipelines)
``worker``             worker: the ``cuda.device_array`` rows; ``__main__`` is the worker's entry
                       (``python -m numba_pool_tools.bench``)
``overlap``            worker: the overlap part (``python -m numba_pool_tools.bench.overlap``): 2 and 4 streams
                       each allocating a temporary per kernel, and the kernels alone
``end_to_end``         parent: the managers measured end to end, and their workers run, round by round
``device_tables``      parent: the ``cuda.device_array`` figures over rounds, ratios to default, tables
``host_tables``        parent: the host figures (pinned, managed) read back, over rounds, checks and tables
``overlap_tables``     parent: the overlap figures read back, over rounds, ratios, issue 33's targets, the table
``history_cost``       the allocation history's rows of the allocator part: its paths off and recording
                       (worker), their table (parent)
``allocator_cost``     the allocator part, in its own process (``python -m numba_pool_tools.bench.allocator_cost``)
                       and its tables in the parent
``report``             parent: the parts run, printed and put in the JSON report (for ``numba_pool_tools.cli``)
=====================  ================================================================================

Worker side: ``worker``, ``host_worker`` and ``__main__`` run inside each end-to-end process,
``overlap`` inside each overlap process, ``allocator_cost.run`` inside each allocator process,
with ``history_cost``, ``timing``, ``turns``, ``noop`` and ``anchors`` beneath them.  Parent
side: ``report`` over ``end_to_end``, ``device_tables``, ``host_tables``, ``overlap_tables``,
``launch`` and the tables of ``allocator_cost`` and ``history_cost``.  Nothing here imports
:mod:`numba_pool_tools.cli`; this package imports none of its modules.

Every process of a bench runs under one Numba CUDA frontend, numba-cuda or Numba-CUDA-MLIR: the
parent's (``numba-pool-tools bench --frontend``), which each process it starts gets as
``NUMBA_POOL_FRONTEND`` and says back in its JSON line (``frontend``); every table's heading and
the JSON report name it with its version.  RMM's rows need numba-cuda (its plugin derives from
numba-cuda's classes) and are skipped with a note under Numba-CUDA-MLIR.
"""
