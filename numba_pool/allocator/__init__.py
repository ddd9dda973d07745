"""The allocator: the one place that decides when memory may be handed out again.

The rule
--------
**A block is never handed to work that can run before the last use of its previous owner has
finished, and a block whose next owner is the CPU waits until the host has observed that.**

Every block is allocated for an *allocation stream* S: the thread's
:func:`numba_pool.using_stream` stream, else the legacy default stream.  Its owner's work may
run on S; on any blocking stream when S is the legacy stream (as with ``cuMemAlloc``'s memory,
which Numba's default manager hands out); and on any stream registered with
:func:`numba_pool.record_stream`.  Other use must be ordered by the program (docs/guide.md,
"Stream semantics in full"), as with any stream-ordered allocator.

**No barrier between a program's streams.**  An operation on the legacy stream waits for all
earlier work of every blocking stream, and all later work of every blocking stream waits for it
(CUDA Runtime API, "stream synchronization behavior"): every ``cuda.stream()`` of Numba is a
blocking stream.  So numba_pool allocates and releases without any operation there: a legacy
stream's block is allocated on a private non-blocking stream, and its release is ordered by a
*fence* recorded for a whole batch of releases (rule 4), at most once per 32 releases (Numba's
default manager synchronizes the device once per 11 frees), never while a ``defer_cleanup`` is
open (Numba's promise: nothing happens to the device at a drop inside it).  Legacy-stream
operations remain only where the program asked for a barrier or the default manager
synchronizes: the exit of ``defer_cleanup`` for blocks of other streams, trim, out of memory,
reset, an IPC export, and rule 8's fallback.

Invariants, kept by the modules named and checked in CI by a model of CUDA's stream ordering
that runs this code against random legal programs (the test package ``cuda_model`` and
``tests/allocator/test_fuzz.py``); ``docs/architecture.md`` maps each to its function and test:

1. **A block never changes stream** (:mod:`.arena`, :mod:`.domains`).  Free arena blocks belong
   to the *domain* of one stream, their previous owner's allocation stream, and an allocation on
   S takes blocks of S's domain only.  Memory moves between streams only through the mempool,
   whose driver orders it: a wholly free slab goes back with ``cuMemFreeAsync`` and the pool
   hands it to another stream only after that free ("Stream Ordered Memory Allocator", reuse
   policies).  The rule of PyTorch's caching allocator and CuPy's pool.
2. **Releases wait for recorded streams** (:mod:`.waits`).  Before a block leaves its owner, S
   waits on the device (``cuStreamWaitEvent``) for an event recorded on each stream registered
   for it.  Then everything its owner's work did is ordered before S's later work.  A release
   also waits for the *holds* registered for its block (an IPC export's leases,
   :mod:`numba_pool.ipc`): it runs once the last lets go.
3. **A block of a domain other than the legacy one is free for S at once** (:mod:`.arena`): S
   runs the next owner's work after the previous owner's.
4. **A legacy-stream block is idle when handed out** (:mod:`.fences`, :mod:`.quarantine`,
   :mod:`.arena`, :mod:`.mempool_blocks`).  Its new memory comes from the mempool on a private
   non-blocking stream that waits for nothing, from a pool that never makes an allocation wait
   for another stream (internal dependencies off): idle memory.  A released block may still be
   used by work on any blocking stream, so it waits (pending, :class:`.release.Pending`, in the
   arena's *quarantine* and the mempool blocks) until an allocation records a *fence* for the batch, one event on
   the legacy stream, which completes after all earlier work of every blocking stream; the
   batch is reused (or freed to the mempool on the private stream) only once the host has seen
   that event complete (``cuEventQuery``).  Until then allocations take other memory.
   **The snapshot comes before the fence**: a fence covers only the blocks it took before it
   was recorded; a block freed meanwhile waits for the next.  Barriers that synchronize (trim,
   out of memory, reset) take their snapshot first too, and free it after.  The streams
   registered for a legacy-stream block with ``record_stream`` are waited for by that fence
   (events recorded on them at the release).
5. **A domain's event covers every block in it** (:mod:`.domains`, :mod:`.arena`).  The domain
   of a stream S other than the legacy one has an event, recorded on S after each release (and
   after each slab taken on S) and before the block is published.  A slab goes back to the
   mempool on a private return stream after waiting for that event, so numba_pool never enqueues
   on S after its last release (S may be destroyed by then) nor on the legacy stream.
6. **Domains are keyed by the driver's stream id** (``cuStreamGetId``, unique for the life of
   the process), never by handle value (:mod:`.domains`): a new stream that gets a destroyed
   stream's handle gets a new domain.
7. **Mempool blocks** (arena off, or larger than its largest block) are freed with
   ``cuMemFreeAsync`` on their allocation stream after rule 2 (:mod:`.mempool_blocks`); the
   driver's pool keeps the rule from there.  Those of the legacy stream follow rule 4: freed on
   the private allocation stream once their fence has completed (Note [Legacy-stream frees
   wait for a fence]).
8. **A release never raises** (:mod:`.waits`).  Where it cannot order (a stream was destroyed,
   a per-thread default stream belongs to another thread, the driver refused), it falls back to
   the default manager's guarantee: ``cuCtxSynchronize``, after which no earlier work remains,
   then the block is free; a warning says so.
8a. **A release made free later orders at the drop** (:mod:`.waits`, its Note).  Inside
   ``defer_cleanup`` a released block is made free when the outermost block exits (the block
   survives a reset, :class:`.waits.Deferral`); while an IPC export's hold keeps it, when the
   last importer lets go.  Either way the release waits for its recorded streams, records the
   arena's domain event or an event on its stream *at the drop*, and later names only that
   event and the legacy stream: a stream may be destroyed once its arrays are gone, and the
   driver gives its handle to the next new stream, which orders nothing of the old one's work.
9. **Blocks whose next owner may be the CPU wait for the host** (:mod:`.host_blocks`, on the
   backings of :mod:`.backings`; kept apart because it shares no domain, arena or mempool with
   the rules above).  Pinned and mapped memory (``NUMBA_POOL_HOST``) and managed memory
   (``NUMBA_POOL_MANAGED``, from the device's managed mempool): the host writes a new owner's
   block at once (``a = cuda.managed_array(n); a[:] = 1``), so stream order is not enough.  An
   event is recorded on the legacy stream (after all work of blocking streams; by an allocation,
   for a batch of releases, as rule 4's fence: Note [A release records nothing on the legacy
   stream]), and at release on the block's allocation stream when it is another (``using_stream``), and on each stream
   registered with ``record_stream`` (other non-blocking streams need it, as for device
   blocks); the block is handed out again only once every one of those events has *completed
   as the host observes it* (``cuEventQuery`` returns ``CUDA_SUCCESS``); otherwise a new block
   is allocated.  Blocks go back to their backing (``cuMemFreeHost``; ``cuMemFreeAsync`` to the
   managed mempool, which may hand them out at once) only in that state, after their events
   completed (``cuEventSynchronize`` when over the cap) or after ``cuCtxSynchronize`` (trim,
   reset): whatever the managed mempool hands out is idle memory.  Where the device has no
   concurrent managed access, and for host-attached managed memory, Numba's own
   ``cuMemAllocManaged`` serves managed arrays.
10. **A release runs in its owner's context** (:class:`numba_pool.cuda.context.OwnerContext`).
    A finalizer may run in a thread with no current context (one that never used CUDA), or with
    another one: another device's, or another context of the same device (``cuCtxCreate``,
    PyCUDA, a green context); there handle 0 is *that* context's legacy stream, which orders
    nothing here, and events are made in that context.  Every release that makes a driver call
    on a handle that depends on the current context first asks which context is current
    (``cuCtxGetCurrent``) and, when it is not the owner's, pushes the owner's.  The legacy
    stream's releases make no driver call, of any kind of block: fences and the frees that
    follow them run at an allocation (or trim, reset), in the owner's context.  A free on
    another stream's own handle names that stream in any context; where no context is current
    it fails and is retried in the owner's.
11. **An export is ordered before its importer** (:meth:`.device.DeviceAllocator.export_hold`).
    Another process orders its work against nothing of this one, so an IPC export synchronizes
    the context: the block's allocation and its previous owners' work have completed before the
    handle exists (the driver requires the allocation complete before another process uses it).
12. **No allocation completes against a reset generation** (:mod:`.device`).  A reset marks its
    block sources ``dropped`` (the arena under its lock, and empties the ready lists that its
    lock-free path pops); an allocation that it overtook is served by the next generation, and
    the reset's pool is destroyed only once nothing can allocate from it.  Objects a late
    release may still touch (the domains' events) go when it can no longer reach them.

13. **A capture gets graph memory, and nothing else touches what it would break**
    (:mod:`.captures`).  An allocation on a stream being captured (CUDA graphs) is an
    allocation node of the graph (``cuMemAllocFromPoolAsync`` on the capturing stream, from a
    pool graphs accept), never an arena block or a scratch carve: those have no node, and the
    graph's kernels would write them at every replay after their next owner got them.  Its
    release during the capture is a free node; after it, the graph's allocation is freed on the
    capture stream, after the launches ordered there.  While a capture numba_pool knows of is
    under way, numba_pool never uses the legacy stream (which a blocking stream's capture makes
    unusable) and never synchronizes (which invalidates any capture); its other driver calls
    run in relaxed capture mode; allocations come straight from the mempool (the legacy
    stream's on a side stream, synchronized, so the block is idle when handed out); releases
    are held back and run in order once no capture is under way.

Threads
-------
Releases run in finalizers: in any thread, and even inside an allocation of the same thread
that the garbage collector interrupted.  So **the release path takes no lock**: a lock held by
the interrupted allocation would deadlock it (the locks are not reentrant, and a reentrant one
would let the release see the allocation's half-made state), and a lock costs as much as the
rest of the release.  Instead, each step a release takes is **one operation on a built-in
container**, atomic under CPython's global interpreter lock (GIL): ``dict`` get, set,
``setdefault``, ``pop``, ``popitem`` and ``copy``; ``list`` ``append``, ``pop`` and ``del
lst[:n]``; ``deque`` ``append`` and ``popleft``.  Their keys are ints or ``CUdeviceptr``
objects, whose hashing and comparison run no Python code that could release the GIL.  Work
that needs a lock (the arena's heaps, the host cache's bins) is published to a queue that the
next allocation, under the lock, applies.  The lock rule: a release never waits for a lock (the
allocation log's flush and the start of IPC's lease thread try theirs without waiting and go on
when they are taken); the other locks are taken by allocation, statistics, trim, reset and
initialization, and where two are held at once the plugin's initialization lock is the outer one.

A Python built without the GIL (``python3.13t`` with ``PYTHON_GIL=0``) keeps single container
operations atomic with per-object locks, but nothing here has been run or checked there, and
the ordering argument above has not been made for it; :func:`.threads.require_gil` makes
``install()`` and the plugin refuse such a process with one line.

The contract
------------
A device's allocator (:class:`.device.DeviceAllocator`) and each block source offer the core's
stream-ordered contract, which knows no frontend: ``allocate(nbytes, stream) -> Block`` and
``deallocate(block, stream)`` (:mod:`.block`: one :class:`~.block.Block` record per handed-out
block).  The pinned and managed caches (:class:`.host_blocks.HostBlocks`) offer it too.  The
Numba EMM plugin is one door over it: the pointer it gets holds the block and its finalizer is
the block's release on its allocation stream.  Every release is the **release gate**
(:mod:`.release`): the checks every release makes (rules 13, 12, 2 and 8a, then the source's
fast action, rule 10) in one order, in one function; a source supplies only its fast action
and its ordered release.

Modules, bottom up: :mod:`.block` (the record and the contract), :mod:`.usage` (lock-free usage
events), :mod:`.free_list` (one domain's heap), :mod:`.release` (the release gate),
:mod:`.waits` (rules 2 and 8), :mod:`.sources` (what both block sources share),
:mod:`.fences` (rule 4: fences and the private streams), :mod:`.mempool_blocks` (rule 7),
:mod:`.quarantine` and :mod:`.domains` (rules 4-6),
:mod:`.arena` (rules 1, 3-6), :mod:`.scratch` (a bump-allocated block), :mod:`.captures`
(rule 13: stream capture), :mod:`.graph_blocks` (rule 13's graph allocations), :mod:`.backings` and
:mod:`.host_blocks` (rule 9: pinned and managed memory), :mod:`.device` (one device's allocator: the block sources, the barriers that
synchronize, ``record_stream``, IPC holds; rules 11 and 12), :mod:`.threads` (the GIL check).
"""
