"""A reset run *inside* another call of numba_pool: between two lines of an allocation or a
release, where another host thread's ``reset()`` may land.

The model's preempt points are the driver calls; a reset racing an allocation needs finer ones
(between the ready-cache lookup and the arena's lock there is no driver call).  So the call runs
under a trace function (``sys.settrace``, in the thread that makes it) that counts line events
in numba_pool's files and, at the chosen one, runs the manager's real ``reset()`` there, in
the program's thread for resets while the call waits.  That is what another thread's reset does
at that moment, provided it would not block: the reset is run only where the calling thread holds none of numba_pool's locks (a reset
in another thread would wait for them, then run after), else at the next line where it holds
none.  Actions run one at a time, so a lock that is held is held by this call.

After an allocation that a reset interrupted, :meth:`ResetInjection.judge` decides whether the
pointer it returned is sound ("an allocation never completes against a reset generation"):

* a live block of the allocator now in place: the allocation completed in the new generation;
* else a block that the reset's generation had *handed out* when the reset began (a carved or
  popped block, a mempool allocation in its ledger): the allocation completed before the reset,
  which freed it, as it frees every array alive then: the array is a zombie, never used;
* else a problem: a block taken from memory the reset freed after the reset began (a heap
  carved after the reset, a ready block popped after it), which a later allocation may alias.
"""

from __future__ import annotations

import os
import sys

import numba_pool

_PACKAGE = os.path.dirname(os.path.abspath(numba_pool.__file__)) + os.sep


class ResetInjection:
    """One reset to run at the ``line``-th line event of numba_pool's code in the next traced
    call, an allocation or a drop (``during``)."""

    def __init__(self, program, line: int, during: str):
        self.program = program
        self.line = line
        self.during = during
        self.done = False  # the reset ran (or the call ended before the line: see traced)
        self.handed_out: set[int] = set()  # blocks the dropped generation had handed out

    # -- running the call traced ------------------------------------------------------------

    def traced(self, fn, *args):
        """``fn(*args)`` in this thread, with the reset at the chosen line."""
        count = 0

        def local(frame, event, arg):
            nonlocal count
            if event == "line" and not self.done:
                count += 1
                if count >= self.line and not self._locks_held():
                    self._reset_here()
            return local if not self.done else None

        def calls(frame, event, arg):
            if self.done or not frame.f_code.co_filename.startswith(_PACKAGE):
                return None
            return local

        sys.settrace(calls)
        try:
            return fn(*args)
        finally:
            sys.settrace(None)
            self.done = True  # a call shorter than `line` events: no reset this time

    def _locks(self) -> list:
        """Every lock of numba_pool the call may hold."""
        from numba_pool.allocator import captures
        from numba_pool.plugin.state import process
        mm = self.program.mm
        found = [mm._init_lock, process._lock, mm._usage._replay_lock, captures._lock]  # reset() refreshes captures
        for holder in (mm.host, mm.log):
            if holder is not None:
                found.append(holder._lock)
        allocator = mm.allocator
        if allocator is not None:
            found.append(getattr(allocator.waits, "deferral", allocator.waits)._lock)
            found.append(allocator.waits.fence_lock)
            if allocator.arena is not None:
                found.append(allocator.arena._lock)
        return found

    def _locks_held(self) -> bool:
        return any(lock.locked() for lock in self._locks())

    def _reset_here(self) -> None:
        # In the program's own thread for resets (it has the context current, as the thread
        # calling reset() has), while this one waits: the interleaving of another thread's
        # reset landing here.
        self.done = True
        self.handed_out = self._handed_out()
        program = self.program
        with program._busy(list(program.families.values())):
            program.resetter.submit(program.mm.reset).result()
        program.after_reset()

    def _handed_out(self) -> set[int]:
        allocator = self.program.mm.allocator
        if allocator is None:
            return set()
        handed = {block.address for block in allocator.mempool_blocks.blocks()}
        arena = allocator.arena
        if arena is not None:
            listed = {block.start for blocks in list(arena.ready.values()) for block in list(blocks)}
            listed |= {block.start for block in list(arena.quarantine.waiting)}
            listed |= {block.start for _, taken, _ in list(arena.fences.batches) for block in taken}
            handed |= set(dict(arena.taken)) - listed
        return handed

    # -- the oracle ---------------------------------------------------------------------------

    def judge(self, program, family) -> None:
        """After an allocation the reset interrupted: see the module docstring."""
        program.inject = None
        allocator = program.mm.allocator
        block = allocator._block_at(family.address) if allocator is not None else None
        if block is not None and block.address == family.address:
            return  # a block of the new generation
        if family.address in self.handed_out:
            family.zombie = True  # completed before the reset, which freed it
            return
        program.problems.append(
            f"an allocation of {family.size} bytes completed against the generation a reset dropped: block "
            f"{family.address:#x} is neither a live block of the new generation nor one the reset freed as handed out")
        family.zombie = True
