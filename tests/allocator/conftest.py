"""The ``programs`` fixture of the allocator's tests on the CUDA model."""

from __future__ import annotations

import pytest

from cuda_model.checks import FALLBACK
from cuda_model.harness import Program


@pytest.fixture
def programs(frontend_name):
    """``make(**options)`` builds a :class:`Program`, its manager on each frontend's classes in
    turn (the test runs once per frontend); every one is closed at the end, last first,
    and then must have seen no warning but the documented fallback's (a Program's record of
    warnings is complete only once it is closed) and no exception in a release."""
    made: list[Program] = []

    def make(**options) -> Program:
        options.setdefault("frontend", frontend_name)
        p = Program(**options)
        made.append(p)
        return p

    yield make
    closed = []
    while made:
        p = made.pop()
        p.close()
        closed.append(p)
    for p in closed:
        unexpected = [str(w.message) for w in p.warnings if FALLBACK not in str(w.message)]
        assert unexpected == [] and p.problems == [], (unexpected, p.problems)
