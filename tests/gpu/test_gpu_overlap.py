"""Streams that wait for each other while the program allocates and drops arrays (issue 33): a
kernel on one ``cuda.stream()`` spins until a flag in device memory is set, meanwhile the program
drops and allocates arrays, then sets the flag from a second ``cuda.stream()``.  Under Numba's
default manager this finishes; numba_pool must not make it wait forever, in either mode, with the
drops and allocations inside ``cuda.defer_cleanup()`` or not.

Why it could hang: an operation on the legacy default stream waits for all earlier work on every
blocking stream, and all later work on every blocking stream waits for it (every ``cuda.stream()``
of Numba is blocking).  An allocation or a release that enqueues one during the spin waits for
the spinning kernel; the flag's copy on the second stream then waits behind it; the kernel waits
for the copy.

A failure is a hang, so each pattern runs in a child process (``NUMBA_CUDA_MEMORY_MANAGER``,
``NUMBA_POOL_ARENA`` as the run has it), killed after :data:`TIMEOUT_S` seconds with a message
saying so; and the spinning kernel has its own escape: it gives up after :data:`ESCAPE_SLEEPS`
sleeps of about 1 µs (5-10 s) and says whether it saw the flag or gave up, so even a deadlock
through the GPU ends and is reported as such.  The control
(:func:`test_control_a_legacy_stream_operation_during_the_spin_makes_the_escape_fire`) enqueues
one operation on the legacy stream itself during the spin and sees the escape fire: the check
can fail.

Run in both modes: ``pytest -m gpu`` and ``NUMBA_POOL_ARENA=1 pytest -m gpu``.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import CUDA_IMPORT, run_python

pytestmark = pytest.mark.gpu

TIMEOUT_S = 90  # a child: Python, the context, two kernels compiled (Numba-CUDA-MLIR: longer), the escape
ESCAPE_SLEEPS = 5_000_000  # the spinning kernel gives up after this many cuda.nanosleep(1000): 5-10 s
NUMBA_POOL = {"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"}
DEFAULT = {"NUMBA_CUDA_MEMORY_MANAGER": "default"}

#: The child's program: ``pattern(scenario, cleanup, control)`` returns what happened.
#:
#: * ``scenario="release"`` (the issue's pattern): drop arrays of every kind made before the spin
#:   (device arrays of 256 B, 64 KiB, 1 MiB and 16 MiB, one allocated with ``stream=``, a pinned
#:   and a managed array), allocate as many again and drop one of them; then the flag's copy on
#:   the second stream, then the spinning stream synchronized.  ``cleanup``: ``"inside"`` (all of
#:   it inside ``cuda.defer_cleanup()``), ``"exited"`` (the drops and allocations inside, the
#:   scope left before the flag is set), ``"none"``.  Eight drops at most, so that Numba's own
#:   manager holds them all back (it carries out its frees, which wait for the device, at the
#:   eleventh).
#: * ``scenario="overlap"``: an allocation on the second stream and a drop between the spinning
#:   kernel's launch and the launch of a kernel on the second stream that uses the new array and
#:   sets the flag: the two kernels must run at once.
#: * ``control="legacy"``: an event recorded on the legacy stream during the spin, just before
#:   the flag is set: the flag then waits for the spinning kernel, whose escape must fire.
PROGRAM = CUDA_IMPORT + """
import contextlib, json, time
import numpy as np
from cuda.bindings import driver as cu

LIMIT = %d
MiB = 1 << 20
SIZES = [256, 64 << 10, MiB, 16 * MiB]  # bytes of the device arrays
KINDS = [f"device_array of {n} B" for n in SIZES] + ["device_array with stream=", "pinned_array", "managed_array"]


@cuda.jit
def wait_for_flag(flag, limit, result):
    # One thread spins until flag[0] is set: an atomic read each time (the compiler cannot hoist
    # it out of the loop), a sleep of about 1 us between reads.  After `limit` sleeps it gives
    # up, its escape; result[0] says which: 1, the flag seen; 0, gave up.  result[1]: sleeps.
    steps = 0
    seen = 0
    while steps < limit:
        if cuda.atomic.add(flag, 0, 0) != 0:
            seen = 1
            break
        cuda.nanosleep(1000)
        steps += 1
    result[0] = seen
    result[1] = steps


@cuda.jit
def set_flag(flag, scratch):
    scratch[0] = 1.0  # the array allocated between the launches, used
    cuda.atomic.add(flag, 0, 1)


slow = []  # host steps during the spin that took over half a second: [what, seconds]


def timed(what, step):
    start = time.perf_counter()
    value = step()
    took = time.perf_counter() - start
    if took > 0.5:
        slow.append([what, round(took, 2)])
    return value


def arrays(stream):
    # One array of each of KINDS, in that order.
    made = [timed(KINDS[i], lambda n=n: cuda.device_array(n, dtype=np.uint8)) for i, n in enumerate(SIZES)]
    made.append(timed(KINDS[4], lambda: cuda.device_array(MiB, dtype=np.uint8, stream=stream)))
    made.append(timed(KINDS[5], lambda: cuda.pinned_array(MiB, dtype=np.uint8)))
    made.append(timed(KINDS[6], lambda: cuda.managed_array(MiB, dtype=np.uint8)))
    return made


def drop(held, index, what):
    start = time.perf_counter()
    del held[index]  # the last reference: released here
    took = time.perf_counter() - start
    if took > 0.5:
        slow.append([f"drop of a {what}", round(took, 2)])


def pattern(scenario, cleanup="none", control=""):
    manager = type(cuda.current_context().memory_manager).__name__
    spinning, other = cuda.stream(), cuda.stream()
    flag = cuda.to_device(np.zeros(1, dtype=np.int64))
    result = cuda.to_device(np.zeros(2, dtype=np.int64))
    scratch = cuda.device_array(1, dtype=np.float32)
    ones = np.ones(1, dtype=np.int64)
    # Both kernels compiled and loaded before the spin: a kernel loaded lazily at its first
    # launch during the spin could wait for the spinning one.
    set_flag[1, 1, other](flag, scratch)
    wait_for_flag[1, 1, spinning](flag, LIMIT, result)
    cuda.synchronize()
    flag.copy_to_device(np.zeros(1, dtype=np.int64))
    err, event = cu.cuEventCreate(0)
    assert not err, err
    before = arrays(other)
    for owner in (cuda.current_context(), cuda.current_context().memory_manager):
        pending = getattr(owner, "deallocations", None)
        if pending is not None:
            pending.clear()  # Numba's held-back frees: none left from before
    cuda.synchronize()

    def legacy_operation():
        if control == "legacy":
            (err,) = cu.cuEventRecord(event, cu.CUstream(cu.CU_STREAM_LEGACY))
            assert not err, err

    def set_and_wait():
        legacy_operation()
        timed("flag.copy_to_device on the second stream", lambda: flag.copy_to_device(ones, stream=other))
        timed("synchronize the spinning stream", spinning.synchronize)

    start = time.perf_counter()
    wait_for_flag[1, 1, spinning](flag, LIMIT, result)
    if scenario == "release":
        with cuda.defer_cleanup() if cleanup != "none" else contextlib.nullcontext():
            for index in reversed(range(len(before))):  # every array made before the spin
                drop(before, index, KINDS[index])
            fresh = arrays(other)
            drop(fresh, 2, "new " + KINDS[2])
            if cleanup == "inside":
                set_and_wait()
        if cleanup != "inside":
            set_and_wait()
    elif scenario == "scratch":
        import numba_pool
        with numba_pool.using_stream(other), numba_pool.scratch(1 << 16):
            held = [cuda.device_array(1024, dtype=np.float32)]
        numba_pool.record_stream(held[0], spinning)
        drop(held, 0, "scratch array recorded on the spinning stream")
        if control == "wait":  # what its drop did before: the second stream waits for the spinning one
            handle = lambda s: cu.CUstream(int(getattr(s.handle, "value", s.handle)))
            assert not cu.cuEventRecord(event, handle(spinning))[0]
            assert not cu.cuStreamWaitEvent(handle(other), event, 0)[0]
        set_and_wait()
    else:
        temporary = timed("device_array with stream=", lambda: cuda.device_array(MiB // 4, dtype=np.float32,
                                                                                   stream=other))
        drop(before, 2, KINDS[2])
        legacy_operation()
        timed("the second stream's kernel's launch", lambda: set_flag[1, 1, other](flag, temporary))
        timed("synchronize the spinning stream", spinning.synchronize)
    other.synchronize()
    seconds = time.perf_counter() - start
    seen, steps = (int(v) for v in result.copy_to_host())
    return {"manager": manager, "seen": seen, "steps": steps, "limit": LIMIT, "slow": slow,
            "seconds": round(seconds, 3)}
""" % ESCAPE_SLEEPS


def run_pattern(env: dict, *args: str) -> dict:
    """``pattern(*args)`` in a child process under ``env``; what it returned.  Fails the test,
    saying so, when the child does not finish in :data:`TIMEOUT_S` seconds or fails."""
    code = PROGRAM + f"\nprint(json.dumps(pattern(*{args!r})))\n"
    try:
        proc = run_python(code, env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"deadlock: pattern{args} under {env} did not finish in {TIMEOUT_S} s (killed), although the "
                    f"spinning kernel gives up after {ESCAPE_SLEEPS} sleeps: the host is stuck", pytrace=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_the_flag_was_seen(facts: dict, env: dict) -> None:
    manager = {"numba_pool": "NumbaPoolManager"}.get(env["NUMBA_CUDA_MEMORY_MANAGER"])
    if manager:
        assert facts["manager"] == manager, facts
    assert facts["seen"] == 1, (f"the spinning kernel gave up after {facts['steps']} sleeps ({facts['seconds']} s): "
                                "the flag set from the second stream waited for it, so something was ordered on the "
                                f"legacy stream during the spin; host steps that took over 0.5 s: {facts['slow']}")


@pytest.mark.parametrize("cleanup", ["inside", "exited", "none"])
def test_a_kernel_waiting_for_another_streams_copy_while_arrays_are_dropped_and_allocated_finishes(cleanup):
    """The issue's pattern under numba_pool, in the run's mode: drops and allocations during the
    spin inside ``defer_cleanup`` (the flag set inside the scope, or after it was left) and
    without it."""
    facts = run_pattern(NUMBA_POOL, "release", cleanup)
    print(f"spin and release ({cleanup} defer_cleanup): flag seen after {facts['steps']} sleeps, {facts['seconds']} s")
    assert_the_flag_was_seen(facts, NUMBA_POOL)


def test_kernels_on_two_streams_run_at_once_across_an_allocation_and_a_drop():
    """What issue 33 asks: numba_pool's allocation on stream B and a drop, made between a launch on
    stream A and a launch on B, do not order B's later kernel after A's earlier one (A's kernel
    waits for B's)."""
    facts = run_pattern(NUMBA_POOL, "overlap")
    assert_the_flag_was_seen(facts, NUMBA_POOL)


@pytest.mark.parametrize("scenario, cleanup", [("release", "inside"), ("release", "exited"), ("release", "none"),
                                               ("overlap", "none")])
def test_the_same_patterns_finish_under_numbas_default_manager(scenario, cleanup):
    """The reference: the program itself needs nothing on the legacy stream (Numba's default
    manager holds its frees back, and ``cuMemAlloc`` is no stream operation)."""
    facts = run_pattern(DEFAULT, scenario, cleanup)
    assert_the_flag_was_seen(facts, DEFAULT)


def test_a_scratch_array_recorded_on_the_waiting_stream_and_dropped_makes_nothing_wait():
    """``record_stream`` on an array carved from a ``scratch`` block of the second stream, naming the spinning stream,
    then the array dropped during the spin: the second stream must not wait for the spinning one (the host sees the
    event done instead), so the flag's copy runs.  The control makes the second stream wait, as the drop once did."""
    facts = run_pattern(NUMBA_POOL, "scratch")
    assert_the_flag_was_seen(facts, NUMBA_POOL)
    control = run_pattern(NUMBA_POOL, "scratch", "none", "wait")
    assert control["seen"] == 0 and control["steps"] == ESCAPE_SLEEPS, control


@pytest.mark.parametrize("scenario", ["release", "overlap"])
def test_control_a_legacy_stream_operation_during_the_spin_makes_the_escape_fire(scenario):
    """The control: the same patterns under numba_pool with one event recorded on the legacy
    stream during the spin (``cuEventRecord(event, CU_STREAM_LEGACY)``).  The flag's copy or
    kernel on the second, blocking stream then waits for that event, which waits for the spinning
    kernel: the kernel never sees the flag and its escape fires.  So the tests above would fail if
    numba_pool enqueued anything on the legacy stream during the spin."""
    facts = run_pattern(NUMBA_POOL, scenario, "none", "legacy")
    assert facts["seen"] == 0 and facts["steps"] == ESCAPE_SLEEPS, facts
