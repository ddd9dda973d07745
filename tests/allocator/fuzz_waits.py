"""The fuzzer's waiting-kernel rule (a mixin of ``test_fuzz.LegalPrograms``): code that keeps a
kernel waiting on another stream, as an ODE solver's test does (issue 33).

A kernel K on a random stream A spins until the program's copy C on another stream B has run;
meanwhile the program allocates and drops arrays (in any host thread, inside ``defer_cleanup``
or not), and launches kernels on streams that stay clear of K; then it issues C (a copy the host
waits for, or not) and, sometimes, synchronizes A.  The model reports a ``"deadlock"`` when C
was ordered after K, or the host blocked on K, through numba_pool (:mod:`cuda_model.deadlock`).

Only *legal* programs, ones that Numba's default manager runs to the end too
(:class:`cuda_model.harness_waits.Waits`): nothing of the program's own is ordered after K, no
synchronize of its own, no trim, reset, IPC export or out of memory during the wait (small
sizes, and room made first), at most :data:`OUTSIDE_DEFER` drops and as many allocations
outside ``defer_cleanup`` (Numba's default manager synchronizes at its 11th pending free,
``CUDA_DEALLOCS_COUNT``), any number inside; a ``defer_cleanup`` block opened for the wait exits
after C.  A wait not inside ``defer_cleanup`` from start to end begins with no released block
waiting for a fence (the program trims first): numba_pool fences at an allocation once 32
released blocks wait, as Numba's default manager synchronizes at its 11th pending free, so a
program under either must not start such a wait with that many pending; an eager program (a
fence for every released block, a test setting) makes no wait.  Pending releases and garbage are let go before K, and another thread's parked actions wait
until after C.
"""

from __future__ import annotations

import gc

from hypothesis import strategies as st
from hypothesis.stateful import rule

#: Drops, and allocations, during a wait outside ``defer_cleanup``.
OUTSIDE_DEFER = 8
#: Sizes allocated during a wait: small, so that nothing runs out of memory (which synchronizes).
WAIT_SIZES = st.sampled_from([64, 256, 1000, 2048, 4096, 6000])
#: What the program does while the kernel waits ("open scope": a defer_cleanup block, once).
WAIT_STEPS = ("allocate", "allocate", "drop", "drop", "drop", "launch", "open scope")
#: Room that the pool must have before a wait (the steps take far less).
HEADROOM = 512 << 10
#: What the wait rule did: waits, inside defer_cleanup, allocations and drops during them.
WAIT_COUNTS: dict = {}


class WaitRules:
    """The ``wait_for_a_copy`` rule; ``wait_steps`` narrows what the program does meanwhile,
    ``wait_scopes`` when it opens a ``defer_cleanup`` block for the wait: "none", "before" the
    kernel, "during" the wait (at an "open scope" step)."""

    wait_steps: tuple = WAIT_STEPS
    wait_scopes: tuple = ("none", "before", "during")

    @rule(data=st.data(), steps=st.lists(st.integers(0, 99), max_size=14), thread=st.integers(0, 7),
          copy_thread=st.integers(0, 7), blocking_copy=st.booleans(), synchronize_after=st.booleans())
    def wait_for_a_copy(self, data, steps, thread, copy_thread, blocking_copy, synchronize_after):
        """A kernel waiting on stream A for the program's copy on stream B (see the module)."""
        p = self.p
        if self.eager:
            # A fence at every release (a test setting, not numba_pool's): no program of the
            # default manager's legality rules stays clear of it (Numba flushes at 11 frees).
            return
        scope = data.draw(st.sampled_from(self.wait_scopes), label="defer_cleanup")
        throughout = scope == "before" or bool(p.defer_scopes)  # inside defer_cleanup from K to C
        p.release_pending()
        gc.collect()
        if not throughout or p.headroom() < HEADROOM:
            p.mm.trim()  # before the wait (legal): nothing released left to fence, room made
            if p.headroom() < HEADROOM:
                return
        parked, p.parked = p.parked, []  # another thread's actions at a driver call: after the copy
        opened = scope == "before"
        if opened:
            p.open_defer()
        a = data.draw(st.sampled_from(self.streams), label="A")
        p.launch_waiting(a, thread)
        try:
            b = self._copy_stream(data, a)
            outside = {"allocate": 0, "drop": 0}
            for index in steps:
                step = self.wait_steps[index % len(self.wait_steps)]
                if step == "open scope":
                    if scope == "during" and not opened:
                        p.open_defer()
                        opened = True
                    continue
                if step in outside and not p.deferred:
                    if outside[step] >= OUTSIDE_DEFER:
                        continue
                    outside[step] += 1
                self._while_waiting(data, step)
            _count("waits")
            _count("waits inside defer_cleanup", p.deferred)
            p.release_waiting(b, copy_thread, blocking_copy)
        finally:
            p.end_wait()
            p.parked = parked
        if opened:
            p.close_defer()
        if synchronize_after:
            p.model.cuStreamSynchronize(a)  # the program waits for the kernel, now released

    def _copy_stream(self, data, a: int) -> int:
        """B: a stream other than A whose next operation does not follow the waiting kernel (a
        new one when none is)."""
        p = self.p
        candidates = [s for s in self.streams if s != a and p.may_enqueue(s)]
        new = data.draw(st.sampled_from([None, True, False]), label="new B (blocking)")
        if new is not None or not candidates:
            made = p.create_stream(bool(new))
            self.streams.append(made)
            if p.may_enqueue(made):
                return made
            candidates = candidates or [self._new_non_blocking()]
        return data.draw(st.sampled_from(candidates), label="B")

    def _new_non_blocking(self) -> int:
        made = self.p.create_stream(False)
        self.streams.append(made)
        return made

    def _while_waiting(self, data, step: str) -> None:
        p = self.p
        thread = data.draw(st.integers(0, 7))
        if step == "allocate":
            scoped = data.draw(st.booleans())
            stream = data.draw(st.sampled_from(self.streams)) if scoped else None
            p.allocate(data.draw(WAIT_SIZES), stream, thread)
            _count("allocations while waiting")
        elif step == "drop":
            legalize = "scope" if p.defer_scopes else "record"
            droppable = [f for f in p.families.values()
                         if f.id not in p.busy and p.may_drop_while_waiting(f, legalize)]
            if droppable:
                how = data.draw(st.sampled_from(["del", "del", "free", "cycle", "pending", "bare", "foreign"]))
                p.drop(data.draw(st.sampled_from(droppable)), legalize=legalize, how=how, thread=thread)
                _count("drops while waiting")
        elif step == "launch":
            streams = [s for s in self.streams if p.may_enqueue(s)]
            if streams:
                stream = data.draw(st.sampled_from(streams))
                usable = [f for f in self.families() if p.may_launch_while_waiting(stream, f)]
                if usable:
                    p.launch(stream, [data.draw(st.sampled_from(usable))], thread)


def _count(key: str, really: bool = True) -> None:
    if really:
        WAIT_COUNTS[key] = WAIT_COUNTS.get(key, 0) + 1

