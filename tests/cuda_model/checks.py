"""Checks shared by the tests that run programs on the CUDA model (``tests/allocator``)."""

from __future__ import annotations

from .harness import Program

#: The warning of rule 8's fallback, the only one a program may see.
FALLBACK = "synchronized the device instead"


def eager(p: Program) -> None:
    """Arena mode: fence before every legacy allocation that finds quarantined blocks, keep no
    ready cache, so that a freed block is handed out by the very next allocation."""
    arena = p.mm.allocator.arena
    if arena is not None:
        arena.quarantine_limit = -1
        arena.quarantine.cache_limit = 0


def assert_clean(p: Program) -> None:
    assert p.model.violations == [], "\n".join(map(str, p.model.violations))
    p.check()


def assert_no_fallback(p: Program) -> None:
    """Every release was ordered on the device: none fell back to rule 8's synchronize."""
    assert not any(FALLBACK in str(w.message) for w in p.warnings), [str(w.message) for w in p.warnings]
