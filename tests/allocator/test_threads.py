"""The GIL check: the release path's lock-free steps rely on CPython's global interpreter lock
(numba_pool/allocator/__init__.py, "Threads"), so a process running without it is refused with
one line, by install() and by the plugin itself.  A free-threaded Python is not available to CI:
its ``sys._is_gil_enabled()`` is stood in for."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

import numba_pool
from numba_pool.allocator import threads

from cuda_model.harness import Program


def test_a_standard_build_and_a_free_threaded_one_with_its_gil_pass():
    assert threads.gil_enabled(SimpleNamespace())  # no _is_gil_enabled: a standard build
    assert threads.gil_enabled(SimpleNamespace(_is_gil_enabled=lambda: True))
    threads.require_gil(SimpleNamespace(_is_gil_enabled=lambda: True))


def test_a_free_threaded_build_without_its_gil_is_refused_in_one_line():
    free_threaded = SimpleNamespace(_is_gil_enabled=lambda: False)
    assert not threads.gil_enabled(free_threaded)
    with pytest.raises(RuntimeError) as caught:
        threads.require_gil(free_threaded)
    message = str(caught.value)
    assert message == threads.NO_GIL and "\n" not in message
    assert "PYTHON_GIL=0" in message and "PYTHON_GIL=1" in message


@pytest.fixture
def without_the_gil(monkeypatch):
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)


def test_install_refuses_a_process_without_the_gil(without_the_gil):
    with pytest.raises(RuntimeError, match="without the global interpreter lock"):
        numba_pool.install()


def test_the_plugin_refuses_to_initialize_without_the_gil(monkeypatch):
    program = Program(arena=True)
    try:
        program.mm.reset()
        monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
        with pytest.raises(RuntimeError, match="without the global interpreter lock"):
            program.mm.memalloc(256)
        assert program.mm.allocator is None  # nothing half-made
        monkeypatch.undo()
        program.mm.memalloc(256).free()  # with the GIL back, it initializes
    finally:
        program.close()
