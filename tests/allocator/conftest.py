"""The ``programs`` fixture of the allocator's tests on the CUDA model, and ``no_capture_left``."""

from __future__ import annotations

import pytest

from cuda_model.checks import FALLBACK
from cuda_model.harness import Program
from numba_pool.allocator import captures


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


@pytest.fixture
def no_capture_left():
    """After the test, no capture numba_pool knows of and no release it held back (rule 13): a capture a failed
    test left under way would hold back the next tests' releases."""
    yield
    captures.underway.clear()
    captures._deferred.take()
