"""The program's side of the legacy stream's cost and of waiting kernels (a mixin of
:class:`cuda_model.harness.Program`).

Costs: the program brackets each allocation and each drop of an array's last reference
(:meth:`Waits.attributed`), saying whether a ``defer_cleanup`` is open, so that the model counts
the legacy-stream operations numba_pool issued in it (:mod:`cuda_model.costs`).

Waiting kernels: :meth:`Waits.launch_waiting` starts a kernel that spins until the program's
copy on another stream (:meth:`Waits.release_waiting`); meanwhile a *legal* program does nothing
that would make the copy wait for the kernel, or make the host wait for it: it enqueues nothing
of its own on a stream whose next operation would follow the kernel (:meth:`Waits.may_enqueue`),
asks numba_pool to order nothing after such a stream (no ``record_stream`` of one, no drop that
a record would legalize through one: :meth:`Waits.may_drop_while_waiting`), and synchronizes
nothing (no synchronize of its own, no trim, reset or IPC export, no out of memory: the caller
keeps the sizes small, :meth:`Waits.headroom`).  Whatever then orders the copy after the kernel,
or blocks the host on it, is numba_pool's doing, and the model reports a ``"deadlock"``
(:mod:`cuda_model.deadlock`).
"""

from __future__ import annotations

import contextlib
import os
import sys

from .ordering import Op

#: Where a use's stream is destroyed: its handle may name a new stream later, which orders
#: nothing of the old one's work (legalizing then takes a synchronize).
DESTROYED = -1

LEGACY = 1  # the legacy stream's handle, as cuda_model.harness names it


class Waits:
    """What :class:`~cuda_model.harness.Program` adds for costs and waiting kernels."""

    #: The kernel waiting now (its op), or None.
    waiting: Op | None = None
    #: The model's count of numba_pool's legacy-stream operations when :meth:`finish` ran.
    legacy_cost = None
    _defer_depth = 0  # defer_cleanup blocks open through defer_cleanup() (one step long)

    # -- costs --------------------------------------------------------------------------------

    @property
    def deferred(self) -> bool:
        """Whether a ``defer_cleanup`` block of the program is open."""
        return bool(self.defer_scopes) or self._defer_depth > 0

    @contextlib.contextmanager
    def defer_cleanup(self):
        """``mm.defer_cleanup()``, known to the program (its calls meanwhile count as made with
        a ``defer_cleanup`` open)."""
        with self.mm.defer_cleanup():
            self._defer_depth += 1
            try:
                yield
            finally:
                self._defer_depth -= 1

    def attributed(self, group: str, variant: str = ""):
        """Bracket one allocation or release of the program (:meth:`CudaModel.attributed`)."""
        return self.model.attributed(group, variant, self.deferred)

    # -- waiting kernels ----------------------------------------------------------------------

    def launch_waiting(self, stream: int, thread: int = 0) -> Op:
        """A kernel on ``stream`` that spins until :meth:`release_waiting` (one at a time)."""
        assert self.waiting is None, "one waiting kernel at a time"
        self.waiting = self.run(thread, self.model.launch_waiting, stream, (), _program_site())
        self.operations += 1
        return self.waiting

    def release_waiting(self, stream: int, thread: int = 0, synchronize: bool = False) -> None:
        """The copy on ``stream`` that lets the waiting kernel finish (``synchronize``: a copy the
        host waits for, as a copy from pageable memory is)."""
        kernel, self.waiting = self.waiting, None
        self.run(thread, self.model.release_waiting, kernel, stream, _program_site())
        if synchronize:
            self.run(thread, self.model.cuStreamSynchronize, stream)
        self.operations += 1

    def end_wait(self) -> None:
        """Forget a wait whose copy was never issued (a program that failed part way)."""
        if self.waiting is not None:
            self.model.abandon_waiting(self.waiting)
            self.waiting = None

    def may_enqueue(self, stream: int) -> bool:
        """Whether the program may enqueue on ``stream`` now: nothing is waiting, or the work
        would not follow the waiting kernel (nor would later work ordered after it)."""
        if self.waiting is None:
            return True
        if stream != LEGACY and stream not in self.streams:
            return False
        return not self.model.would_follow(stream, self.waiting)

    def may_drop_while_waiting(self, family, legalize: str) -> bool:
        """Whether dropping ``family``'s last reference, legalized by ``legalize`` ("record", or
        "scope" inside ``defer_cleanup``), orders nothing after the waiting kernel on the
        program's behalf: no use to legalize through a stream that follows the kernel (its
        ``record_stream`` event would come after it), none on a destroyed stream (a synchronize
        would legalize it), and, for a legacy-stream block, no recorded stream that follows it (the fence waits for
        their events; other blocks', scratch arrays' too, the host polls: Note [A named stream is not waited for] in
        numba_pool.allocator.device, rule 9's host blocks)."""
        if family.zombie or len(family.refs) > 1:
            return True
        waited_for = family.stream == LEGACY and not family.managed and not family.scratch
        if waited_for and not all(self.may_enqueue(stream) for stream in family.recorded):
            return False
        if family.door:  # the program's own waits onto the deallocation stream (Program._deallocate), which may
            # follow the kernel: the release never makes another stream wait for it (Note [A named stream is not
            # waited for] in numba_pool.allocator.device)
            on = self.deallocation_stream(family)
            waits = [used for used, op in family.uses if not self.model.would_follow(on, op)]
            # each wait records an event on ``used`` and enqueues its wait on ``on``: neither may follow the kernel
            # (a wait on the legacy stream behind it would order every blocking stream's next work after it)
            return all(used != DESTROYED and self.may_enqueue(used) for used in waits) and (
                not waits or self.may_enqueue(on))
        if legalize == "record":
            for used, op in family.uses:
                if used in family.recorded or self.model.would_follow(family.stream, op):
                    continue
                if not self.may_enqueue(used):
                    return False
        return True

    def may_launch_while_waiting(self, stream: int, family) -> bool:
        """Whether a kernel on ``stream`` may use ``family`` now: the program's own ordering
        (an event on the array's allocation stream, when ``stream`` would not follow its
        allocation) stays clear of the waiting kernel."""
        if family.zombie or not self.may_enqueue(stream):
            return False
        return self.model.would_follow(stream, family.token) or self.may_enqueue(family.stream)

    def headroom(self) -> int:
        """Bytes that allocations can still map before a capped pool, or the device, runs out
        (its reserved bytes count as taken): while a kernel waits, out of memory would
        synchronize."""
        memory = self.model._memory
        room = memory.device_total - memory.total_reserved()
        for pool in memory.all_pools():
            if pool.max_size:
                room = min(room, pool.max_size - pool.reserved)
        return room


_HERE = os.path.normcase(os.path.dirname(os.path.abspath(__file__)))


def _program_site() -> str:
    """``file:line function`` of the program's call (the nearest frame outside this package):
    the model's own call site would be the worker thread's."""
    frame = sys._getframe(1)
    while frame is not None and os.path.normcase(os.path.dirname(os.path.abspath(frame.f_code.co_filename))) == _HERE:
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    rel = os.path.relpath(name)
    return f"{rel if not rel.startswith('..') else name}:{frame.f_lineno} {frame.f_code.co_name}"
