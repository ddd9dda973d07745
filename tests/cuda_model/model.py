"""The model itself: :class:`CudaModel`, a drop-in for ``cuda.bindings.driver``."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Callable, Hashable, Iterable, Optional

from cuda.bindings import driver as _cu

from .base import _DRIVER_FUNCTION, GRANULE, _call_site, _handle, _round_up
from .calls import CONTEXT, _DeviceCalls, _HostCalls, _MemoryCalls, _StreamCalls
from .capture import _CaptureCalls
from .costs import LIBRARY, _Costs
from .deadlock import _WaitingCalls
from .managed import _ManagedCalls
from .memory import Violation, _AddressSpace, _Granules, _Memory, _Pool, _Use
from .ordering import Op, _Event, _Events, _Stream, _Streams, op_a_precedes

class CudaModel(_CaptureCalls, _ManagedCalls, _WaitingCalls, _Costs, _StreamCalls, _MemoryCalls, _DeviceCalls,
                _HostCalls):
    """A drop-in for ``cuda.bindings.driver`` (one device, one context) that checks stream
    ordering of memory reuse.  See the module docstring.

    :param device_total: the modelled device memory in bytes.
    :param base_address: the first device address handed out.
    :param legacy_waits_for_destroyed: whether legacy-stream ops are ordered after the work
        left on destroyed blocking streams (default: they are, as measured on the GPU: docs/perf-notes.md,
        "A destroyed stream and the legacy stream"; False: the documented minimum, to show a program's
        dependence on it).
    :param host_total: the modelled pinnable host memory in bytes (``cuMemHostAlloc``).
    :param library: the folder of the library under test (numba_pool's package): whose driver
        calls count as its own (:mod:`cuda_model.costs`).
    """

    def __init__(self, device_total: int = 1 << 30, base_address: int = 0x7F00_0000_0000,
                 legacy_waits_for_destroyed: bool = True, host_total: int = 1 << 30, library: str = LIBRARY):
        self._lock = threading.RLock()
        self._tls = threading.local()
        self._known_contexts = {int(CONTEXT)}  # CONTEXT, and those made by create_context()
        self._streams = _Streams(self._tls, legacy_waits_for_destroyed, self._current_context, int(CONTEXT))
        self._events = _Events()
        self._memory = _Memory(device_total, base_address)
        self._granules = _Granules()
        self.host_total = host_total
        self._host_space = _AddressSpace(0x5500_0000_0000)
        self._host_live: dict[int, tuple[int, int, str]] = {}  # base -> (bytes, flags, call site)
        self._host_reserved = 0
        self._host_granules = _Granules()
        self._host_seq = 0
        self._counts: Counter = Counter()
        #: Every violation found so far, in order.
        self.violations: list[Violation] = []
        #: ``preempt(phase, name)``, phase "enter" or "exit", around each driver call.
        self.preempt: Optional[Callable[[str, str], Any]] = None
        self._init_captures()  # stream capture and graphs (cuda_model.capture)
        self._init_costs(library)  # the library's legacy-stream operations per call (cuda_model.costs)
        self._init_waits()  # waiting kernels and deadlocks (cuda_model.deadlock)
        #: An execution where every free that can complete has (module docstring): the pool
        #: reuses it on any stream.
        self.opportunistic_reuse = False
        self._streams.before_host_learns = self._before_host_learns

    op_a_precedes = staticmethod(op_a_precedes)

    # ---- the current context (one context; every thread has it current unless it left it)

    def _contexts(self) -> list:
        stack = getattr(self._tls, "contexts", None)
        return [CONTEXT] if stack is None else stack

    def _current_context(self) -> int:
        """The calling thread's current context (handle value).  A thread with none gets the
        model's: driver calls there are refused anyway, and the model-only calls (``launch``,
        ``wait`` ...) stand for the program, which works in the model's context."""
        stack = self._contexts()
        return int(stack[-1]) if stack else int(CONTEXT)

    def create_context(self) -> Any:
        """Another context on the same device, as ``cuCtxCreate`` (or PyCUDA's
        ``make_context``, a green context, a library's own) makes: its own legacy and
        per-thread default streams, which order nothing of the other contexts' streams.  A
        thread makes it current with ``cuCtxPushCurrent``.  Returns its handle."""
        with self._lock:
            handle = _cu.CUcontext(int(CONTEXT) + 0x10 * len(self._known_contexts))
            self._known_contexts.add(int(handle))
            return handle

    def live_events(self) -> int:
        """Events created and not destroyed (a leak shows here)."""
        with self._lock:
            return len(self._events)

    def leave_context(self) -> None:
        """The calling thread has no current context from now on, as a thread that never used
        CUDA (a finalizer may run there): driver calls that need one fail until it pushes one."""
        self._tls.contexts = []

    def __getattr__(self, name: str) -> Any:
        if _DRIVER_FUNCTION.match(name):
            raise AttributeError(f"CudaModel does not model {name}")
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(_cu, name)

    # ---- internals shared by the driver calls

    def _run_preempt(self, phase: str, name: str) -> None:
        hook = self.preempt
        if hook is None:
            return
        self._tls.in_preempt = True
        try:
            hook(phase, name)
        finally:
            self._tls.in_preempt = False

    def _new_op(self, s: _Stream, kind: str, extra: Iterable[dict] = ()) -> Op:
        self._counts["ops"] += 1
        self._check_new_op(s, kind)  # none on a capturing stream, nor on the legacy one beside a capture
        op = self._streams.new_op(s, kind, extra)
        if s.legacy or self._waiting:
            library = self.whose.library_call()
            if s.legacy:
                self._note_legacy_op(s, op, library)  # cuda_model.costs
            if self._waiting:
                self._note_after_waiting(s, op, library)  # cuda_model.deadlock
        return op

    def _before_host_learns(self, vc: dict, whole_context: bool) -> None:
        """The host is about to wait for the work ordered before ``vc`` (``whole_context``: a
        ``cuCtxSynchronize``)."""
        if whole_context or self._waiting:
            library = self.whose.library_call()
            if whole_context:
                self._note_context_synchronize(library)  # cuda_model.costs
            if self._waiting:
                self._check_host_wait(vc, library)  # cuda_model.deadlock

    def _report(self, kind: str, s: Optional[_Stream], call: str, start: int = 0, end: int = 0,
                handle: Optional[int] = None) -> None:
        self.violations.append(Violation(
            kind, start, end, new_stream=s.handle if s else handle, new_stream_id=s.id if s else None,
            new_site=_call_site(), detail=call))

    def _stream(self, handle: Any, call: str) -> Optional[_Stream]:
        h = _handle(handle)
        s = self._streams.resolve(h)
        if s is None:
            self._report("invalid stream", None, f"{call} on destroyed or unknown stream handle {h:#x}", handle=h)
        return s

    def _user_stream(self, handle: Any, call: str) -> Optional[_Stream]:
        s = self._stream(handle, call)
        if s is not None and (s.legacy or s.per_thread):
            self._report("invalid stream", s, f"{call} of a default stream")
            return None
        return s

    def _event(self, handle: Any, call: str) -> Optional[_Event]:
        h = _handle(handle)
        e = self._events.resolve(h)
        if e is None:
            self._report("invalid event", None, f"{call} on destroyed or unknown event handle {h:#x}")
        return e

    def _pool(self, handle: Any, call: str) -> Optional[_Pool]:
        h = _handle(handle)
        p = self._memory.pools.get(h)
        if p is None:
            self._report("invalid pool", None, f"{call} on destroyed or unknown pool handle {h:#x}")
        return p

    def _after_sync(self) -> None:
        self._counts["unmapped_bytes"] += self._memory.trim_to_thresholds(self._streams.complete)

    # ---- model-only API for tests

    def launch(self, stream: Any, arrays: Iterable[tuple[int, int, Hashable]], site: Optional[str] = None) -> Optional[Op]:
        """A kernel on ``stream`` using each ``(address, nbytes, owner)`` of ``arrays``: one op.

        Each granule it touches must have been last owned by ``owner``, or every maximal use of
        its previous owner must happen before this op; and every byte must lie in a live pool
        allocation now (host order).  Returns the op (None for an invalid stream).  On a stream
        being captured: a kernel node of the capture, checked at each launch of its graph
        (:mod:`cuda_model.capture`), and None."""
        site = site or _call_site()
        with self._lock:
            s = self._stream(stream, "launch")
            if s is None:
                return None
            if self._captured_launch(s, arrays, site):
                return None
            op = self._new_op(s, "launch")
            self._counts["launches"] += 1
            for address, nbytes, owner in arrays:
                self._check_use(s, op, int(address), int(nbytes), owner, site)
            return op

    def _check_use(self, s: _Stream, op: Op, address: int, nbytes: int, owner: Hashable, site: str) -> None:
        if nbytes <= 0:
            return
        for lo, hi in self._memory.uncovered(address, address + nbytes):
            self.violations.append(Violation("use of unallocated memory", lo, hi, new_owner=owner,
                                             new_stream=s.handle, new_stream_id=s.id, new_site=site))
        lo, hi = address // GRANULE * GRANULE, _round_up(address + nbytes)
        for start, end, prev in self._granules.use(lo, hi, _Use(op, owner, site)):
            self.violations.append(Violation(
                "unordered reuse", start, end, prev.owner, prev.op.handle, prev.op.stream_id, prev.site,
                owner, s.handle, s.id, site))

    def tail(self, stream: Any) -> Optional[Op]:
        """The stream's last op (None when it has none): a token for :meth:`would_follow`.

        :raises ValueError: for a destroyed or unknown handle."""
        with self._lock:
            s = self._streams.resolve(_handle(stream))
            if s is None:
                raise ValueError(f"tail: invalid stream handle {_handle(stream):#x}")
            return s.last

    def would_follow(self, stream: Any, token: Optional[Op]) -> bool:
        """True when an op enqueued on ``stream`` now would be ordered after ``token`` (legacy
        implicit ordering and host knowledge included).

        :raises ValueError: for a destroyed or unknown handle."""
        with self._lock:
            s = self._streams.resolve(_handle(stream))
            if s is None:
                raise ValueError(f"would_follow: invalid stream handle {_handle(stream):#x}")
            return token is None or s.id == token.stream_id or op_a_precedes(token, self._streams.next_vc(s))

    def wait(self, later_stream: Any, earlier_stream: Any) -> None:
        """Order ``later_stream``'s future work after ``earlier_stream``'s work so far (an event
        recorded on the earlier stream and waited on by the later one)."""
        _, event = self.cuEventCreate(_cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.cuEventRecord(event, earlier_stream)
        self.cuStreamWaitEvent(later_stream, event, 0)
        self.cuEventDestroy(event)

    def stream_id(self, stream: Any) -> int:
        """The id (as ``cuStreamGetId``) of a valid handle, without a driver call."""
        with self._lock:
            s = self._streams.resolve(_handle(stream))
            if s is None:
                raise ValueError(f"stream_id: invalid stream handle {_handle(stream):#x}")
            return s.id

    def stats(self) -> dict:
        """Counts: ops, launches, allocs, fresh_allocs, reuse_same_stream, reuse_cross_stream
        (of which reuse_cross_stream_pending: a free not yet known complete, reused through an
        event or legacy-stream dependency), frees, oom, unmapped_bytes, driver_calls, no_context
        (calls refused for want of a current context), context_pushes, managed_host_uses (host
        uses of managed memory), prefetches, violations, live_allocations, granule_segments;
        waiting_kernels and deadlocks (:mod:`cuda_model.deadlock`); and the library's
        legacy-stream operations (:mod:`cuda_model.costs`): for ``allocation`` and ``release``
        calls, ``<group>_calls``, ``legacy_ops_at_<group>s``, ``<group>s_with_legacy_ops``,
        ``most_legacy_ops_per_<group>``, ``legacy_ops_at_excused_<group>s`` (calls that
        synchronized the context), and ``legacy_ops_elsewhere``."""
        with self._lock:
            keys = ("ops", "launches", "allocs", "fresh_allocs", "reuse_same_stream", "reuse_cross_stream",
                    "reuse_cross_stream_pending", "frees", "oom", "unmapped_bytes", "driver_calls", "no_context",
                    "context_pushes", "managed_host_uses", "prefetches")
            out = {k: self._counts[k] for k in keys}
            out.update(violations=len(self.violations), live_allocations=len(self._memory.live),
                       granule_segments=len(self._granules), **self._counts_waits, **self._legacy_cost_stats())
            return out

    def assert_no_violations(self) -> None:
        """:raises AssertionError: listing every violation, if any."""
        if self.violations:
            raise AssertionError(f"{len(self.violations)} violation(s):\n" + "\n".join(map(str, self.violations)))
