"""Lock-step turns between bench workers (tools/numba_pool_tools/bench/turns.py), with real processes: the
protocol needs no GPU, so CI runs it for real."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from numba_pool_tools.bench import anchors, end_to_end, timing, turns
from numba_pool_tools.bench import report as bench_report
from numba_pool_tools.bench.turns import TURNS_VARIABLE, Turn, parse_cpulist, run_in_turns, startup_cores

WORKER = """
import json, os, sys, threading, time
from numba_pool_tools.bench import turns
from numba_pool_tools.bench.turns import worker_turn
turn = worker_turn()
if sys.argv[3] == "old-slow-exit":  # a worker from before QUIT: says r, exits as soon as it is done
    turns.READY = turns.READY_EXITS_AT_ONCE
    turn.end = lambda: os.write(turn._fds[1], turns.EXIT)
helper = threading.Thread(target=time.sleep, args=(60,), daemon=True)  # as numpy's BLAS threads
helper.start()
affinity = {"start": sorted(os.sched_getaffinity(0))}
turn.begin(int(os.environ["CORE"]) if "CORE" in os.environ else None)
affinity["turn"] = sorted(os.sched_getaffinity(0))
affinity["helper in turn"] = sorted(os.sched_getaffinity(helper.native_id))
blocks = []
phases = [int(p) for p in sys.argv[4].split(",")] if len(sys.argv) > 4 else None
try:
    for i in range(int(sys.argv[2])):
        if phases and phases[i] != (phases[i - 1] if i else 0):
            turn.enter_phase(phases[i])
        if sys.argv[3] == "die" and i == 1:
            sys.exit(3)
        if sys.argv[3] == "slow-death" and i == 1:  # its pipe closes at once, its teardown takes 0.5 s
            os.close(turn._fds[0]), os.close(turn._fds[1])
            time.sleep(0.5)
            sys.stderr.write(f"exited {time.monotonic_ns()}\\n")
            os._exit(3)
        if sys.argv[3] == "hang" and i == 1:
            time.sleep(60)
        if sys.argv[3] == "slow-blocks":
            time.sleep(0.3)
        blocks.append([sys.argv[1], i, time.monotonic_ns(), phases[i] if phases else 0])
        turn.pass_turn()
    print(json.dumps(blocks))
finally:
    turn.end()
affinity["end"] = sorted(os.sched_getaffinity(0))
affinity["helper at end"] = sorted(os.sched_getaffinity(helper.native_id))
sys.stderr.write(json.dumps(affinity) + "\\n")
if sys.argv[3].endswith("slow-exit"):
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


def test_a_done_worker_exits_only_after_every_worker_is_done(tmp_path):
    # Its teardown (the interpreter's, CUDA's) must not overlap a block of another worker;
    # the teardowns of a round run at once, after its last block.
    outcomes = run_in_turns(commands(tmp_path, ("a", 1, "slow-exit"), ("b", 4, "slow-blocks"), ("c", 1, "slow-exit")))
    exited = [int(outcomes[w].stderr.split("exited ")[1].split()[0]) for w in ("a", "c")]
    blocks = [t for _, i, t, _ in json.loads(outcomes["b"].stdout)]
    assert all(o.status == 0 for o in outcomes.values()) and min(exited) > max(blocks)


def test_a_worker_from_before_quit_has_exited_before_the_next_turn_is_given(tmp_path):
    outcomes = run_in_turns(commands(tmp_path, ("a", 1, "old-slow-exit"), ("b", 4, "ok")))
    exited = int(outcomes["a"].stderr.split("exited ")[1].split()[0])
    later = [t for _, i, t, _ in json.loads(outcomes["b"].stdout) if i >= 1]
    assert outcomes["a"].took_turns and later and all(t > exited for t in later)


def test_workers_start_on_the_node_s_cores_time_on_one_and_leave_on_the_node_s_again(tmp_path):
    allowed = os.sched_getaffinity(0)
    core = max(allowed)
    cmds = {label: (argv, {**env, "CORE": str(core)}, cwd)
            for label, (argv, env, cwd) in commands(tmp_path, ("a", 2, "ok"), ("b", 1, "ok")).items()}
    outcomes = run_in_turns(cmds, core)
    startup = sorted(startup_cores(core, allowed))
    for outcome in outcomes.values():
        affinity = json.loads(outcome.stderr.strip().splitlines()[-1])
        assert affinity == {"start": startup, "turn": [core], "helper in turn": [core], "end": startup,
                            "helper at end": startup}


def test_a_worker_from_before_quit_is_pinned_by_the_parent(tmp_path):
    core = max(os.sched_getaffinity(0))
    outcomes = run_in_turns(commands(tmp_path, ("old", 2, "old-slow-exit")), core)
    affinity = json.loads(outcomes["old"].stderr.strip().splitlines()[-2])
    assert affinity["turn"] == [core] and affinity["helper in turn"] == [core]


def test_a_worker_that_dies_has_exited_before_the_next_turn_is_given(tmp_path):
    outcomes = run_in_turns(commands(tmp_path, ("a", 3, "slow-death"), ("b", 4, "ok")))
    exited = int(outcomes["a"].stderr.split("exited ")[1].split()[0])
    later = [t for _, i, t, _ in json.loads(outcomes["b"].stdout) if i >= 2]
    assert outcomes["a"].status == 3 and later and all(t > exited for t in later)


def test_startup_cores_are_the_allowed_ones_of_the_core_s_node(tmp_path):
    for node, cpulist in (("node0", "0-3\n"), ("node1", "4-5,7\n"), ("has_memory", "0-7\n")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpulist)
    assert startup_cores(5, set(range(8)), str(tmp_path)) == {4, 5, 7}
    assert startup_cores(5, {5, 7, 1}, str(tmp_path)) == {5, 7}
    assert startup_cores(2, {0, 2}, str(tmp_path)) == {0, 2}
    assert startup_cores(6, set(range(8)), str(tmp_path)) == {6}  # in no node's list
    assert startup_cores(3, {3}, str(tmp_path / "missing")) == {3}
    (tmp_path / "node0" / "cpulist").write_text("zero-three")
    assert startup_cores(1, {1, 2}, str(tmp_path)) == {1}


def test_cpu_lists_read_as_linux_writes_them():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11} and parse_cpulist("\n") == set()
    with pytest.raises(ValueError):
        parse_cpulist("0-x")


def test_a_worker_that_takes_no_turns_is_told_apart(tmp_path):
    (tmp_path / "alone.py").write_text("print('[]')\n")
    cmds = commands(tmp_path, ("a", 2, "ok"))
    cmds["old"] = ([sys.executable, str(tmp_path / "alone.py")], cmds["a"][1], str(tmp_path))
    outcomes = run_in_turns(cmds)
    assert outcomes["old"].status == 0 and not outcomes["old"].took_turns and outcomes["a"].took_turns


def children() -> set[int]:
    """This process's child processes, zombies included (Linux's ``/proc``): those that tests
    run earlier in the same process left behind are there too, so compare before and after."""
    pid = os.getpid()
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found.update(map(int, f.read().split()))
    return found


def test_a_worker_that_cannot_start_stops_the_ones_already_started(tmp_path):
    cmds = commands(tmp_path, ("a", 2, "ok"))
    cmds["missing"] = (["/nonexistent/python"], cmds["a"][1], str(tmp_path))
    before = children()
    with pytest.raises(FileNotFoundError):
        run_in_turns(cmds)
    assert children() <= before  # "a" was killed and reaped: no child of this test is left


def test_the_child_count_sees_a_child_until_it_is_reaped():
    import subprocess

    before = children()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert children() - before == {proc.pid}  # running, then a zombie until waited for
    proc.wait()
    assert children() <= before


def test_without_the_variable_a_worker_runs_alone_and_a_bad_value_is_named():
    turn = Turn({})
    assert not turn.active
    turn.begin(), turn.pass_turn(), turn.end()  # no-ops
    with pytest.raises(ValueError, match=rf"{TURNS_VARIABLE}='3': expected two file descriptors"):
        Turn({TURNS_VARIABLE: "3"})


def test_the_bench_takes_a_round_in_turns_and_an_anchor_that_failed_is_a_note(monkeypatch, capsys):
    asked = []

    def measure_round(managers, core, warm_up=False):
        asked.append(([m.label for m in managers], core, warm_up))
        return {m.label: (RuntimeError("benchmark of cupy (pool) failed: exit 1:\nImportError: no cupy")
                          if m.label == "cupy (pool)" else {"seed_loop_ms": 1.0}, 2.0) for m in managers}

    monkeypatch.setattr(end_to_end, "measure_round", measure_round)
    monkeypatch.setattr(anchors, "installed", lambda label: True)
    managers = [end_to_end.DEFAULT, end_to_end.NUMBA_POOL, end_to_end.CUPY]
    notes = []
    measured = bench_report.one_round(managers, 4, notes, "round 1/1", turns=True)
    assert asked == [(["default", "numba_pool", "cupy (pool)"], 4, False)]
    assert list(measured) == ["default", "numba_pool"] and measured["default"] == ({"seed_loop_ms": 1.0}, 2.0)
    assert [m.label for m in managers] == ["default", "numba_pool"] and "cupy (pool)" in notes[0]
    assert "taking turns" in capsys.readouterr().err


def test_a_warm_up_round_in_turns_asks_every_worker_for_one_repeat(monkeypatch):
    seen = {}

    def run_in_turns(commands, core):
        seen.update({label: env for label, (argv, env, cwd) in commands.items()})
        return {}

    monkeypatch.setattr(turns, "run_in_turns", run_in_turns)
    end_to_end.measure_round([end_to_end.DEFAULT, end_to_end.NUMBA_POOL], 3, warm_up=True)
    repeats = {label: env.get(timing.REPEATS_VARIABLE) for label, env in seen.items()}
    assert repeats == {"default": "1", "numba_pool": "1"}
    end_to_end.measure_round([end_to_end.DEFAULT], 3)
    assert timing.REPEATS_VARIABLE not in seen["default"] and seen["default"][timing.CORE_VARIABLE] == "3"
