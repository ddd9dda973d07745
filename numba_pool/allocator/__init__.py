"""The allocator: the one place that decides when memory may be handed out again.

The rule
--------
**A block is never handed to work that can run before the last use of its previous owner has
finished, and a block whose next owner is the CPU waits until the host has observed that.**

Every block is allocated for an *allocation stream* S: the thread's :func:`numba_pool.using_stream` stream,
else the legacy default stream.  Its owner's work may run on S; on any blocking stream when S is the legacy
stream (as with ``cuMemAlloc``'s memory, which Numba's default manager hands out); and on any stream
registered with :func:`numba_pool.record_stream`.  Other use must be ordered by the program (docs/guide.md,
"Stream semantics in full"), as with any stream-ordered allocator.

**No barrier between a program's streams.**  A legacy-stream operation waits for all earlier work of every
blocking stream (every Numba ``cuda.stream()``), and all their later work waits for it (CUDA Runtime API,
"stream synchronization behavior").  So numba_pool allocates and releases with no operation there: a
legacy-stream block is allocated on a private non-blocking stream, and releases are ordered by a *fence* per
batch (rule 4), at most one per 32 releases (Numba's default manager synchronizes once per 11 frees), none
inside ``defer_cleanup`` (Numba's promise: nothing happens to the device at a drop inside it).  Legacy-stream
operations remain only where the program asked for a barrier or the default manager synchronizes:
``defer_cleanup``'s exit for other streams' blocks, trim, out of memory, reset, an IPC export, rule 8.

Invariants, kept by the modules named, checked in CI by a model of CUDA's stream ordering running this code on
random legal programs (``tests/allocator/test_fuzz.py``; docs/architecture.md maps each to its tests):

1. **A block never changes stream** (:mod:`.arena`, :mod:`.domains`).  Free arena blocks belong to the
   *domain* of their previous owner's allocation stream, and an allocation on S takes blocks of S's domain
   only.  Memory moves between streams only through the mempool, whose driver orders it: a wholly free slab
   goes back with ``cuMemFreeAsync``, and the pool hands it to another stream only after that free ("Stream
   Ordered Memory Allocator", reuse policies).  The rule of PyTorch's caching allocator and CuPy's pool.
2. **Releases wait for recorded streams** (:mod:`.waits`).  A release records an event on each stream
   registered for its block (:func:`numba_pool.record_stream`) and on S, and the block goes back after the
   next fence once the host sees them done (``cuEventQuery``): no stream waits for them (Note [A named stream is
   not waited for] in :mod:`.device`), as PyTorch's caching allocator.  A legacy-stream block's fence waits for
   them instead (rule 4).  A carved scratch array records the events at its drop, and its block is held until
   the host sees them done (:mod:`.scratch`).  Blocks awaiting a fence count toward one being due, by number and
   by bytes (:class:`.fences.AfterFence`).  A release also waits for the *holds* on its block (an IPC export's
   leases, :mod:`numba_pool.ipc`; a block set aside, :mod:`numba_pool.plugin.serving`): it runs once the last
   lets go.
3. **A block of a domain other than the legacy one is free for S at once** (:mod:`.arena`): S runs the next
   owner's work after the previous owner's.
4. **A legacy-stream block is idle when handed out** (:mod:`.fences`, :mod:`.quarantine`, :mod:`.arena`,
   :mod:`.mempool_blocks`; one exception, the PyTorch, cuda.core and CuPy doors' free lists, keep a block for their
   library's next allocation on the legacy stream, its other streams' uses ordered or recorded by the program as
   those libraries' own pools require: rule 14).  Its new memory comes from the mempool on a private non-blocking stream that waits
   for nothing, from a pool that never makes an allocation wait for another stream (internal dependencies
   off).  A released block may still be used on any blocking stream, so it waits (:class:`.release.Pending`:
   the arena's *quarantine*, the mempool blocks') until an allocation records a *fence* for the batch, a
   legacy-stream event after all earlier work of every blocking stream, also one destroyed meanwhile (measured:
   docs/perf-notes.md, "A destroyed stream and the legacy stream"), and of the ``record_stream`` streams;
   the batch is reused (or freed to the mempool on the private stream) once the host has seen it complete
   (``cuEventQuery``).  **The snapshot comes before the fence**: a fence covers only the blocks taken before
   it was recorded; barriers that synchronize (trim, out of memory, reset) snapshot first too.
5. **A domain's event covers every block in it** (:mod:`.domains`, :mod:`.arena`).  A non-legacy stream S's
   domain has an event, recorded on S after each release (and each slab taken on S) and before the block is
   published.  A slab goes back to the mempool on a private return stream after waiting for it, so numba_pool
   never enqueues on S after its last release (S may be gone by then) nor on the legacy stream.
6. **Domains are keyed by the driver's stream id** (``cuStreamGetId``, unique for the life of the process),
   never by handle value (:mod:`.domains`): a new stream given a destroyed stream's handle gets a new domain.
7. **Mempool blocks** (arena off, or above its largest block) are freed with ``cuMemFreeAsync`` on their
   allocation stream after rule 2 (:mod:`.mempool_blocks`); the driver's pool keeps the rule from there.  The
   legacy stream's follow rule 4, freed after their fence (Note [Legacy-stream frees wait for a fence]).
7a. **A mempool block released on a non-blocking stream S stays idle for S** (:mod:`.stream_idle`), for S's next
   allocation of its size, no alloc or free call: kept by S's id (rule 6), never while S is captured (rule 13).
8. **A release never raises** (:mod:`.waits`).  Where it cannot order (a stream was destroyed, a per-thread
   default stream belongs to another thread, the driver refused), it falls back to the default manager's
   guarantee, ``cuCtxSynchronize``: no earlier work remains and the block is free; a warning says so.
8a. **A release made free later orders at the drop** (:mod:`.waits`, its Note).  Inside ``defer_cleanup`` a
   released block is made free when the outermost block exits (surviving a reset, :class:`.waits.Deferral`);
   under an IPC export's hold, when the last importer lets go; set aside at a dangling buffer's address
   (rule 14), after its holder's free.  Either way it waits for its recorded streams and records the arena's
   domain event or an event on its stream *at the drop*, later naming only that event (which the host polls: no
   stream waits for it) and, at ``defer_cleanup``'s exit, the legacy stream's next fence: once its arrays are gone
   a stream may be destroyed and its handle reused.
9. **Blocks whose next owner may be the CPU wait for the host** (:mod:`.host_blocks` on :mod:`.backings`;
   sharing nothing with the rules above).  Pinned and mapped (``NUMBA_POOL_HOST``) and managed memory
   (``NUMBA_POOL_MANAGED``): the host writes a new owner's block at once
   (``a = cuda.managed_array(n); a[:] = 1``), so stream order is not enough.  A block is handed out again, or
   given back to its backing, only once the events of its release (on the legacy stream a fence for a batch,
   as rule 4's: Note [A release records nothing on the legacy stream]; on its allocation stream and its
   ``record_stream`` streams) have *completed as the host observes it* (``cuEventQuery`` returns
   ``CUDA_SUCCESS``), or after ``cuCtxSynchronize`` (trim, reset); until then a new block is allocated.
   (Without concurrent managed access, or host-attached, managed arrays are Numba's ``cuMemAllocManaged``'s.)
10. **A release runs in its owner's context** (:class:`numba_pool.cuda.context.OwnerContext`).  A finalizer
    may run where no context is current, or another is (another device's, or another context of the device:
    ``cuCtxCreate``, PyCUDA, a green context), where handle 0 is *that* context's legacy stream, ordering
    nothing here, and events are made in it: a release whose driver call depends on the current context checks
    it (``cuCtxGetCurrent``) and pushes the owner's if needed.  Legacy-stream releases make no driver call
    (fences and the frees after them run at an allocation, trim or reset); a free on another stream's own
    handle names it in any context, and where none is current fails and is retried in the owner's.
11. **An export is ordered before its importer** (:meth:`.device.DeviceAllocator.export_hold`).  Another
    process orders its work against nothing of this one, so an IPC export synchronizes the context: the
    block's allocation (the driver requires it) and previous owners' work complete before the handle exists.
12. **No allocation completes against a reset generation** (:mod:`.device`).  A reset marks its block sources
    ``dropped`` (the arena under its lock, emptying the ready lists its lock-free path pops); an allocation it
    overtook is served by the next generation, and the reset's pool is destroyed only once nothing can
    allocate from it.  What a late release may touch (the domains' events) goes once out of reach.
13. **A capture gets graph memory, and nothing else touches what it would break** (:mod:`.captures`).  An
    allocation on a stream being captured (CUDA graphs) is an allocation node (``cuMemAllocFromPoolAsync`` on
    the capturing stream, from a pool graphs accept), never an arena block or scratch carve (replays would
    write them after their next owner got them); its release is a free node during the capture, a free on the
    capture stream after it.  While a capture numba_pool knows of is under way, numba_pool neither uses the
    legacy stream (a blocking stream's capture makes it unusable) nor synchronizes (which invalidates any
    capture); other driver calls run in relaxed capture mode, allocations come from the mempool (the legacy
    stream's on a synchronized side stream), and releases wait for its end (at ``defer_cleanup``'s exit too: no
    ``cuEventQuery``; a known gap: the legacy blocks of a generation a reset dropped are freed at once), but a
    mempool or arena block's of a created stream (blocking or not) not captured, waiting for no other stream but
    ``record_stream`` streams of that kind: released at the drop in relaxed mode, its stream may be destroyed
    before the capture ends (Note [Released beside a capture]; a known gap: the other releases name their streams
    after it, which the program must keep alive until then).  An arena slab emptied meanwhile goes back in relaxed mode too.
14. **A door's deallocation is ordered on the stream it names** (:meth:`.device.DeviceAllocator.deallocate`).
    A door other than Numba's EMM plugin frees a block naming a stream, or none, as its library's own pool
    does: cuda.core's ``MemoryResource`` the stream ``deallocate`` names (the buffer's last use), PyTorch's
    the tensor's allocation stream, CuPy's none (its drop).  A named stream S other than the allocation stream
    is not waited for by the allocation stream (a kernel on S may wait for its later work): a mempool block
    of a non-legacy stream is freed on S, as cuda.core's pool frees; an arena block goes back after a fence once
    the host sees S's work so far done (Note [A named stream is not waited for] in :mod:`.device`; legacy and
    graph blocks aside); the program orders the block's other uses before S (cuda.core's contract), a third
    stream's too (``record_stream``), as for those libraries' own pools (:mod:`numba_pool.plugin`'s doors).
    A door whose library frees by address alone never hands out an address that a buffer or tensor from before
    a reset still holds (Note [An address a reset gave again], :mod:`numba_pool.plugin.serving`).
    The PyTorch, cuda.core and CuPy doors keep a block their library allocated and freed on the legacy stream
    (cuda.core's: or with no stream named), and the PyTorch and cuda.core doors one allocated and freed on a
    non-blocking stream S not capturing (keyed by S's id, rule 6, as rule 7a), with no wait added since
    (``record_stream``, a hold: :meth:`.device.DeviceAllocator` calls ``on_wait`` first, which takes it out; on a
    block kept already it is released and the wait refused), for the next allocation of its size on that stream
    through that door: that stream's order is the release's, the uses on other streams, blocking ones too, being
    the program's to order before the free or to record, as for those libraries' own pools (no fence, rule 4); any
    other free releases it here, and so do the figures (the legacy stream's), trims, resets, snapshots and
    out-of-memory retries, those kept for S after a synchronize, never naming S, which may be gone (Note [The
    doors' free lists] in :mod:`numba_pool.plugin.free_lists`).

Threads
-------
Releases run in finalizers, in any thread, even inside an allocation the garbage collector interrupted.  So
**the release path takes no lock** (the interrupted allocation's would deadlock it, a reentrant one would show
it half made, and a lock costs as much as the rest of the release): each step is **one operation on a built-in
container**, atomic under CPython's global interpreter lock (GIL): ``dict`` get, set, ``setdefault``, ``pop``,
``popitem``, ``copy``; ``list`` ``append``, ``pop``, ``del lst[:n]``; ``deque`` ``append``, ``popleft``; keyed
by ints or ``CUdeviceptr`` objects, whose hashing and comparison run no Python code that could release the
GIL.  Work needing a lock (the arena's heaps, the host cache's bins) is queued for the next allocation.  The
locks and their order: docs/architecture.md, "Threads".  A Python without the GIL (``PYTHON_GIL=0``), untested
and unargued here, is refused in one line (:func:`.threads.require_gil`).

The contract
------------
A device's allocator (:class:`.device.DeviceAllocator`), each block source and the host caches
(:class:`.host_blocks.HostBlocks`) offer the core's stream-ordered contract, which knows no frontend:
``allocate(nbytes, stream) -> Block``, ``deallocate(block, stream)`` (:mod:`.block`: one
:class:`~.block.Block` per handed-out block).  Numba's EMM plugin is one door over it: its pointer holds the
block, its finalizer the block's release.  Every release goes through the **release gate** (:mod:`.release`):
its checks (rules 13, 12, 2 and 8a, the fast action, rule 10) in one order, in one function.

Modules, bottom up: block, usage, free_list, release, waits, sources, fences, stream_idle, mempool_blocks, quarantine,
domains, arena, scratch, captures, graph_blocks, backings, host_blocks, device, threads."""
