"""Pickles that CPython's unpickler cannot survive, though they name no class: a few bytes that make
it allocate gigabytes, run for ever or crash, before any check of what it built can run.
``numba-pool-tools snapshot summarize`` and ``plot`` unpickle a file in a throwaway child first
(:mod:`numba_pool_tools.snapshot.unpickle`), so each is one line and exit status 2, within
test_snapshot_files' bounds on time and memory, and the tool survives."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from helpers import PACKAGE_PARENT, check_one_line_error
from numba_pool_tools.snapshot import unpickle
from test_snapshot_files import read, rejected, snapshot

LINUX = sys.platform.startswith("linux")


def memo_put(index: int) -> bytes:
    """``None``, then LONG_BINPUT at ``index``: the unpickler sizes its memo table to twice it."""
    return b"N" + b"r" + index.to_bytes(4, "little") + b"."


@pytest.mark.skipif(not LINUX, reason="the child's memory is bounded where Linux tells its size (RLIMIT_AS)")
def test_a_memo_index_of_a_quarter_billion_in_seven_bytes(tmp_path):
    """4 GiB and 20 s in the issue's time; refused at the child's 128 MiB."""
    rejected(tmp_path, "summarize", memo_put(1 << 28),
             "not read: unpickling it takes more than 128 MiB of memory, the most for a file of 7 bytes")


def test_a_memo_index_within_the_bound_is_unpickled_here_too(tmp_path):
    """A 32 MB memo table: the child finished, so this process unpickles it, within the bound too."""
    rejected(tmp_path, "summarize", memo_put(1 << 21), "the pickle holds None, not a dict")


def shared_tuples_as_a_key(doublings: int) -> bytes:
    """A dict whose key is a tuple of a tuple (shared) of ... the empty tuple: ``2**doublings`` steps to hash."""
    build = b")q\x01" + b"0h\x01h\x01\x86q\x01" * doublings  # each: POP, the last twice, TUPLE2, BINPUT
    return b"\x80\x02}" + build + b"Ns."  # EMPTY_DICT, the key, None, SETITEM


def test_forty_tuples_hashed_two_to_the_forty_times(tmp_path, monkeypatch):
    """About 300 bytes; the unpickler never returns (it hashes in C, where no signal handler runs)."""
    monkeypatch.setattr(unpickle, "SECONDS_FLOOR", 0.5)
    data = shared_tuples_as_a_key(40)
    assert len(data) < 350
    for command in ("summarize", "plot"):
        rejected(tmp_path, command, data, f"not read: unpickling it takes more than 0.5 s, the most for a file "
                                          f"of {len(data)} bytes")


def nested_tuple_as_a_key(depth: int) -> bytes:
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"Ns."  # EMPTY_DICT, () in TUPLE1 depth times, None, SETITEM


#: What a tuple key nested a million deep gets: the crash, in the child; or, where the stack is large
#: enough for the hash (``ulimit -s unlimited``), the dict it makes, which is no snapshot.
CRASHED_OR_NO_SNAPSHOT = ("not read: unpickling it crashes the interpreter (SIGSEGV: a structure nested too deep?)",
                          "no 'segments' key (its keys: (")


def test_a_tuple_key_nested_a_million_deep(tmp_path):
    """The hash recurses in C and the interpreter crashes (SIGSEGV); the child's, not this one."""
    path = tmp_path / "deep.pickle"
    path.write_bytes(nested_tuple_as_a_key(1_000_000))
    from test_snapshot_cli import invoke

    result = invoke("summarize", str(path))
    assert result.exit_code == 2
    line = check_one_line_error(result.stderr, result.stdout, f"{path}: ")
    assert any(words in line for words in CRASHED_OR_NO_SNAPSHOT), line


def test_the_childs_crash_report_does_not_reach_the_user(tmp_path):
    """In a real process with faulthandler on: the child's report of its crash goes nowhere."""
    path = tmp_path / "deep.pickle"
    path.write_bytes(nested_tuple_as_a_key(1_000_000))
    proc = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "numba_pool_tools", "snapshot", "summarize",
                           str(path)], cwd=PACKAGE_PARENT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    line = check_one_line_error(proc.stderr, proc.stdout, f"{path}: ")
    assert any(words in line for words in CRASHED_OR_NO_SNAPSHOT), line


def test_a_child_that_fails_before_unpickling_is_one_line(tmp_path, monkeypatch):
    """Were the child's set-up to fail, the file is refused: never unpickled here unbounded."""
    def broken(*_) -> None:
        raise OSError("no /dev/null")

    monkeypatch.setattr(unpickle, "_silenced", broken)
    rejected(tmp_path, "summarize", pickle.dumps(snapshot()), "not read: the process to unpickle it in first, "
                                                              "within bounds, failed (exit status 4)")


def test_a_fork_that_fails_is_one_line(tmp_path, monkeypatch):
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    rejected(tmp_path, "summarize", pickle.dumps(snapshot()), "not read: cannot start the process to unpickle it in "
                                                              "first, within bounds (Resource temporarily unavailable)")


def test_without_fork_the_bytes_are_unpickled_here(tmp_path, monkeypatch):
    """Windows: no child, the bound on the file's size only; the same answers otherwise."""
    monkeypatch.delattr(os, "fork")
    read(tmp_path, "summarize", pickle.dumps(snapshot()))
    rejected(tmp_path, "summarize", pickle.dumps({"segments": [{"device": 0, "total_size": -1, "blocks": []}]}),
             "segments[0].total_size is an int (-1)")
