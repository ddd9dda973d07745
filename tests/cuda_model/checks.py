"""Checks shared by the tests that run programs on the CUDA model (``tests/allocator``)."""

from __future__ import annotations

from .costs import LegacyCost
from .harness import Program

#: The warning of rule 8's fallback, the only one a program may see.
FALLBACK = "synchronized the device instead"


def eager(p: Program) -> None:
    """Fence before every legacy allocation that finds released blocks (arena and mempool), keep
    no ready cache, and run the model as a device that has finished all it can by the time of
    any query (``gpu_eager``: a fence completes as soon as the host asks), so that a freed block
    is handed out by the very next allocation."""
    allocator = p.mm.allocator
    allocator.mempool_blocks.fences.fence_blocks = 1
    arena = allocator.arena
    if arena is not None:
        arena.quarantine_limit = -1
        arena.quarantine.cache_limit = 0
    for cache in (p.mm.host, getattr(p.mm, "managed", None)):
        if cache is not None and hasattr(cache, "fences"):
            cache.fences.fence_blocks = 1
    p.model.gpu_eager = True


def assert_clean(p: Program) -> None:
    assert p.model.violations == [], "\n".join(map(str, p.model.violations))
    p.check()


def assert_no_fallback(p: Program) -> None:
    """Every release was ordered on the device: none fell back to rule 8's synchronize."""
    assert not any(FALLBACK in str(w.message) for w in p.warnings), [str(w.message) for w in p.warnings]


#: An allocation may record one fence (an event on the legacy stream, after waits there for the
#: events of record_stream's streams) once at least this many released blocks wait for one
#: (``numba_pool.allocator.fences.FENCE_BLOCKS``).
FENCE_BLOCKS = 32


def legacy_cost_problems(cost: LegacyCost, fences: bool = True) -> list[str]:
    """What in ``cost`` (the model's count of numba_pool's legacy-stream operations,
    :mod:`cuda_model.costs`) breaks issue 33's rule, one line each; calls in which numba_pool
    synchronized the context (rule 8's fallback, out of memory, a reset) are excused, and so is
    whatever runs outside an allocation or a release (a ``defer_cleanup`` exit, trim, reset):

    * a release issues no legacy-stream operation;
    * an allocation made while a ``defer_cleanup`` is open issues none;
    * with ``fences``, allocations that issue any (each is a fence) number at most one per
      :data:`FENCE_BLOCKS` released blocks (a scratch block's release counts too).  Off for
      a program that makes the arena fence at every miss (:func:`eager`)."""
    problems = []
    releases = cost.figures("release")
    if releases.ops:
        problems.append(f"{releases.calls_with_ops} of {releases.calls} releases issued {releases.ops} legacy-stream "
                        f"operation(s) (none expected); the first: {releases.examples}")
    deferred = cost.figures("allocation", deferred=True)
    if deferred.ops:
        problems.append(f"{deferred.calls_with_ops} of {deferred.calls} allocations inside defer_cleanup issued "
                        f"{deferred.ops} legacy-stream operation(s) (none expected); the first: {deferred.examples}")
    allocations = cost.figures("allocation")
    released = releases.calls + cost.figures("allocation", variant="scratch").calls
    if fences and allocations.calls_with_ops > released // FENCE_BLOCKS:
        problems.append(f"{allocations.calls_with_ops} of {allocations.calls} allocations issued legacy-stream "
                        f"operations: more fences than one per {FENCE_BLOCKS} released blocks ({released} released, "
                        f"so at most {released // FENCE_BLOCKS}); the first: {allocations.examples}")
    return problems


def assert_legacy_cost(p: Program, fences: bool = True) -> None:
    """:raises AssertionError: listing :func:`legacy_cost_problems` of ``p``'s run so far, with
    the figures."""
    cost = p.model.legacy_cost()
    problems = legacy_cost_problems(cost, fences)
    assert not problems, "\n".join(problems) + "\n" + str(cost)
