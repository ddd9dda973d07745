"""Lock-step turns between bench workers (numba_pool/bench_turns.py), with real processes: the
protocol needs no GPU, so CI runs it for real."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from numba_pool import bench, cli
from numba_pool.bench_turns import TURNS_VARIABLE, Turn, run_in_turns

WORKER = """
import json, sys, time
from numba_pool.bench_turns import worker_turn
turn = worker_turn()
turn.begin()
blocks = []
phases = [int(p) for p in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
try:
    for i in range(int(sys.argv[2])):
        if phases and phases[i] != (phases[i - 1] if i else 0):
            turn.enter_phase(phases[i])
        if sys.argv[3] == "die" and i == 1:
            sys.exit(3)
        if sys.argv[3] == "hang" and i == 1:
            time.sleep(60)
        blocks.append([sys.argv[1], i, time.monotonic_ns(), phases[i] if phases else 0])
        turn.pass_turn()
    print(json.dumps(blocks))
finally:
    turn.end()
if sys.argv[3] == "slow-exit":
    time.sleep(0.5)
    sys.stderr.write(f"exited {time.monotonic_ns()}\\n")
"""


def commands(tmp_path, *workers):
    script = tmp_path / "turn_worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return {name: ([sys.executable, str(script), name, str(blocks), how, *phases], env, str(tmp_path))
            for name, blocks, how, *phases in workers}


def test_workers_take_turns_block_by_block_and_the_longer_one_finishes_alone(tmp_path):
    outcomes = run_in_turns(commands(tmp_path, ("a", 4, "ok"), ("b", 2, "ok"), ("c", 3, "ok")))
    assert {label: o.status for label, o in outcomes.items()} == {"a": 0, "b": 0, "c": 0}
    assert all(o.took_turns for o in outcomes.values())
    blocks = sorted((b for o in outcomes.values() for b in json.loads(o.stdout)), key=lambda b: b[2])
    assert [(name, i) for name, i, *_ in blocks] == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1),
                                                    ("a", 2), ("c", 2), ("a", 3)]
    assert all(o.busy_s > 0 for o in outcomes.values())


def test_each_phase_is_timed_by_the_workers_that_have_it_taking_turns_among_themselves(tmp_path):
    # a: cuda.device_array, pinned, pipeline; b (an anchor): device_array then pipeline; c (a floor):
    # device_array only.  b's pipeline must wait until a has left the pinned phase.
    outcomes = run_in_turns(commands(tmp_path, ("a", 6, "ok", "0,0,1,1,2,2"), ("b", 4, "ok", "0,0,2,2"),
                                     ("c", 3, "ok", "0,0,0")))
    assert all(o.status == 0 for o in outcomes.values())
    blocks = sorted((b for o in outcomes.values() for b in json.loads(o.stdout)), key=lambda b: b[2])
    assert [(name, phase) for name, _, _, phase in blocks] == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 0), ("b", 0), ("c", 0), ("c", 0),
        ("a", 1), ("a", 1), ("b", 2), ("a", 2), ("b", 2), ("a", 2)]


def test_a_worker_that_dies_leaves_the_others_to_finish(tmp_path):
    outcomes = run_in_turns(commands(tmp_path, ("a", 3, "ok"), ("b", 3, "die")))
    assert outcomes["b"].status == 3 and outcomes["a"].status == 0
    assert [i for _, i, *_ in json.loads(outcomes["a"].stdout)] == [0, 1, 2]


def test_a_worker_that_keeps_the_turn_too_long_is_killed_and_named(tmp_path):
    start = time.monotonic()
    outcomes = run_in_turns(commands(tmp_path, ("a", 2, "ok"), ("b", 3, "hang")), turn_timeout_s=2)
    assert time.monotonic() - start < 30
    assert outcomes["a"].status == 0 and outcomes["b"].status != 0
    assert "bench: b: killed: held its turn longer than 2 s" in outcomes["b"].stderr


def test_a_worker_has_exited_before_the_next_turn_is_given(tmp_path):
    # Its teardown (the interpreter's, CUDA's) runs on the shared core: it must not overlap a
    # block of another worker.
    outcomes = run_in_turns(commands(tmp_path, ("a", 1, "slow-exit"), ("b", 4, "ok")))
    exited = int(outcomes["a"].stderr.split("exited ")[1].split()[0])
    later = [t for _, i, t, _ in json.loads(outcomes["b"].stdout) if i >= 1]
    assert later and all(t > exited for t in later)


def test_a_worker_that_takes_no_turns_is_told_apart(tmp_path):
    (tmp_path / "alone.py").write_text("print('[]')\n")
    cmds = commands(tmp_path, ("a", 2, "ok"))
    cmds["old"] = ([sys.executable, str(tmp_path / "alone.py")], cmds["a"][1], str(tmp_path))
    outcomes = run_in_turns(cmds)
    assert outcomes["old"].status == 0 and not outcomes["old"].took_turns and outcomes["a"].took_turns


def test_a_worker_that_cannot_start_stops_the_ones_already_started(tmp_path):
    cmds = commands(tmp_path, ("a", 2, "ok"))
    cmds["missing"] = (["/nonexistent/python"], cmds["a"][1], str(tmp_path))
    with pytest.raises(FileNotFoundError):
        run_in_turns(cmds)
    with pytest.raises(ChildProcessError):  # "a" was killed and reaped: no child is left
        os.waitpid(-1, os.WNOHANG)


def test_without_the_variable_a_worker_runs_alone_and_a_bad_value_is_named():
    turn = Turn({})
    assert not turn.active
    turn.begin(), turn.pass_turn(), turn.end()  # no-ops
    with pytest.raises(ValueError, match=rf"{TURNS_VARIABLE}='3': expected two file descriptors"):
        Turn({TURNS_VARIABLE: "3"})


def test_the_bench_takes_a_round_in_turns_and_an_anchor_that_failed_is_a_note(monkeypatch, capsys):
    from numba_pool import anchors

    asked = []

    def measure_round(managers, core):
        asked.append(([m.label for m in managers], core))
        return {m.label: (RuntimeError("benchmark of cupy (pool) failed: exit 1:\nImportError: no cupy")
                          if m.label == "cupy (pool)" else {"seed_loop_ms": 1.0}, 2.0) for m in managers}

    monkeypatch.setattr(bench, "measure_round", measure_round)
    monkeypatch.setattr(anchors, "installed", lambda label: True)
    managers = [bench.DEFAULT, bench.NUMBA_POOL, bench.CUPY]
    notes = []
    measured = cli._one_round(managers, 4, notes, "round 1/1", turns=True)
    assert asked == [(["default", "numba_pool", "cupy (pool)"], 4)]
    assert list(measured) == ["default", "numba_pool"] and measured["default"] == ({"seed_loop_ms": 1.0}, 2.0)
    assert [m.label for m in managers] == ["default", "numba_pool"] and "cupy (pool)" in notes[0]
    assert "taking turns" in capsys.readouterr().err
