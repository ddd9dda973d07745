"""A test-only model of CUDA stream ordering and of the stream-ordered memory pool.

:class:`CudaModel` stands in for the module ``cuda.bindings.driver``: numba_pool runs unchanged
against it (``cu.cuMemAllocFromPoolAsync(...)`` and so on), with no GPU.  The model keeps a
*happens-before* relation over every GPU operation and checks, for each 256-byte granule of
device memory, that a new owner's use is ordered after the previous owner's last uses.  An
unordered reuse is a :class:`Violation`, naming both owners, both streams and both call sites.

What is modelled
----------------
* **Streams** (CUDA Driver API, "Stream synchronization behavior"): the legacy default stream
  (handle 0 or ``CU_STREAM_LEGACY``), the per-thread default stream of each host thread
  (``CU_STREAM_PER_THREAD``, a blocking stream), blocking streams (``CU_STREAM_DEFAULT``: an
  operation on the legacy stream waits for all earlier work of every blocking stream, and later
  work of a blocking stream waits for it) and non-blocking streams (``CU_STREAM_NON_BLOCKING``:
  no implicit ordering).  Every operation gets a vector clock over stream *ids*; the ids are
  never reused, while stream handles are (LIFO, as the driver may do).
* **Events**: ``cuStreamWaitEvent`` orders the stream after the event's most recent record *at
  the time of the call*; waiting on a never-recorded event is a no-op.
* **Host knowledge**: ``cuStreamSynchronize`` / ``cuEventSynchronize`` / ``cuCtxSynchronize``
  add what they cover to the host's vector clock, which every later operation joins.
* **The pool** ("Stream Ordered Memory Allocator"): a block freed on stream F is reused by an
  allocation on stream S only when S is F, or the free is known complete to the host, or S's
  next operation is ordered after the free through events or the legacy stream's implicit
  ordering (``CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES``).  Reuse is eager: the most
  recently freed eligible block wins over fresh address space, split when larger.  Reserved /
  used bytes, high watermarks, ``maxSize``, the release threshold (trimmed at every
  synchronize) and ``cuMemPoolTrimTo`` are modelled.

What is deliberately conservative (stricter than the driver), and why
---------------------------------------------------------------------
* ``CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`` is not modelled: the real driver may
  reuse a block on another stream by *inserting* a dependency; the model never does, so it
  never hides a missing dependency of the allocator under test behind one of its own.
* ``CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`` (reuse when the free happens to have finished on
  the device) is modelled only as "the host *knows* it finished" (a synchronize covered it):
  timing never makes a program legal.  With ``CudaModel.opportunistic_reuse`` set, the model
  runs the other execution too: every free that can complete (no waiting kernel before it,
  :mod:`cuda_model.deadlock`) has, so the pool hands its memory to any stream, and the host
  learns the free complete (the driver decided so, on the host, at that call: all later work
  follows it).  That reuse is safe only when the free was ordered after every use of the
  memory's previous owners: a free issued before those uses are known complete is caught
  there (the fuzzer draws both executions).
* Synchronizing one stream teaches the host only about that stream's work and what it was
  ordered after; synchronizing the legacy stream is not assumed to wait for blocking streams
  unless an operation on it did.
* Work left on a destroyed stream still runs (its operations stay in the relation), and later
  legacy-stream operations wait for it when it was a blocking stream, as the driver does
  (measured: docs/perf-notes.md, "A destroyed stream and the legacy stream"; its documentation
  says only that the stream's resources go once its work is done);
  ``CudaModel(legacy_waits_for_destroyed=False)`` assumes they do not.
* A handle reused for a new stream is a new stream: nothing on it is ordered after the old
  stream's work.

* **The current context**: the model's context, current in every thread unless the thread
  called :meth:`CudaModel.leave_context` (a thread that never used CUDA); there, every call but
  ``cuDevice*`` and the context stack's (``cuCtxGetCurrent``/``PushCurrent``/``PopCurrent``)
  fails with ``CUDA_ERROR_INVALID_CONTEXT``, as the driver's do.  *Foreign contexts* on the same
  device (:meth:`CudaModel.create_context`, as ``cuCtxCreate`` makes) have their own legacy and
  per-thread default streams, which order nothing of another context's streams; the legacy and
  per-thread handles name the current context's streams; ``cuCtxSynchronize`` covers the
  current context's streams only; an event records only on a stream of its own context.
* **Pinned host memory** (``cuMemHostAlloc`` ...): see :class:`_HostCalls`; the host's own
  uses are ops of a pseudo stream, the host, ordered after what it has observed complete.
* **Managed memory** (pools of ``CU_MEM_ALLOCATION_TYPE_MANAGED``, ``cuMemPrefetchAsync``): see
  :mod:`cuda_model.managed`; the host uses it too (``host_use`` on a managed address), checked
  against the device's uses of the same granules.

* **Stream capture and CUDA graphs** (:mod:`cuda_model.capture`): ``cuStreamBeginCapture`` /
  ``cuStreamEndCapture`` in the three modes, allocation / kernel / free nodes, graph memory (its
  own address range), ``cuGraphInstantiate`` (auto-free on launch) and ``cuGraphLaunch``; what
  the driver refuses during a capture (measured on an H100): the legacy stream beside a
  blocking capture, synchronizes, "potentially unsafe" calls under the thread's capture mode.
  A call that invalidates a capture is a violation (``"capture invalidated"``).

* **Waiting kernels and deadlocks** (:mod:`cuda_model.deadlock`): a kernel that spins until a
  later copy of the program on another stream (:meth:`CudaModel.launch_waiting`,
  :meth:`CudaModel.release_waiting`); the copy ordered after it, or the host blocking on work
  ordered after it before the copy, is a ``"deadlock"`` naming the operation that made it so;
  ``cuEventQuery`` / ``cuStreamQuery`` answer ``NOT_READY`` meanwhile.
* **The legacy stream's barrier as a cost** (:mod:`cuda_model.costs`): the library's operations
  on a legacy default stream, counted per allocation and per release of the program
  (:meth:`CudaModel.attributed`, :meth:`CudaModel.legacy_cost`, and in :meth:`CudaModel.stats`).

Model-only API for tests: :meth:`CudaModel.launch`, :meth:`CudaModel.copy_async`,
:meth:`CudaModel.host_use`, :meth:`CudaModel.host_stats`, :attr:`CudaModel.violations`,
:meth:`CudaModel.tail`, :meth:`CudaModel.would_follow`, :meth:`CudaModel.wait`,
:attr:`CudaModel.preempt`, :meth:`CudaModel.stats`, :meth:`CudaModel.leave_context`,
:meth:`CudaModel.create_context`, :meth:`CudaModel.live_events`, :meth:`CudaModel.capturing`,
:meth:`CudaModel.graph_memory_live`, :meth:`CudaModel.launch_waiting`,
:meth:`CudaModel.release_waiting`, :meth:`CudaModel.abandon_waiting`, :meth:`CudaModel.waiting_kernels`,
:meth:`CudaModel.attributed`, :meth:`CudaModel.legacy_cost` (and ``cuGraphInstantiate`` / ``cuGraphLaunch`` /
``cuGraphExecDestroy`` / ``cuGraphDestroy``, graph calls numba_pool never makes).
"""

from .base import GRANULE, LEGACY_HANDLES, PER_THREAD_HANDLE, SUCCESS
from .calls import CONTEXT
from .costs import CallFigures, LegacyCost
from .memory import Violation
from .model import CudaModel
from .ordering import Op, op_a_precedes

__all__ = ["CONTEXT", "GRANULE", "LEGACY_HANDLES", "PER_THREAD_HANDLE", "SUCCESS", "CallFigures", "CudaModel",
           "LegacyCost", "Op", "Violation", "op_a_precedes"]
