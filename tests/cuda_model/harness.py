"""numba_pool's real manager running on the CUDA model (this package), driven as a legal program
would drive it.

"Legal" is what the README's stream-semantics section promises: an array allocated on stream A
(the legacy stream outside ``using_stream``) may be used by work on any stream U that is ordered
after the allocation (U is A, or the legacy stream orders them, or the program made U wait);
when it is dropped, every use on a stream that A's next operation would not follow must be
covered by ``record_stream`` or by the program's own ordering (an event, a synchronize).
:meth:`Program.drop` makes each drop legal in one of those ways, chosen by the caller, and only
then lets the last reference go.
"""

from __future__ import annotations

import contextlib
import gc
import io
import itertools
import os
import sys
import tempfile
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace

from cuda.bindings import driver as real_cu
from cuda.core import Stream as CoreStream

import numba_pool
from numba_pool import config as pool_config
from numba_pool.allocator import host_blocks
from numba_pool.cuda import driver
from numba_pool.cuda import frontend as frontends
from numba_pool.cuda.errors import CudaAPIError
from numba_pool.cuda.streams import LEGACY_HANDLES, as_stream_ref
from numba_pool.plugin.manager import manager_class
from numba_pool.plugin.resource import MemoryResource
from numba_pool.plugin.cupy_allocator import CupyDoor
from numba_pool.plugin.torch_allocator import TorchDoor

from .calls import CONTEXT
from .harness_waits import DESTROYED, Waits
from .inject import ResetInjection
from .model import CudaModel

LEGACY = 1
OOM = real_cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
INVALID_VALUE = real_cu.CUresult.CUDA_ERROR_INVALID_VALUE


@dataclass
class Family:
    """One allocation and the views on it: the references that keep its memory alive."""

    id: int
    refs: list  # the pointer and views (Numba MemoryPointer/OwnedPointer objects)
    address: int
    size: int
    stream: int  # the allocation stream's handle
    token: object  # the allocation stream's position right after the allocation
    uses: list = field(default_factory=list)  # (stream handle, model op)
    recorded: set = field(default_factory=set)
    zombie: bool = False  # outlived a reset: never used again
    scratch: bool = False  # carved from a scratch block
    managed: bool = False  # managed memory (cuda.managed_array): the host writes it at its allocation
    door: bool = False  # a door's buffer (cuda.core, CuPy, PyTorch): freed by an explicit deallocate

    def _repr_pretty_(self, printer, cycle):
        # Hypothesis prints a drawn Family in its "Draw N:" lines and its pretty-printer keeps
        # every object it walks until the example ends: printing `refs` would keep the pointers
        # alive, so a drop in the replay of a failing example released nothing (the teardown
        # "leaks" seen when hypothesis shrank a failure).
        printer.text(f"Family(id={self.id}, address={self.address:#x}, size={self.size}, "
                     f"stream={self.stream:#x}, refs={len(self.refs)}, uses={len(self.uses)}, "
                     f"recorded={sorted(self.recorded)}, zombie={self.zombie}, managed={self.managed}, door={self.door})")




class StreamObject:
    """What a program passes to ``using_stream``: like Numba's ``cuda.stream()``, an object
    with a ``CUstream`` handle that lives as long as the stream."""

    def __init__(self, handle):
        self.handle = real_cu.CUstream(int(handle))


class _Context:
    """The Numba context stand-in: a device with an id; weak-referenceable, as Numba's
    pinned and mapped memory hold a ``weakref.proxy`` of their context."""

    def __init__(self):
        self.device = SimpleNamespace(id=0, get_device_identity=lambda: {  # what an IPC handle carries
            "pci_domain_id": 0, "pci_bus_id": 0, "pci_device_id": 0})
        self.handle = CONTEXT  # the model's one context


class Program(Waits):
    """A manager on a fresh model, with streams, threads and arrays.  Each allocation and each
    drop of an array's last reference is one call for the model's count of numba_pool's
    legacy-stream operations; waiting kernels: :class:`~cuda_model.harness_waits.Waits`.

    :param arena: arena mode.
    :param threads: host threads the actions run in (each action in one of them, in turn).
    :param max_size: the pool's cap (bytes), to reach out of memory.
    :param adaptors: the allocation path with both adaptors: an allocation log (in a temporary
        folder) and a ``numba_pool.statistics()`` scope open in every host thread.
    :param frontend: whose base classes the manager and its pointers derive from
        (``"numba-cuda"`` or ``"mlir"``); None: the tools' choice (``NUMBA_POOL_FRONTEND``).
    :param managed_max_size: the managed cache's cap (bytes; the managed cache is on, as by
        default), to reach its out of memory.
    :param managed_release_threshold: cached managed bytes kept (beyond them, complete blocks go
        back to the driver, whose next cuMemAllocManaged may return them at once).
    :param legacy_waits_for_destroyed: the model's (:class:`~cuda_model.model.CudaModel`).
    """

    def __init__(self, *, arena: bool, threads: int = 1, max_size: int | None = None,
                 release_threshold: int | None = None, device_total: int = 64 << 20,
                 host: bool = False, host_max_size: int | None = None,
                 host_release_threshold: int | None = None, host_total: int = 1 << 30,
                 adaptors: bool = False, frontend: str | None = None, managed_max_size: int | None = None,
                 managed_release_threshold: int | None = None, legacy_waits_for_destroyed: bool = True):
        # Numba's import leaves a large heap that every full collection scans (about 60 ms
        # each): freeze it, so that the collections the programs run (the collector freeing
        # cycles is one of the fuzzed actions) scan only the objects the tests create.
        gc.collect()
        gc.freeze()
        self.model = CudaModel(device_total=device_total, host_total=host_total,
                               legacy_waits_for_destroyed=legacy_waits_for_destroyed)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(driver.use(self.model))
        options = {"arena": arena, **({"arena_max_block": 4096, "arena_slab_size": 16384} if arena else {})}
        if max_size is not None:
            options["max_size"] = max_size
        if release_threshold is not None:
            options["release_threshold"] = release_threshold
        # The caches' caps with their unit: a bare number below 1 MiB is refused as a slip.
        if host:
            options.update(host=True, host_max_size=None if host_max_size is None else f"{host_max_size} B",
                           host_release_threshold=host_release_threshold)
        if managed_max_size is not None:
            options["managed_max_size"] = f"{managed_max_size} B"
        if managed_release_threshold is not None:
            options["managed_release_threshold"] = managed_release_threshold
        if adaptors:
            folder = self._stack.enter_context(tempfile.TemporaryDirectory())
            options["log"] = os.path.join(folder, "allocations.csv")
        self.context = _Context()
        self.frontend = frontends.load(frontend) if frontend else frontends.for_tools()
        self.mm = manager_class(self.frontend)(context=self.context, config=pool_config.load(environ={}, **options))
        self.mm.initialize()
        if self.mm.log is not None:
            self._stack.callback(self.mm.log.close)
        self.workers = [ThreadPoolExecutor(max_workers=1) for _ in range(threads)]
        # A host thread that never used CUDA: no current context (a finalizer may run there).
        self.bare = ThreadPoolExecutor(max_workers=1)
        self.bare.submit(self.model.leave_context).result()
        # A host thread where another context of the same device is current (a library's
        # cuCtxCreate): its legacy stream orders nothing of ours.
        self.foreign_context = self.model.create_context()
        self.foreign = ThreadPoolExecutor(max_workers=1)
        self.foreign.submit(self.model.cuCtxPushCurrent, self.foreign_context).result()
        self.resetter = ThreadPoolExecutor(max_workers=1)  # where an injected reset runs (inject_reset)
        self._stack.callback(lambda: [w.shutdown() for w in self.workers + [self.bare, self.foreign, self.resetter]])
        self.defer_scopes: list = []  # defer_cleanup blocks open across steps (open_defer)
        self.reset_in_defer = False  # a reset came while one was open (until the outermost closes)
        self.reliant: list[Family] = []  # dropped inside them unordered: the program syncs before the exit
        self.inject: ResetInjection | None = None  # a reset to run inside the next call (inject_reset)
        self.streams: dict[int, bool] = {}  # handle -> blocking, of live created streams
        self.stream_objects: dict[int, StreamObject] = {}  # handle -> what using_stream is given
        program = weakref.ref(self)  # no cycle: a dropped Program (and its manager) goes at once
        self.torch_door = TorchDoor(find_manager=lambda device_id, door: program().mm)  # allocate_door(torch=True)
        self.cupy_door = CupyDoor(find_manager=lambda device_id, door: program().mm)  # allocate_door(cupy=True)
        self.core_resource = ModelResource(manager=self.mm)  # allocate_door: cuda.core's door
        self.core_streams: dict[int, CoreStream] = {}  # handle -> the cuda.core Stream allocate_door(core_stream) names
        self.families: dict[int, Family] = {}
        self.pending: list = []  # references whose release a preempt point runs
        self.holds: list[tuple[Family, Hold]] = []  # holds not let go yet, with the family they keep
        # Another process's stream, as an importer of an IPC export uses: nothing here orders it.
        self.importer_stream = int(self.model.cuStreamCreate(real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING)[1])
        self.busy: set[int] = set()  # families a rule is working on: a parked action leaves them
        self.parked: list = []  # (family, stream, driver call, "enter"/"exit"): see park()
        self._ids = itertools.count(1)
        self.operations = 0
        self.problems: list[str] = []
        self._stack.enter_context(self._catch_problems())
        if adaptors:
            for worker in self.workers:
                self._open_scope_in(worker)

    def _open_scope_in(self, worker) -> None:
        scope = numba_pool.statistics()
        worker.submit(scope.__enter__).result()
        self._stack.callback(lambda: worker.submit(scope.__exit__, None, None, None).result())

    @contextlib.contextmanager
    def _catch_problems(self):
        hook = sys.unraisablehook
        sys.unraisablehook = lambda u: self.problems.append(f"unraisable in {u.object!r}: {u.exc_value!r}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.warnings = caught  # the live list: check() reads it while the program runs
            try:
                yield
            finally:
                sys.unraisablehook = hook

    def close(self) -> None:
        self._stack.close()

    # -- running in threads -----------------------------------------------------------------

    def run(self, thread: int, fn, *args):
        """Run ``fn(*args)`` in host thread ``thread`` and wait for it (with a pending
        :meth:`inject_reset`, traced: the reset runs at its line)."""
        return self._in(self.workers[thread % len(self.workers)], fn, *args)

    def _in(self, executor, fn, *args):
        if self.inject is not None and not self.inject.done:
            return executor.submit(self.inject.traced, fn, *args).result()
        return executor.submit(fn, *args).result()

    # -- streams ----------------------------------------------------------------------------

    def create_stream(self, blocking: bool) -> int:
        flags = 0 if blocking else real_cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        err, handle = self.model.cuStreamCreate(flags)
        assert not err
        self.streams[int(handle)] = blocking
        self.stream_objects[int(handle)] = StreamObject(handle)
        self.operations += 1
        return int(handle)

    def using_stream(self, stream: int | None):
        """``numba_pool.using_stream`` of the stream's object (one per created stream, as a
        program holds its ``cuda.stream()``), or nothing for None."""
        if stream is None:
            return contextlib.nullcontext()
        return numba_pool.using_stream(self.stream_objects.get(stream, stream))

    def in_use(self, handle: int) -> bool:
        """Whether a live array needs the stream.  A dropped one does not, even while its
        release is held back (``defer_cleanup``) or kept by a hold (an IPC export): the README
        lets a program destroy a stream once the arrays allocated on it are gone, and the
        driver may give its handle to the next new stream.  A door's buffer alive across a reset
        is not gone (its library frees it later, ordered on its stream: Note [An address a reset
        gave again]); a Numba array alive across it is, for the pool (its drop does nothing)."""
        return any(f.stream == handle or handle in f.recorded for f in self.families.values()
                   if not f.zombie or f.door)

    def destroy_stream(self, handle: int) -> bool:
        """Destroy a created stream that no live array needs (legal); False when one does."""
        self.release_pending()
        if self.in_use(handle):
            return False
        gc.collect()
        if self.in_use(handle):
            return False
        del self.streams[handle]
        del self.stream_objects[handle]  # a new stream with this handle gets a new object
        self.core_streams.pop(handle, None)
        self.model.cuStreamDestroy(real_cu.CUstream(handle))
        for f in self.families.values():  # the handle may come back for a new stream
            f.uses = [(DESTROYED if used == handle else used, op) for used, op in f.uses]
        self.operations += 1
        return True

    # -- arrays -----------------------------------------------------------------------------

    def allocate(self, size: int, stream: int | None = None, thread: int = 0) -> Family | None:
        """``size`` bytes in host thread ``thread``, inside ``using_stream(stream)`` if given;
        None when the pool is out of memory (the error must be numba_pool's)."""
        return self.allocate_in(self.workers[thread % len(self.workers)], size, stream)

    def allocate_in(self, executor, size: int, scope: int | None = None, tracked: int | None = None) -> Family | None:
        """``size`` bytes in ``executor``'s thread (a worker, or a thread of the caller's own),
        inside ``using_stream(scope)`` if given, the array tracked as allocated on ``tracked``
        (default: ``scope``, else the legacy stream: a capture's allocation is tracked on the
        stream it was captured from, not the one it replays on); None when the pool is out of
        memory (the error must be numba_pool's)."""
        def body():
            with self.using_stream(scope):
                return self.mm.memalloc(size)
        try:
            with self.attributed("allocation"):
                pointer = self._in(executor, body)
        except CudaAPIError as err:
            if size == 0 and err.code == INVALID_VALUE:  # as cuMemAlloc(0) under Numba's default manager
                return None
            assert err.code == OOM and "out of memory allocating" in str(err), str(err)
            self.operations += 1
            return None
        self.operations += 1
        stream = tracked if tracked is not None else scope if scope is not None else LEGACY
        family = self._track(pointer, size, stream)
        if self.inject is not None and self.inject.done and self.inject.during == "allocate":
            self.inject.judge(self, family)
        return family

    def allocate_managed(self, size: int, stream: int | None = None, thread: int = 0) -> Family | None:
        """``cuda.managed_array``'s allocation of ``size`` bytes in host thread ``thread``
        (inside ``using_stream(stream)`` if given), which the host then writes at once, as
        ``a = cuda.managed_array(n); a[:] = 1`` does: the model checks that write against the
        previous owners' last uses (the host rule).  None when the managed cache is out of
        memory (the error must be numba_pool's)."""
        def body():
            with self.using_stream(stream):
                return self.mm.memallocmanaged(size, True)
        pointer = self._allocated(thread, body, "managed", "out of managed memory allocating")
        if pointer is None:
            return None
        family = self._track(pointer, size, stream if stream is not None else LEGACY)
        family.managed = True
        self.run(thread, self.model.host_use, family.address, size, family.id)
        self.operations += 2
        return family

    def allocate_door(self, size: int, stream: int | None = None, thread: int = 0,
                      torch: bool = False, core_stream: bool = False, cupy: bool = False) -> Family | None:
        """A door's allocation: ``numba_pool.MemoryResource.allocate(size, stream)`` (cuda.core's door, its live table
        and the core's contract behind it) in host thread ``thread``, on ``stream`` (None: the legacy stream) named by
        its stream object, or (``core_stream``) by the cuda.core ``Stream`` kept for it; freed by :meth:`drop` with
        ``deallocate`` on the stream of its last use (:meth:`_deallocate`); ``torch``: PyTorch's callbacks instead,
        with raw handles (a destroyed stream's handle given again names the new stream); ``cupy``: the CuPy door's
        null-stream allocation (``stream`` None), freed by dropping its owner.  None when the pool is out of memory."""
        handle = stream if stream is not None else LEGACY

        def body():
            if torch:
                return TorchBuffer.allocate(self.torch_door, size, 0 if stream is None else handle)
            if cupy:
                assert stream is None, "the CuPy door's free list serves its null stream"
                return CupyBuffer(self.cupy_door.native.malloc_owned(size, 0), size)
            if core_stream:
                named = self.core_streams.setdefault(handle, CoreStream.from_handle(int(handle)))
            else:
                named = None if stream is None else self.stream_objects.get(handle, handle)
            return self.core_resource.allocate(size, named)
        buffer = self._allocated(thread, body, "door", "out of memory allocating")
        if buffer is None:
            return None
        self.operations += 1
        family = self._track(buffer, size, handle)
        family.door = True
        return family

    def _allocated(self, thread: int, body, kind: str, says: str):
        """``body()`` run in host thread ``thread``, attributed to an allocation of ``kind``; None when it ran out
        of memory, whose error must be numba_pool's, saying ``says``."""
        try:
            with self.attributed("allocation", kind):
                return self.run(thread, body)
        except CudaAPIError as err:
            assert err.code == OOM and says in str(err), str(err)
            self.operations += 1
            return None

    @staticmethod
    def deallocation_stream(family: Family) -> int:
        """Where a door's buffer is deallocated: the stream of its last use, else its allocation stream."""
        if family.uses and family.uses[-1][0] != DESTROYED and not family.zombie and not (
                family.refs and isinstance(family.refs[-1], CupyBuffer)):  # CuPy's drop names no stream
            return family.uses[-1][0]
        return family.stream

    def _deallocate(self, family: Family, thread: int) -> None:
        """The door's documented release: ``deallocate(block, on)`` on the stream of the last use
        (the allocation stream when none), the program having ordered every other use before it
        with its own events (cuda.core's ``Buffer.close(stream)`` contract); a use on a destroyed
        stream takes a synchronize."""
        on = self.deallocation_stream(family)
        for stream, op in family.uses:
            if family.zombie or self.model.would_follow(on, op):
                continue
            if stream == DESTROYED:
                self.model.cuCtxSynchronize()
            else:
                self.run(thread, self.model.wait, on, stream)
        buffer = family.refs.pop()
        self.run(thread, buffer.deallocate, as_stream_ref(self.stream_objects.get(on, on)))

    def free_recorded(self, family: Family, thread: int = 0) -> None:
        """PyTorch's documented release of a tensor used on other streams: ``numba_pool.record_stream(tensor, s)``
        for each stream ``s`` of its uses its allocation stream does not follow, then the free naming the allocation
        stream, with no wait of the program's (a door's family, from :meth:`allocate_door` with ``torch``)."""
        with self._busy([family]):
            for stream, op in family.uses:
                if not family.zombie and not self.model.would_follow(family.stream, op):
                    self.run(thread, self.mm.record_stream, family.refs[0], stream)
            del self.families[family.id]
            with self.attributed("release", "door"):
                self.run(thread, family.refs.pop().deallocate, None)
            self.operations += 1

    def host_access(self, family: Family, thread: int = 0) -> None:
        """The owner of a managed array reads or writes it on the host (``a.sum()``, ``a[:] = 0``)."""
        if family.managed and not family.zombie:
            self.run(thread, self.model.host_use, family.address, family.size, family.id)
            self.operations += 1

    def _track(self, pointer, size: int, stream: int) -> Family:
        family = Family(next(self._ids), [pointer], pointer.device_pointer_value, size, stream,
                        self.model.tail(stream))
        self.families[family.id] = family
        return family

    def scratch(self, sizes: list[int], nbytes: int, stream: int | None = None, thread: int = 0) -> list[Family]:
        """Allocate ``sizes`` inside ``numba_pool.scratch(nbytes)`` (and ``using_stream``)."""
        def body():
            with self.using_stream(stream), numba_pool.scratch(nbytes, manager=self.mm):
                return [self.mm.memalloc(n) for n in sizes]
        try:
            with self.attributed("allocation", "scratch"):
                pointers = self.run(thread, body)
        except CudaAPIError as err:
            assert err.code == OOM, str(err)
            return []
        self.operations += 1 + len(sizes)
        families = [self._track(p, n, stream if stream is not None else LEGACY) for p, n in zip(pointers, sizes)]
        for f in families:
            if f is not None:
                f.scratch = True
        return families

    def view(self, family: Family, start: int) -> None:
        family.refs.append(family.refs[0].view(min(start, family.size)))
        self.operations += 1

    @contextlib.contextmanager
    def _busy(self, families):
        ids = {f.id for f in families} - self.busy
        self.busy |= ids
        try:
            yield
        finally:
            self.busy -= ids

    def launch(self, stream: int, families: list[Family], thread: int = 0) -> None:
        with self._busy(families):
            self._launch(stream, families, thread)

    def _launch(self, stream: int, families: list[Family], thread: int = 0) -> None:
        """A kernel on ``stream`` using the arrays, ordered after their allocation (legal)."""
        families = [f for f in families if not f.zombie]
        for f in families:
            if not self.model.would_follow(stream, f.token):
                self.run(thread, self.model.wait, stream, f.stream)  # the program's own ordering
        op = self.run(thread, self.model.launch, stream, [(f.address, f.size, f.id) for f in families])
        for f in families:
            f.uses.append((stream, op))
        self.operations += 1

    def record_stream(self, family: Family, stream: int) -> None:
        with self._busy([family]):
            self._record_stream(family, stream)

    def _record_stream(self, family: Family, stream: int) -> None:
        if not family.zombie:
            self.mm.record_stream(family.refs[0], stream)
            family.recorded.add(stream)
            self.operations += 1

    def drop(self, family: Family, *, legalize: str = "record", how: str = "del", thread: int = 0) -> None:
        """Drop one reference; before the last goes, make the release legal by ``legalize``
        ("record": record_stream, "wait": the program's event, "sync": a context synchronize;
        "scope": inside an open :meth:`open_defer` block, nothing now (a door's buffer: freed on its
        allocation stream): the program synchronizes before the block exits, relying on ``defer_cleanup``
        meanwhile) and let it go by ``how``
        ("del", "free", "cycle": garbage collected later, "pending": released at a later preempt
        point, "bare": in a thread with no current CUDA context, "foreign": in a thread where
        another context of the device is current)."""
        if family.id not in self.families:  # a parked action dropped it while a rule ran
            return
        with self._busy([family]):
            self._drop(family, legalize=legalize, how=how, thread=thread)

    def _drop(self, family: Family, *, legalize: str, how: str, thread: int) -> None:
        if len(family.refs) > 1:
            self.run(thread, family.refs.pop)
            self.operations += 1
            return
        if family.door:
            del self.families[family.id]
            with self.attributed("release", "door"):
                if legalize == "scope" and self.defer_scopes and not family.zombie:  # its uses ordered by nothing:
                    self.reliant.append(family)  # the program synchronizes before the outermost block exits
                    self.run(thread, family.refs.pop().deallocate, None)  # on its allocation stream, no wait
                else:
                    self._deallocate(family, thread)
            self.operations += 1
            return
        if family.zombie:
            pass
        elif legalize == "scope" and self.defer_scopes:
            self.reliant.append(family)
        else:
            self._legalize(family, "record" if legalize == "scope" else legalize, thread)
        del self.families[family.id]
        holder = [family.refs.pop()]  # the only reference left: dropped in `thread`
        with self.attributed("release", "managed" if family.managed else ""):
            if how == "free" and not family.zombie:
                self.run(thread, _free, holder)
            elif how == "cycle":
                holder[0].cycle = holder[0]
            elif how == "pending":
                self.pending.append(holder[0])
            elif how == "bare":
                self._in(self.bare, drop_reference, holder)
            elif how == "foreign":
                self._in(self.foreign, drop_reference, holder)
            self.run(thread, drop_reference, holder)
        self.operations += 1

    def _legalize(self, family: Family, legalize: str, thread: int) -> None:
        for stream, op in family.uses:
            if stream in family.recorded or self.model.would_follow(family.stream, op):
                continue
            if stream != LEGACY and stream not in self.streams:  # destroyed: only a synchronize orders it now
                self.model.cuCtxSynchronize()
            elif legalize == "record":
                self.record_stream(family, stream)
            elif legalize == "wait":
                self.run(thread, self.model.wait, family.stream, stream)
            else:
                self.model.cuCtxSynchronize()

    def hold(self, family: Family) -> bool:
        """An IPC export of ``family``'s array (``DeviceAllocator.export_hold``, what
        ``get_ipc_handle`` does besides the driver's export): the block is kept from reuse after
        its release until :meth:`let_go`, and the importer, another process that orders its
        work against nothing of this one, writes it at once (the producer fills what the
        consumer allocated and exported), on :attr:`importer_stream`."""
        if family.zombie or self.mm.allocator is None:
            return False
        hold = Hold()
        if not self.mm.allocator.export_hold(family.address, hold):
            return False
        self.holds.append((family, hold))
        self.model.launch(self.importer_stream, [(family.address, family.size, family.id)])
        self.operations += 1
        return True

    def let_go(self, index: int, bare: bool = False) -> None:
        """The importer closes: its last use of the memory (a kernel on :attr:`importer_stream`,
        which nothing of this process orders) has completed as the host sees it (``close()``
        synchronizes), then hold ``index`` lets go
        and the releases it kept run now, in a thread with no current CUDA context when ``bare``
        (as in IPC's lease thread), else in the main thread.  A hold that let a block be reused
        early shows as that last use racing the new owner's."""
        family, hold = self.holds.pop(index)
        if not family.zombie:
            self.model.launch(self.importer_stream, [(family.address, family.size, family.id)])
            self.model.cuStreamSynchronize(self.importer_stream)
        if bare:
            self._in(self.bare, hold.let_go)
        else:
            self._in(self.workers[0], hold.let_go)
        self.operations += 1

    def release_pending(self) -> None:
        while self.pending:
            self.pending.pop()

    def preempt_every(self, period: int) -> None:
        """Release a pending reference (and collect garbage) at every ``period``-th driver call
        (0: never), in the thread that makes it: a finalizer running between two of the
        allocator's steps.  Parked actions (:meth:`park`) run at their driver call too."""
        counter = itertools.count(1)

        def hook(phase, name):
            calls = next(counter)
            if period and calls % period == 0:
                if self.pending:
                    self.pending.pop()
                if calls % (period * 8) == 0:
                    gc.collect(0)  # the youngest generation, where fresh cycles are
            if self.parked:
                self._run_parked(phase, name)
        self.model.preempt = hook

    def park(self, family: Family, stream: int, call: str, when: str) -> None:
        """What another host thread may do between two driver calls of the allocator: at the
        allocator's next ``call`` ("enter" or "exit" of it, from numba_pool's code), a kernel on
        ``stream`` uses ``family``'s array, which is then dropped (legally: the allocation stream
        waits for the uses it would not follow, by the program's own event), in the thread
        making the call.  The
        pending releases cannot open these windows: their uses all came before, in host order,
        whatever the allocator does at that point."""
        self.parked.append((family, stream, call, when))

    def _run_parked(self, phase: str, name: str) -> None:
        family, stream, call, when = self.parked[-1]
        if (call, when) != (name, phase) or family.id in self.busy:
            return
        if not any("numba_pool" in f.f_code.co_filename for f in _frames(sys._getframe())):
            return  # a driver call of the harness itself, not of the allocator
        contexts = self.model._contexts()
        if not contexts or int(contexts[-1]) != int(CONTEXT):
            # A thread without the program's context ("bare", "foreign"): a legacy-stream launch there goes to another
            # context's legacy stream, which no fence of numba_pool's orders (the fuzzer found that, as a managed
            # block's unordered reuse), and the legalizing wait's event is made outside the program's context (a
            # review found false reports on created streams too).  The program launches where its context is
            # current, as Numba's launches make it.
            return
        self.parked.pop()
        if family.id in self.families and family.refs and not family.zombie and (
                stream == LEGACY or stream in self.streams):
            if not self.model.would_follow(stream, family.token):
                self.model.wait(stream, family.stream)
            family.uses.append((stream, self.model.launch(stream, [(family.address, family.size, family.id)])))
            # Legal by the program's own ordering (an event its allocation stream waits for),
            # not record_stream: that takes the arena's lock, which the allocator may hold here.
            for used, op in family.uses:
                if used in family.recorded or self.model.would_follow(family.stream, op):
                    continue
                if used != LEGACY and used not in self.streams:  # destroyed: as _legalize does
                    self.model.cuCtxSynchronize()
                else:
                    self.model.wait(family.stream, used)
            del self.families[family.id]
            # A release like drop()'s: its block counts toward the fences' bound (checks.legacy_cost_problems).
            with self.attributed("release", "door" if family.door else "managed" if family.managed else ""):
                if family.door:  # on its allocation stream, which the waits above ordered after every use
                    family.refs.pop().deallocate(None)
                family.refs.clear()
        self.operations += 1

    def reset(self) -> None:
        self.release_pending()
        with self._busy(list(self.families.values())):  # no parked use of memory being freed
            self.mm.reset()
        self.after_reset()

    def after_reset(self) -> None:
        """Every array the reset freed is a zombie, never used again (held ones too); managed
        arrays outlive a reset (their memory stays valid until they are dropped)."""
        for f in [*self.families.values(), *(f for f, _ in self.holds), *self.reliant]:
            f.zombie = f.zombie or not f.managed
        self.reset_in_defer = self.reset_in_defer or bool(self.defer_scopes)
        self.reliant = [f for f in self.reliant if not f.zombie]
        self.operations += 1

    def inject_reset(self, line: int, during: str) -> None:
        """Run ``mm.reset()`` inside the next traced call (an allocation or a drop:
        ``during``), at its ``line``-th line event in numba_pool's code where no lock of
        numba_pool is held: what another thread's reset does at that moment
        (:mod:`cuda_model.inject`)."""
        self.inject = ResetInjection(self, line, during)

    def open_defer(self) -> None:
        """Enter a ``defer_cleanup`` block that stays open across steps."""
        scope = self.mm.defer_cleanup()
        scope.__enter__()
        self.defer_scopes.append(scope)
        self.operations += 1

    def close_defer(self) -> None:
        """Exit the innermost open ``defer_cleanup`` block; before the outermost exits, the
        program synchronizes, as it must for the arrays it dropped relying on the block."""
        if len(self.defer_scopes) == 1 and self.reliant:
            self.model.cuCtxSynchronize()
            self.reliant.clear()
        self.defer_scopes.pop().__exit__(None, None, None)
        self.reset_in_defer = self.reset_in_defer and bool(self.defer_scopes)
        self.operations += 1

    def check(self) -> None:
        """No violation, no exception in a release, no warning but the documented fallback."""
        self.model.assert_no_violations()
        assert not self.problems, self.problems
        unexpected = [str(w.message) for w in self.warnings if "synchronized the device instead" not in str(w.message)]
        assert not unexpected, unexpected
        arena = self.mm.allocator.arena if self.mm.allocator is not None else None
        if arena is not None:
            arena.check_invariants()
        if self.mm.managed is not None:
            self.mm.managed.check_invariants()
        if self.mm.host is not None:
            self.mm.host.check_invariants()

    def _assert_no_dropped_generation_memory(self) -> None:
        """Every allocation of a pool other than the current generation's (a reset dropped it), its capture pool's,
        a managed pool's or the device's default pool's has been freed: a release a reset overtook is not lost.
        Graph memory (allocation nodes) is its graphs', freed with them."""
        allocator = self.mm.allocator
        kept = set() if allocator is None else {int(allocator.pool.handle)}
        if allocator is not None and allocator._capture_pool is not None:
            kept.add(int(allocator._capture_pool.handle))
        self.model.cuCtxSynchronize()
        lost = [a for a in self.model._memory.live.values()
                if a.pool.handle not in kept and not a.pool.managed and not a.pool.is_default
                and not a.op.kind.startswith("graph")]
        assert not lost, f"{len(lost)} allocation(s) of a dropped generation's pool never freed: {lost[:3]}"

    def finish(self) -> dict:
        """Drop everything, let every hold go, trim, and check that every byte is accounted for.
        Returns the model's :meth:`~cuda_model.CudaModel.stats`, with the count of numba_pool's
        legacy-stream operations at allocations and releases (:attr:`legacy_cost` has them all)."""
        self.end_wait()
        for family in list(self.families.values()):
            while family.refs:
                self.drop(family, legalize="sync")
        while self.holds:
            self.let_go(0)
        while self.defer_scopes:
            self.close_defer()
        self.release_pending()
        gc.collect()
        self.mm.trim()
        self.check()
        self._assert_no_dropped_generation_memory()
        stats = self.mm.statistics()
        assert stats.bytes_in_use == 0 and stats.blocks_in_use == 0, stats
        assert stats.pool_used_bytes == 0, stats
        assert stats.managed_in_use_bytes == 0 and stats.managed_cached_bytes == stats.managed_reserved_bytes, stats
        self.legacy_cost = self.model.legacy_cost()
        return self.model.stats()


class Hold:
    """What an IPC export registers (a hold, ``numba_pool.allocator.waits``): until
    :meth:`let_go` (the importer closes), it keeps every release of its block; after, it keeps
    nothing, as a lease no living importer claims."""

    def __init__(self):
        self.kept: list = []
        self.holding = True

    def defer(self, release) -> bool:
        if not self.holding:
            return False
        self.kept.append(release)
        return True

    def let_go(self) -> None:
        self.holding = False
        while self.kept:
            self.kept.pop()()


class DoorBuffer:
    """A cuda.core ``Buffer`` from ``numba_pool.MemoryResource`` (:class:`ModelResource`'s: cuda.core's own needs a
    driver): what ``Buffer.from_handle`` is given; ``deallocate(stream)`` is cuda.core's ``Buffer.close``, which
    calls ``mr.deallocate(ptr, size, stream)`` with a new ``Stream`` for the stream named, else for the one the
    Buffer recorded.  A view keeps it, as a view of a ``Buffer`` does."""

    def __init__(self, address: int, size: int, mr, stream):
        self.device_pointer_value, self.size, self.mr, self.recorded = address, size, mr, stream

    @classmethod
    def from_handle(cls, address: int, size: int, mr=None, stream=None) -> "DoorBuffer":
        buffer = cls(address, size, mr, stream)
        buffer.block = mr._blocks[address][0]  # the resource's Block for it (entered before from_handle)
        return buffer

    def view(self, start: int) -> "DoorBuffer":
        return self

    def deallocate(self, stream) -> None:
        """``close(stream)`` (a StreamRef; None: the stream recorded at the allocation)."""
        handle = self.recorded.__cuda_stream__()[1] if stream is None else stream.value
        self.mr.deallocate(self.device_pointer_value, self.size, CoreStream.from_handle(handle))


class ModelResource(MemoryResource):
    """``numba_pool.MemoryResource`` handing out :class:`DoorBuffer` stand-ins."""

    _buffer = DoorBuffer


class TorchBuffer(DoorBuffer):
    """A tensor's memory from PyTorch's callbacks (:class:`~numba_pool.plugin.torch_allocator.TorchDoor`), freed
    naming a raw stream handle as PyTorch does."""

    def __init__(self, door, address: int, size: int, handle: int):
        self.door, self.size, self.device_pointer_value, self.handle = door, size, address, handle

    @classmethod
    def allocate(cls, door, size: int, handle: int) -> "TorchBuffer":
        """``malloc(size, 0, handle)``; out of memory (a null pointer and the door's one line) as CudaAPIError."""
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            address = door.malloc(size, 0, handle)
        if address is None:
            assert "CUDA_ERROR_OUT_OF_MEMORY" in said.getvalue(), said.getvalue()
            raise CudaAPIError(OOM, f"numba_pool: out of memory allocating {size} bytes (PyTorch's door)")
        return cls(door, address, size, handle)

    def deallocate(self, stream) -> None:
        """``free(address, size, 0, stream)``, naming ``stream`` (a StreamRef; None: the allocation stream); one
        alive across a reset is freed too (Note [An address a reset gave again])."""
        self.door.free(self.device_pointer_value, self.size, 0, self.handle if stream is None else stream.value)


class CupyBuffer(DoorBuffer):
    """A CuPy array's memory from the CuPy door's null-stream allocation (``CupyDoor``'s ``native.malloc_owned``, as
    :func:`numba_pool.cupy_allocator` makes it): freed when its owner is dropped, ordered on the legacy stream."""

    def __init__(self, owner, size: int):
        self.owner, self.size, self.device_pointer_value = owner, size, owner.address

    def deallocate(self, stream) -> None:
        """CuPy's drop of the array (``stream``: its allocation stream, the legacy one, or None)."""
        assert stream is None or stream.value in LEGACY_HANDLES, stream
        self.owner = None


def drop_reference(refs: list) -> None:
    """An array's drop: its references let go; a tensor's (PyTorch frees it explicitly: a captured one) freed first."""
    if refs and isinstance(refs[0], TorchBuffer):
        refs[0].deallocate(None)
    refs.clear()


def _free(refs: list) -> None:
    refs[0].free()


def _frames(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back
