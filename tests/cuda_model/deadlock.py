"""Waiting kernels and deadlocks: a program's progress that depends on an operation the library
queued behind a kernel that waits for it.

A *waiting kernel* K (:meth:`_WaitingCalls.launch_waiting`) spins on stream A until a later
operation C of the program, on another stream B, has run: the copy that sets the flag K polls
(:meth:`_WaitingCalls.release_waiting`).  Until C is issued, K cannot complete, and so neither can
anything ordered after it.  The program deadlocks when

* C is ordered after K (C's vector clock covers K): an operation enqueued after K on a stream
  that C's stream then follows, say an operation on the legacy stream (which waits for K when A
  is a blocking stream) before C on a blocking stream (which waits for the legacy stream's last
  operation); or
* the host blocks on something ordered after K before C is issued: ``cuCtxSynchronize``,
  ``cuStreamSynchronize`` or ``cuEventSynchronize`` of work ordered after K (every path by which
  the host learns that work completed, :meth:`~cuda_model.ordering._Streams.host_learns` and
  ``host_learns_all``).

Either is a :class:`~cuda_model.Violation` of kind ``"deadlock"``, naming the waiting kernel and
the operation through which C or the host reached it (the first one enqueued after K on another
stream, the library's first: :mod:`cuda_model.costs` says whose), and the wait then ends, so that
one deadlock is reported once.  Queries never block: ``cuEventQuery`` and ``cuStreamQuery``
answer ``CUDA_ERROR_NOT_READY`` for work ordered after a kernel still waiting, as for any work
the host has not seen complete (also with ``gpu_eager``, where a query of work that *can*
complete answers ``CUDA_SUCCESS``: :meth:`_WaitingCalls._can_complete`), and the host never
learns such work complete before C.  Once C
is issued K may complete, and so may what follows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import sys
from typing import TYPE_CHECKING, Any, Hashable, Iterable, Optional

from .base import _DRIVER_FUNCTION, SUCCESS, _R, _call_site
from .calls import _driver
from .memory import Violation
from .ordering import HOST_HANDLE, HOST_ID, Op, _Stream, describe_stream, op_a_precedes

if TYPE_CHECKING:
    from .model import CudaModel

#: Operations kept per waiting kernel that are ordered after it on other streams (the first ones).
BRIDGES = 32


@dataclass(frozen=True)
class _Bridge:
    op: Op
    library: bool
    stream: str
    site: str

    def __str__(self) -> str:
        whose = "numba_pool" if self.library else "the program"
        return f"{self.op.kind} on the {self.stream} that {whose} queued at {self.site}"


@dataclass(eq=False)
class _Waiting:
    kernel: Op
    stream: str
    site: str
    bridges: list = field(default_factory=list)  # the first ops after the kernel on other streams

    def describe(self) -> str:
        return f"the waiting kernel on the {self.stream} (launched at {self.site})"

    def culprit(self, vc: dict, exclude: Optional[Op] = None) -> Optional[_Bridge]:
        """The first operation through which ``vc`` is ordered after the kernel, the library's
        first if any."""
        found = [b for b in self.bridges if b.op is not exclude and op_a_precedes(b.op, vc)]
        return next((b for b in found if b.library), found[0] if found else None)


class _WaitingCalls:
    """Waiting kernels (model-only API) and ``cuStreamQuery``."""

    def _init_waits(self) -> None:
        self._waiting: list[_Waiting] = []
        self._counts_waits = {"waiting_kernels": 0, "deadlocks": 0}

    def launch_waiting(self: "CudaModel", stream: Any, arrays: Iterable[tuple[int, int, Hashable]] = (),
                       site: Optional[str] = None) -> Optional[Op]:
        """A kernel on ``stream`` (using ``arrays`` as :meth:`launch` does) that spins until the
        program's :meth:`release_waiting` for it.  Returns its op (the token to release it)."""
        site = site or _call_site()
        with self._lock:
            op = self.launch(stream, arrays, site)
            if op is not None:
                s = self._streams.by_id[op.stream_id]
                self._waiting.append(_Waiting(op, describe_stream(s.handle, s.id), site))
                self._counts_waits["waiting_kernels"] += 1
            return op

    def release_waiting(self: "CudaModel", kernel: Op, stream: Any, site: Optional[str] = None) -> Optional[Op]:
        """The program's copy on ``stream`` that lets ``kernel`` (:meth:`launch_waiting`) finish:
        one op, which must not be ordered after the kernel (else a ``"deadlock"``).  Returns the
        op (None for an invalid stream)."""
        site = site or _call_site()
        with self._lock:
            s = self._stream(stream, "release_waiting")
            if s is None:
                return None
            op = self._new_op(s, "copy")
            waiting = next((w for w in self._waiting if w.kernel is kernel), None)
            if waiting is None:
                return op
            self._waiting.remove(waiting)
            if op_a_precedes(kernel, op.vc):
                culprit = waiting.culprit(op.vc, exclude=op)
                how = (f"through {culprit}" if culprit is not None else
                       "by the legacy stream's implicit synchronization (the program's own choice of streams)")
                self._report_deadlock(
                    f"the copy that releases {waiting.describe()} is ordered after that kernel, {how}", s, site)
            return op

    def abandon_waiting(self: "CudaModel", kernel: Op) -> None:
        """Forget ``kernel``'s wait without the copy (a program that failed part way)."""
        with self._lock:
            self._waiting = [w for w in self._waiting if w.kernel is not kernel]

    def waiting_kernels(self: "CudaModel") -> list[Op]:
        """The waiting kernels not released yet."""
        with self._lock:
            return [w.kernel for w in self._waiting]

    @_driver
    def cuStreamQuery(self: "CudaModel", stream: Any):
        """SUCCESS only when the host already knows the stream's work is complete, or, with
        ``gpu_eager`` set, when it can complete (as ``cuEventQuery``)."""
        s = self._stream(stream, "cuStreamQuery")
        if s is None:
            return (_R.CUDA_ERROR_INVALID_HANDLE,)
        if s.last is None or self._streams.complete(s.last):
            return (SUCCESS,)
        if getattr(self, "gpu_eager", False) and self._can_complete(s.last):
            self._streams.host_learns(s.last_vc)
            return (SUCCESS,)
        return (_R.CUDA_ERROR_NOT_READY,)

    def _can_complete(self: "CudaModel", op: Op) -> bool:
        """Whether ``op`` can complete without the program doing anything more: it is ordered
        after no waiting kernel (whose copy is not issued yet)."""
        return not any(op_a_precedes(w.kernel, op.vc) for w in self._waiting)

    # -- the checks (under the model's lock) --------------------------------------------------

    def _note_after_waiting(self: "CudaModel", s: _Stream, op: Op, library: bool) -> None:
        """A new op: kept when it is the first few ordered after a waiting kernel on another
        stream."""
        for waiting in self._waiting:
            kernel = waiting.kernel
            if (op.stream_id != kernel.stream_id and len(waiting.bridges) < BRIDGES
                    and op_a_precedes(kernel, op.vc)):
                waiting.bridges.append(_Bridge(op, library, describe_stream(s.handle, s.id), _call_site()))

    def _check_host_wait(self: "CudaModel", vc: dict, library: bool) -> None:
        """The host is about to wait until everything ordered before ``vc`` completed."""
        for waiting in [w for w in self._waiting if op_a_precedes(w.kernel, vc)]:
            self._waiting.remove(waiting)
            culprit = waiting.culprit(vc)
            through = f", through {culprit}" if culprit is not None else ""
            whose = "numba_pool" if library else "the program"
            self._report_deadlock(
                f"the host blocks in {_driver_call()} ({whose}) until {waiting.describe()} completes{through}, "
                "before the copy that releases that kernel is issued", None, _call_site())

    def _report_deadlock(self: "CudaModel", detail: str, s: Optional[_Stream], site: str) -> None:
        """``s``: the stream of the copy that deadlocks (None: the host blocks)."""
        self._counts_waits["deadlocks"] += 1
        self.violations.append(Violation("deadlock", new_stream=s.handle if s is not None else HOST_HANDLE,
                                         new_stream_id=s.id if s is not None else HOST_ID, new_site=site,
                                         detail=detail))


def _driver_call() -> str:
    """The name of the modelled driver function being run (the innermost on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if _DRIVER_FUNCTION.match(frame.f_code.co_name):
            return frame.f_code.co_name
        frame = frame.f_back
    return "a synchronize"
