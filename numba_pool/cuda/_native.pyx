# cython: language_level=3, binding=False
"""numba_pool's compiled module (optional; setup.py): the hot paths' driver calls, twins of cuda-python's
(Note [Compiled driver calls] in :mod:`.driver`; they take what the hot paths pass, ``CUstream`` and ``CUdeviceptr``
objects or ints), and the doors' C ends with their free lists (:class:`DoorCallbacks`: the callbacks PyTorch's
pluggable allocator calls, and the cuda.core and CuPy doors' calls)."""

from cpython.long cimport PyLong_AsUnsignedLongLong, PyLong_AsVoidPtr
from libc.stdlib cimport calloc, free as c_free
from libc.string cimport memset

import weakref

cimport cython

ctypedef int (*IsCapturing)(void*, int*) noexcept nogil
ctypedef int (*FreeAsync)(unsigned long long, void*) noexcept nogil
ctypedef int (*GetId)(void*, unsigned long long*) noexcept nogil

cdef IsCapturing _is_capturing = NULL
cdef FreeAsync _free_async = NULL
cdef GetId _get_id = NULL
cdef object _result = None, _status = None  # cuda-python's CUresult and CUstreamCaptureStatus
cdef tuple _ok_none = None, _ok = None  # (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_NONE), (CUDA_SUCCESS,)
cdef object _malloc = None, _free = None  # PyTorch's callbacks' Python ends


def bind(size_t is_capturing, size_t free_async, size_t get_id, result, status, tuple not_capturing):
    """Take the entry points (``cuGetProcAddress``'s addresses), cuda-python's two enums and the capture query's
    answer for a stream not capturing (returned itself)."""
    global _is_capturing, _free_async, _get_id, _result, _status, _ok_none, _ok
    _result, _status, _ok_none, _ok = result, status, not_capturing, (result(0),)
    _is_capturing, _free_async = <IsCapturing><void*>is_capturing, <FreeAsync><void*>free_async
    _get_id = <GetId><void*>get_id


cdef _unbound():
    raise RuntimeError("numba_pool.cuda._native: no driver entry points bound (numba_pool.cuda.driver.hot binds them)")


def cuStreamIsCapturing(stream):
    """cuda-python's ``cuStreamIsCapturing(stream)``: ``(CUresult, CUstreamCaptureStatus or None)``."""
    if _is_capturing == NULL:
        _unbound()
    cdef void* handle = PyLong_AsVoidPtr(int(stream))
    cdef int status = 0, err
    with nogil:
        err = _is_capturing(handle, &status)
    if err:
        return (_result(err), None)
    return _ok_none if status == 0 else (_ok_none[0], _status(status))


def cuMemFreeAsync(pointer, stream):
    """cuda-python's ``cuMemFreeAsync(pointer, stream)``: ``(CUresult,)``."""
    if _free_async == NULL:
        _unbound()
    cdef unsigned long long address = PyLong_AsUnsignedLongLong(int(pointer))
    cdef void* handle = PyLong_AsVoidPtr(int(stream))
    cdef int err
    with nogil:
        err = _free_async(address, handle)
    return (_result(err),) if err else _ok


def cuStreamGetId(stream):
    """cuda-python's ``cuStreamGetId(stream)``: ``(CUresult, int or None)``."""
    if _get_id == NULL:
        _unbound()
    cdef void* handle = PyLong_AsVoidPtr(int(stream))
    cdef unsigned long long stream_id = 0
    cdef int err
    with nogil:
        err = _get_id(handle, &stream_id)
    return (_result(err), None) if err else (_ok[0], stream_id)




# -- the doors' C ends -----------------------------------------------------------------------------
cdef enum:
    _DEVICES = 64  # device ordinals with a free list
    _PER_SIZE = 8  # blocks kept per (device, size)
    _SIZE_SLOTS = 4096  # the (device, size) table's slots: open addressing, a power of two
    _MAX_SIZES = 2048  # keys before a new size goes to Python (half the slots: short probes)
    _CHECK_EVERY = 4096  # reuses between two calls of the usage tracker's drain_if_due

#: Bytes a device's free list holds at most (blocks beyond it go back through Python).
MAX_CACHED_BYTES = 64 << 20
#: Blocks kept per (device, size).
PER_SIZE = _PER_SIZE

cdef struct SizeStack:
    size_t size  # 0: an empty slot
    int device
    int count
    unsigned long long stream  # the stream's driver id (cuStreamGetId); 0: the legacy stream
    size_t blocks[_PER_SIZE]

cdef struct Taken:
    size_t address
    size_t size
    int device
    unsigned long long stream  # as SizeStack's


cdef struct Entry:
    size_t address  # 0: an empty slot; 1: a deleted one
    size_t size
    int device
    bint kept  # on the free list (else live: its owner holds it)
    unsigned long long stream  # its allocation stream's driver id; 0: the legacy stream
    size_t handle  # that stream's handle (0 for the legacy stream)


cdef inline size_t _mix(size_t x) noexcept nogil:
    # MurmurHash3's 64-bit finalizer: block addresses share their low bits
    x ^= x >> 33
    x *= <size_t>0xff51afd7ed558ccd
    x ^= x >> 33
    x *= <size_t>0xc4ceb9fe1a85ec53
    x ^= x >> 33
    return x


cdef inline size_t _slot(size_t size, int device, unsigned long long stream) noexcept nogil:
    # Where the stack of (device, size, stream id) is looked for first
    return _mix((size * _DEVICES + <size_t>device) ^ _mix(stream)) & (_SIZE_SLOTS - 1)


cdef DoorCallbacks _installed = None  # whose ends PyTorch's C functions call


cdef bint _non_blocking(get_flags, size_t handle) except -1:
    # ``cuStreamGetFlags`` says CU_STREAM_NON_BLOCKING (1) for stream ``handle`` (False where it won't say)
    try:
        err, flags = get_flags(handle)
        return int(err) == 0 and flags is not None and int(flags) & 1
    except Exception:  # noqa: BLE001 - not kept
        return False


cdef class DoorCallbacks:
    """A door's ``malloc(size, device, stream)`` and ``free(pointer, size, device, stream)``: PyTorch's callbacks
    (:meth:`install` gives their C addresses), the cuda.core door's calls and the CuPy door's (:meth:`malloc_owned`),
    calling Python ends ``malloc`` and ``free`` with ints (a null pointer as 0; a None from ``malloc`` is a null
    pointer).  With ``free_list``, Note [The doors' free lists] in :mod:`numba_pool.plugin.free_lists`: a block freed
    on its allocation stream (the legacy stream, or a non-blocking stream not capturing) is kept here, in C, and
    given to the next request of its size on that stream, without Python.  Every method runs with the GIL held (the
    callbacks take it), which guards the tables: none calls Python while they are half changed."""

    cdef object _malloc, _free  # the Python ends, or None with an owner
    cdef object _owner  # a weak reference to the object whose ``_malloc`` and ``_free`` are the ends (no cycle)
    cdef bint _free_list, _on
    cdef SizeStack* _stacks  # _SIZE_SLOTS of them, made at the first block kept
    cdef size_t _sizes  # keys in _stacks
    cdef Entry* _entries  # the blocks that may be kept (live) or are (kept), by address: open addressing
    cdef size_t _slots, _used, _count  # slots, slots not empty (deleted too), entries
    cdef size_t _cached_bytes[_DEVICES]
    cdef size_t _kept  # blocks on the free lists
    cdef size_t _stream_bytes[_DEVICES]  # their bytes kept for streams other than the legacy one (half the bound at
    # most: not crowding the legacy stream's out)
    cdef unsigned long long _generations[_DEVICES]  # a device's, moved on by each reset (forget_device)
    cdef int _paused[_DEVICES]  # resets under way on the device: nothing kept, taken or entered
    cdef list _trackers  # device -> the UsageTracker its blocks count in (None before its first)
    cdef list _deferrals  # device -> its manager's Deferral (defer_cleanup's: nothing is kept while one is open)
    cdef list _queries  # device -> its manager's (cuStreamIsCapturing, cuStreamGetId, cuStreamGetFlags), or None
    cdef bint _c_queries[_DEVICES]  # the first two are the compiled twins: asked through their entry points
    cdef readonly unsigned long long reuses  #: Requests served from the free list, since made.
    cdef readonly unsigned long long reuses_on_streams  #: Those of them on a stream other than the legacy one.
    cdef readonly unsigned long long streams_given_back  #: Blocks kept for a stream, given back (``_free_gone``).
    cdef public size_t max_cached_bytes  #: Bytes kept per device at most (:data:`MAX_CACHED_BYTES`).
    cdef unsigned long long _until_check

    def __cinit__(self, malloc=None, free=None, bint free_list=False, owner=None):
        self._malloc, self._free, self._free_list, self._on = malloc, free, free_list, free_list
        if owner is not None:  # the door: its ends by a weak reference, so that it goes when dropped
            self._owner = weakref.ref(owner)
        self._trackers = [None] * _DEVICES
        self._deferrals = [None] * _DEVICES
        self._queries = [None] * _DEVICES
        self._until_check = _CHECK_EVERY
        self.max_cached_bytes = MAX_CACHED_BYTES

    def __dealloc__(self):
        c_free(self._stacks)
        c_free(self._entries)

    def install(self):
        """Make PyTorch's C functions call this object's ends; returns their addresses ``(malloc, free)``."""
        global _installed
        _installed = self
        return <size_t><void*>_torch_malloc, <size_t><void*>_torch_free

    # -- the callbacks ---------------------------------------------------------------------
    def malloc(self, size_t size, int device, size_t stream):
        """The ``malloc`` callback from Python (the CUDA model's): an address, or None."""
        cdef void* address = self._take_or_python(size, device, stream)
        return None if address == NULL else <size_t>address

    def free(self, size_t address, size_t size, int device, size_t stream):
        """The ``free`` callback from Python (the CUDA model's)."""
        self._give_or_python(address, size, device, stream)

    def take(self, size_t size, int device, size_t stream):
        """A block of ``size`` bytes kept for ``stream`` (a handle; 0 or 1: the legacy stream) on ``device``, or 0:
        none, and no Python end called (the door allocates itself, then :meth:`live`)."""
        return <size_t>self._take(size, device, stream)

    def give(self, size_t address, size_t size, int device, size_t stream):
        """Keep block ``address``, freed naming ``stream``: True, or False where it may not be kept (taken out of
        the live blocks; the door frees it itself, no Python end called)."""
        return self._give(address, size, device, stream)

    def malloc_owned(self, size_t size, int device):
        """``size`` bytes on device ``device`` for the legacy stream, as :meth:`malloc` (the Python end raises where
        it fails), in a :class:`FreeOnDrop` whose collection frees them on the legacy stream (CuPy's owner)."""
        cdef void* address = self._take_or_python(size, device, 0)
        if address == NULL:
            raise MemoryError(f"numba_pool: no address for {size} bytes on device {device}")
        cdef FreeOnDrop owner = FreeOnDrop.__new__(FreeOnDrop)
        owner.address, owner._size, owner._device, owner._callbacks = <size_t>address, size, device, self
        return owner

    cdef void* _take(self, size_t size, int device, size_t stream) except? NULL:
        # A kept block, or NULL (no Python end called).  Python (the periodic drain, the CUDA model's stream queries)
        # runs only before the tables are read.
        cdef SizeStack* stack
        cdef Entry* entry
        cdef size_t address
        cdef unsigned long long key = 0
        if not self._on or size == 0 or not 0 <= device < _DEVICES or self._paused[device] or stream == 2:
            return NULL  # (2: a per-thread default stream, which may be captured)
        if stream > 1:  # another stream: one not capturing whose id has blocks kept
            if not self._stream_bytes[device]:
                return NULL
            key = self._stream_key(device, stream)
            if key == 0:
                return NULL
        if self._until_check <= 0:  # the usage trackers' periodic drain: Python, so before anything is taken
            self._until_check = _CHECK_EVERY
            for tracker in self._trackers:  # every device's (the count is the door's, not one device's)
                if tracker is not None:
                    tracker.drain_if_due()
        if self._paused[device] or not self._on:  # a reset began meanwhile (the Python above)
            return NULL
        stack = self._stack(size, device, key, False)
        entry = self._find(stack.blocks[stack.count - 1]) if stack != NULL and stack.count else NULL
        if entry == NULL:  # (every kept block has its entry)
            return NULL
        stack.count -= 1
        entry.kept = False
        self._unkeep(size, device, key)
        if key:
            self.reuses_on_streams += 1
        address = entry.address
        self._count_reuse(size, device)  # (no Python: nothing else may take or give meanwhile)
        return <void*>address

    cdef unsigned long long _stream_key(self, int device, size_t handle) except? 0:
        # The driver id of stream ``handle`` if it is not capturing (asked first: an id query invalidates a capture),
        # else 0, also where the driver won't say.  The compiled twins' entry points, else the manager's driver
        # object's functions (the CUDA model's: Python, which may run a collection).
        cdef int status = 0
        cdef unsigned long long stream_id = 0
        if self._c_queries[device]:
            if _is_capturing(<void*>handle, &status) != 0 or status != 0:
                return 0
            if _get_id(<void*>handle, &stream_id) != 0:
                return 0
            return stream_id
        queries = self._queries[device]
        if queries is None:
            return 0
        try:
            answer = queries[0](handle)
            if int(answer[0]) != 0 or answer[1] is None or int(answer[1]) != 0:
                return 0
            answer = queries[1](handle)
            return int(answer[1]) if int(answer[0]) == 0 and answer[1] is not None else 0
        except Exception:  # noqa: BLE001 - not kept: the door's own path says what is wrong
            return 0

    cdef void* _take_or_python(self, size_t size, int device, size_t stream) except? NULL:
        # The callbacks' malloc: a kept block, else the Python end's
        cdef void* address = self._take(size, device, stream)
        return address if address != NULL else self._python_malloc(size, device, stream)

    cdef int _give_or_python(self, size_t address, size_t size, int device, size_t stream) except -1:
        # The callbacks' free: kept, else the Python end's
        if not self._give(address, size, device, stream):
            self._python_free(address, size, device, stream)
        return 0

    cdef void* _python_malloc(self, size_t size, int device, size_t stream) except? NULL:
        if self._owner is None:
            result = self._malloc(size, device, stream)
        else:
            owner = self._owner()
            result = None if owner is None else owner._malloc(size, device, stream)
        return NULL if result is None else PyLong_AsVoidPtr(result)

    cdef bint _give(self, size_t address, size_t size, int device, size_t stream) except -1:
        # True: kept (or freed twice), else False: the free is the caller's to make (the live entry deleted first).
        # A block of another stream is kept only when freed naming it, on the stream it was allocated on (the same
        # id), not capturing; the queries run before the tables change and the entry is found again after them.
        cdef SizeStack* stack = NULL
        cdef Entry* entry = self._find(address) if self._count else NULL
        cdef unsigned long long key = 0
        cdef bint mine
        if entry == NULL:
            return False
        if entry.kept:  # freed twice: the second does nothing, as the door's table's pop
            return True
        if entry.stream:
            mine = stream == entry.handle and stream > 2 and self._on and 0 <= device < _DEVICES
            if mine:
                key = entry.stream
                mine = self._stream_key(device, stream) == key
                entry = self._find(address) if self._count else NULL
                if entry == NULL:
                    return False
                if entry.kept:
                    return True
                mine = mine and entry.stream == key
        else:
            mine = stream <= 1
        if (mine and self._on and entry.size == size and entry.device == device and not self._paused[device]
                and self._cached_bytes[device] + size <= self.max_cached_bytes and not self._deferred(device)
                and (key == 0 or self._stream_bytes[device] + size <= self.max_cached_bytes // 2)):
            stack = self._stack(size, device, key, True)
        if stack != NULL and stack.count < _PER_SIZE:
            stack.blocks[stack.count] = address
            stack.count += 1
            entry.kept = True
            self._kept += 1
            self._cached_bytes[device] += size
            if key:
                self._stream_bytes[device] += size
            return True
        self._delete(entry)
        return False

    cdef int _python_free(self, size_t address, size_t size, int device, size_t stream) except -1:
        if self._owner is None:
            self._free(address, size, device, stream)
        else:
            owner = self._owner()
            if owner is not None:
                owner._free(address, size, device, stream)
        return 0

    cdef bint _deferred(self, int device) except -1:
        # Whether a defer_cleanup block of the device's manager is open: what is dropped inside it is held back to
        # its exit (rule 8a), so it reaches Python (the depth is read without its lock, as the release gate does)
        deferral = self._deferrals[device]
        return deferral is not None and deferral.depth > 0

    cdef int _count_reuse(self, size_t size, int device) except -1:
        # The previous owner's free and this allocation, in the tracker's events (numba_pool.allocator.usage); no
        # Python runs here (the periodic drain is at the start of a later _take)
        events = (<object>self._trackers[device]).events
        events.append(-<long long>size - 1)
        events.append(<long long>size)
        self.reuses += 1
        self._until_check -= 1
        return 0

    # -- what the door tells -----------------------------------------------------------------
    def generation(self, int device):
        """Device ``device``'s generation: read before an allocation, given to :meth:`live` after it."""
        return self._generations[device] if 0 <= device < _DEVICES else 0

    def live(self, size_t address, size_t size, int device, tracker, unsigned long long generation, deferral,
             size_t stream=0, tuple queries=None):
        """Block ``address`` of ``size`` bytes on device ``device``, allocated on ``stream`` (a handle; 0 or 1: the
        legacy stream) with nothing recorded, may be kept when its owner frees it naming that stream; its reuses
        count in ``tracker`` (a ``UsageTracker``: a device's blocks kept count in one, those kept for another are
        given back first), and nothing is kept while ``deferral`` (its manager's ``Deferral``) holds releases back.
        ``queries``: its manager's ``(cuStreamIsCapturing, cuStreamGetId, cuStreamGetFlags)`` (the first two
        ``numba_pool.cuda.driver.hot``'s), needed for another stream, which must be non-blocking and not capturing.
        Not when a reset came since ``generation`` was read (the block may be of the generation it dropped).
        Returns whether it was entered (the door joins its manager's free lists before: a ``record_stream`` finds it).
        Every entry and kept block of a device counts in the device's tracker: a new one is set before the device's
        blocks are cleared (in C), and a block is entered only while its tracker is the device's."""
        cdef Taken* taken
        cdef Entry* entry
        cdef size_t n
        cdef unsigned long long key = 0
        if not self._free_list or not 0 <= device < _DEVICES or size == 0 or generation != self._generations[device] \
                or self._paused[device] or stream == 2:
            return False
        if queries is not None:
            self._queries[device] = queries
            self._c_queries[device] = (queries[0] is cuStreamIsCapturing and queries[1] is cuStreamGetId
                                       and _is_capturing != NULL and _get_id != NULL)
        if self._trackers[device] is not tracker:  # another manager serves the device: its blocks are not ours
            previous = self._trackers[device]  # whose figures the blocks given back count in until released
            self._trackers[device], self._deferrals[device] = tracker, deferral
            n = self._clear_device(device, &taken)
            try:  # (Python: a reset, another manager's allocation may run meanwhile)
                self._release(taken, n, None, None, previous)
            except Exception as err:  # noqa: BLE001 - the allocation is made: a release never raises (rule 8)
                from .driver import warn  # (never raises, under -W error too)
                warn(f"giving back a door's kept blocks failed: {err}")
        if stream > 1:  # a non-blocking stream (Note [Idle blocks of a stream]: a free on a blocking one orders more)
            if queries is None:
                return False
            key = self._stream_key(device, stream)
            if key == 0 or not _non_blocking(queries[2], stream):
                return False
        if generation != self._generations[device] or self._paused[device] or self._trackers[device] is not tracker:
            return False
        if self._room():
            entry = self._add(address, size, device)
            entry.stream, entry.handle = key, stream if key else 0
            return True
        return False

    def forget(self, size_t address):
        """Block ``address`` (its start) must reach Python when freed (``record_stream``, a hold): taken out of the
        live blocks.  Where it is kept (a hold on memory its owner freed) it is given back, and True returned: no
        live block holds it."""
        cdef Entry* entry = self._find(address) if self._count else NULL
        cdef SizeStack* stack
        cdef Taken* taken
        cdef int j
        if entry == NULL:
            return False
        if not entry.kept:
            self._delete(entry)
            return False
        taken = <Taken*>calloc(1, sizeof(Taken))
        if taken == NULL:
            raise MemoryError("numba_pool: no memory to give back a door's kept block")
        taken.address, taken.size, taken.device = address, entry.size, entry.device
        taken.stream = entry.stream
        self._delete(entry)
        stack = self._stack(taken.size, taken.device, taken.stream, False)
        for j in range(stack.count):
            if stack.blocks[j] == address:
                stack.count -= 1
                stack.blocks[j] = stack.blocks[stack.count]
                break
        self._unkeep(taken.size, taken.device, taken.stream)
        self._release(taken, 1, None, None)  # the tables whole first (this may run other callbacks)
        return True

    def forget_device(self, int device, int pause=0):
        """A reset of device ``device``, in one step: its live blocks forgotten (their frees reach Python), its
        kept ones taken off and given back, its generation moved on (an allocation made before, entered after, is
        not live); with ``pause`` 1 (the reset's start) nothing is kept, taken or entered for the device until the
        same call with ``pause`` -1 (its end)."""
        cdef Taken* taken
        cdef size_t n
        if not 0 <= device < _DEVICES:
            return
        self._generations[device] += 1
        if pause > 0:
            self._paused[device] += 1
        elif pause < 0 and self._paused[device]:
            self._paused[device] -= 1
        n = self._clear_device(device, &taken)
        self._release(taken, n, None, None)

    cdef size_t _clear_device(self, int device, Taken** taken) except? 0:
        # The device's live entries deleted and its kept blocks pulled into ``taken`` (made here, freed by _release)
        cdef size_t i
        for i in range(self._slots):
            if self._entries[i].address > 1 and self._entries[i].device == device and not self._entries[i].kept:
                self._delete(&self._entries[i])
        return self._pull(device, None, taken)

    def drain(self, int device=-1, tracker=None, free=None, gone=None, bint streams=True):
        """Give back the blocks kept for ``device`` (-1: every device; with ``tracker``, only a device whose blocks
        count in it; without ``streams``, only the legacy stream's) through the Python ``free`` (or ``free`` and
        ``gone``, the owner's while it is finalized).  Returns how many."""
        cdef Taken* taken
        cdef size_t n = self._pull(device, tracker, &taken, streams)
        self._release(taken, n, free, gone, tracker)
        return n

    cdef void _unkeep(self, size_t size, int device, unsigned long long key) noexcept:
        self._kept -= 1
        self._cached_bytes[device] -= size
        if key:
            self._stream_bytes[device] -= size

    cdef size_t _pull(self, int device, object tracker, Taken** taken, bint streams=True) except? 0:
        # The kept blocks of ``device`` (-1: all) counting in ``tracker`` (None: any) off their stacks and out of the
        # table, into a C array: no Python object is made meanwhile (a collection could run a tensor's free).
        cdef Py_ssize_t i
        cdef size_t n = 0
        cdef SizeStack* stack
        taken[0] = NULL
        if self._stacks == NULL or not self._kept:
            return 0
        taken[0] = <Taken*>calloc(self._kept, sizeof(Taken))
        if taken[0] == NULL:
            raise MemoryError("numba_pool: no memory to give back a door's kept blocks")
        for i in range(_SIZE_SLOTS):
            stack = &self._stacks[i]
            if stack.count and (device < 0 or stack.device == device) and (streams or not stack.stream) and (
                    tracker is None or self._trackers[stack.device] is tracker):
                while stack.count:
                    stack.count -= 1
                    taken[0][n].address, taken[0][n].size = stack.blocks[stack.count], stack.size
                    taken[0][n].device, taken[0][n].stream = stack.device, stack.stream
                    n += 1
                    self._delete(self._find(stack.blocks[stack.count]))
                    self._unkeep(stack.size, stack.device, stack.stream)
        if self._sizes >= <size_t>(_MAX_SIZES // 2) and not self._kept:
            memset(self._stacks, 0, _SIZE_SLOTS * sizeof(SizeStack))  # every size's key made again
            self._sizes = 0
        return n

    cdef int _release(self, Taken* taken, size_t n, object free, object gone, object tracker=None) except -1:
        # The pulled blocks' Python frees (the tables whole: a free may run other callbacks): a legacy-stream block's
        # naming the legacy stream; those kept for another stream all at once through ``gone`` (the owner's
        # ``_free_gone``), which never names their streams: each may be destroyed by now (Note [A kept block whose
        # stream is gone]), each with the tracker it counts in (``tracker``, else its device's).  One that raises
        # (MemoryError, KeyboardInterrupt) stops none of the others: the first error is raised last.
        cdef size_t i
        first = None
        on_streams = []
        try:
            for i in range(n):
                if taken[i].stream:
                    on_streams.append((taken[i].address, taken[i].size, taken[i].device,
                                       self._trackers[taken[i].device] if tracker is None else tracker))
                    continue
                try:
                    if free is None:
                        self._python_free(taken[i].address, taken[i].size, taken[i].device, 0)
                    else:
                        free(taken[i].address, taken[i].size, taken[i].device, 0)
                except BaseException as error:  # noqa: BLE001 - re-raised below, once every block is released
                    if first is None:
                        first = error
        finally:
            c_free(taken)
        if on_streams:
            try:
                if gone is None:
                    owner = None if self._owner is None else self._owner()
                    gone = None if owner is None else owner._free_gone
                if gone is not None:  # (a door without an owner keeps none: its live() has no queries)
                    self.streams_given_back += len(on_streams)
                    gone(on_streams)
            except BaseException as error:  # noqa: BLE001 - as above
                if first is None:
                    first = error
        if first is not None:
            raise first
        return 0

    def kept_on_streams(self, tracker):
        """``(blocks, bytes)`` kept for streams other than the legacy one, of the devices whose blocks count in
        ``tracker``: freed as far as the figures go (Note [The doors' free lists])."""
        cdef Py_ssize_t i
        cdef size_t blocks = 0, nbytes = 0
        cdef SizeStack* stack
        if self._stacks != NULL:
            for i in range(_SIZE_SLOTS):
                stack = &self._stacks[i]
                if stack.stream and stack.count and self._trackers[stack.device] is tracker:
                    blocks += stack.count
                    nbytes += stack.count * stack.size
        return blocks, nbytes

    def switch(self, bint on):
        """Keep blocks (True) or not (False: those kept given back now; a history records every allocation)."""
        self._on = on and self._free_list
        if not self._on:
            self.drain()

    def cached(self, int device):
        """``(blocks, bytes)`` kept for ``device``."""
        cdef Py_ssize_t i
        cdef size_t blocks = 0
        if self._stacks != NULL:
            for i in range(_SIZE_SLOTS):
                if self._stacks[i].device == device and self._stacks[i].size:
                    blocks += self._stacks[i].count
        return blocks, self._cached_bytes[device] if 0 <= device < _DEVICES else 0

    # -- the tables ----------------------------------------------------------------------------
    cdef SizeStack* _stack(self, size_t size, int device, unsigned long long stream, bint add) noexcept:
        # The stack of (device, size, stream id), made with ``add``
        cdef size_t i
        cdef SizeStack* stack
        if self._stacks == NULL:
            if not add:
                return NULL
            self._stacks = <SizeStack*>calloc(_SIZE_SLOTS, sizeof(SizeStack))
            if self._stacks == NULL:
                return NULL
        i = _slot(size, device, stream)
        while True:
            stack = &self._stacks[i]
            if stack.size == size and stack.device == device and stack.stream == stream:
                return stack
            if stack.size == 0:
                if not add:
                    return NULL
                if self._sizes >= _MAX_SIZES:  # full: the empty stacks' keys dropped (a dead stream's, a size gone)
                    if not self._compact():
                        return NULL
                    return self._stack(size, device, stream, add)
                stack.size, stack.device, stack.count, stack.stream = size, device, 0, stream
                self._sizes += 1
                return stack
            i = (i + 1) & (_SIZE_SLOTS - 1)

    cdef bint _compact(self) noexcept:
        # The stacks' table made again with the keys of non-empty stacks only; False when none could go (or no memory)
        cdef SizeStack* old = self._stacks
        cdef SizeStack* stack
        cdef size_t i, j, kept = 0
        for i in range(_SIZE_SLOTS):
            kept += old[i].size != 0 and old[i].count > 0
        if kept > self._sizes - self._sizes // 4:  # a quarter at least goes, or none: no compaction per new key
            return False
        self._stacks = <SizeStack*>calloc(_SIZE_SLOTS, sizeof(SizeStack))
        if self._stacks == NULL:
            self._stacks = old
            return False
        for i in range(_SIZE_SLOTS):
            if old[i].size != 0 and old[i].count > 0:
                j = _slot(old[i].size, old[i].device, old[i].stream)
                while self._stacks[j].size != 0:
                    j = (j + 1) & (_SIZE_SLOTS - 1)
                self._stacks[j] = old[i]
        self._sizes = kept
        c_free(old)
        return True

    cdef Entry* _find(self, size_t address) noexcept:
        cdef size_t i
        if self._slots == 0:
            return NULL
        i = _mix(address) & (self._slots - 1)
        while self._entries[i].address != 0:
            if self._entries[i].address == address:
                return &self._entries[i]
            i = (i + 1) & (self._slots - 1)
        return NULL

    cdef void _delete(self, Entry* entry) noexcept:
        if entry != NULL:
            entry.address = 1
            self._count -= 1

    cdef bint _room(self) noexcept:
        # Room for one more entry, the table grown (at most half its slots used, deleted ones too) or made again
        cdef Entry* old = self._entries
        cdef Entry* entry
        cdef size_t old_slots = self._slots, slots = 64, i
        if (self._used + 1) * 2 <= self._slots:
            return True
        while slots < (self._count + 1) * 4:
            slots *= 2
        self._entries = <Entry*>calloc(slots, sizeof(Entry))
        if self._entries == NULL:
            self._entries = old
            return False
        self._slots, self._used, self._count = slots, 0, 0
        for i in range(old_slots):
            if old[i].address > 1:
                entry = self._add(old[i].address, old[i].size, old[i].device)
                entry.kept, entry.stream, entry.handle = old[i].kept, old[i].stream, old[i].handle
        c_free(old)
        return True

    cdef Entry* _add(self, size_t address, size_t size, int device) noexcept:
        # Under _room's promise of a slot; a live entry
        cdef size_t i = _mix(address) & (self._slots - 1), deleted = self._slots
        while self._entries[i].address != 0:
            if self._entries[i].address == address:
                self._entries[i].size, self._entries[i].device, self._entries[i].kept = size, device, False
                self._entries[i].stream, self._entries[i].handle = 0, 0
                return &self._entries[i]
            if self._entries[i].address == 1 and deleted == self._slots:
                deleted = i
            i = (i + 1) & (self._slots - 1)
        if deleted != self._slots:
            i = deleted
        else:
            self._used += 1
        self._entries[i].address, self._entries[i].size, self._entries[i].device = address, size, device
        self._entries[i].kept, self._entries[i].stream, self._entries[i].handle = False, 0, 0
        self._count += 1
        return &self._entries[i]


cdef void* _torch_malloc(size_t size, int device, void* stream) noexcept with gil:
    if _installed is None:
        return NULL
    try:
        return _installed._take_or_python(size, device, <size_t>stream)
    except BaseException:  # the Python end never raises; nothing may cross into PyTorch
        return NULL


cdef void _torch_free(void* pointer, size_t size, int device, void* stream) noexcept with gil:
    if _installed is None:
        return
    try:
        _installed._give_or_python(<size_t>pointer, size, device, <size_t>stream)
    except BaseException:  # as above
        pass


@cython.no_gc_clear  # its free must find the callbacks also when a collected cycle held it (CuPy's array in one)
cdef class FreeOnDrop:
    """What a library keeps alive for a door's block (CuPy's ``UnownedMemory`` owner, made by
    :meth:`DoorCallbacks.malloc_owned`): ``address``; its collection frees the block on the legacy stream through the
    door's callbacks (kept, or its Python end).  Never raises (rule 8)."""

    cdef readonly size_t address  #: The block's device address.
    cdef size_t _size
    cdef int _device
    cdef DoorCallbacks _callbacks

    def __dealloc__(self):
        if self._callbacks is not None:
            try:
                self._callbacks._give_or_python(self.address, self._size, self._device, 0)
            except BaseException:  # noqa: BLE001 - the Python end never raises; a collection must not see one
                pass


def torch_callbacks(malloc, free):
    """The addresses of ``malloc(size, device, stream)`` and ``free(pointer, size, device, stream)`` C functions
    (``torch._C._cuda_customAllocator``'s) calling these Python functions with ints (a null pointer as 0); a None
    from ``malloc`` is a null pointer.  No free list (:class:`DoorCallbacks`)."""
    return DoorCallbacks(malloc, free).install()
