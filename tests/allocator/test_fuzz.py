"""The fuzzer: random legal programs run by numba_pool's real manager on the CUDA model.

A hypothesis state machine mixes blocking, non-blocking and destroyed streams (their handles
reused by the next new stream, also while releases are held back), with the allocation path bare
or with both adaptors (the allocation log, statistics scopes); ``using_stream``,
``record_stream``, ``defer_cleanup`` (within one step, or open across steps with arrays dropped
relying on it), ``scratch`` and IPC exports (the importer writes at once; the block is kept
after its release until the hold lets go, in a thread with no CUDA context or the main one);
releases in a thread where another context of the device is current, and that context's
synchronize; trim, reset (also between two lines of an allocation or a release:
:mod:`cuda_model.inject`) and out of memory under a
small ``max_size``; views, frees from other host threads, frees by the garbage collector, and
releases run *between two driver calls of the allocator* (the model's preempt points: what a
finalizer in another thread, or the collector, does at that moment), and another thread's
kernel launch and drop of a live array parked at one of the allocator's driver calls
(``park``); managed arrays (``cuda.managed_array``), which the host writes at once at their
allocation and touches later (the host rule: their new owner is the CPU), used by kernels on any
stream and dropped like the others, under a small cap of the managed cache.  Arrays are dropped
in threads with no current CUDA context too.  After every step: no
ordering violation, no exception in a release, the arena's invariants.  1, 4 and 8 host threads,
arena on and off.  Each example's manager and pointers derive from one frontend's classes,
drawn from those installed (numba-cuda, Numba-CUDA-MLIR): ``test_operations_count`` checks that
every installed frontend ran.  ``test_concurrent_programs`` adds real concurrency.

``NUMBA_POOL_FUZZ_EXAMPLES`` scales the run (the CI default gives over 20,000 operations).
``test_fuzz_can_fail.py`` shows this machine failing on planted bugs.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cuda_model.harness import LEGACY, Program
from helpers import FRONTENDS

EXAMPLES = int(os.environ.get("NUMBA_POOL_FUZZ_EXAMPLES", "100"))
#: The ``park`` rule: another thread's launch-and-drop between two driver calls of the
#: allocator (a block freed while a barrier runs: the window rule 4's snapshot closes; a fence
#: recorded before its snapshot is caught there by test_stream_rule.py's planted-bug test).
#: On unless ``NUMBA_POOL_FUZZ_PARK=0``.
PARK = os.environ.get("NUMBA_POOL_FUZZ_PARK", "1") != "0"
SIZES = st.one_of(st.integers(1, 4096), st.integers(4097, 40_000), st.sampled_from([256, 1000, 4096, 100_000]))
OPERATIONS: dict = {}  # (threads, arena) -> operations run, reported by test_operations_count
FRONTEND_OPERATIONS: dict = {}  # frontend name -> operations run
MANAGED_HOST_USES: list = [0]  # host uses of managed memory the model checked
#: Only these rules, comma-separated (``NUMBA_POOL_FUZZ_RULES=allocate,launch,drop,hold``): a run
#: that looks for one class of defect.  Default: every rule.
RULES = [r for r in os.environ.get("NUMBA_POOL_FUZZ_RULES", "").split(",") if r]


class LegalPrograms(RuleBasedStateMachine):
    threads = 1
    arena = False

    @initialize(preempt=st.sampled_from([0, 3, 7, 13]), eager=st.booleans(), adaptors=st.booleans(),
                frontend=st.sampled_from(FRONTENDS), managed_threshold=st.sampled_from([None, 0, 8192]))
    def start(self, preempt, eager, adaptors=False, frontend=None, managed_threshold=None):
        # The collector runs only at the program's own points (collect_garbage, the preempt
        # hook, destroy_stream, finish), never on the process's allocation count: a cycle freed
        # at another moment changes what the pool holds, so an allocation under max_size could
        # succeed in one replay of an example and run out of memory in the next
        # (FlakyStrategyDefinition in 800-example runs on a busy host).
        gc.disable()
        self.p = Program(arena=self.arena, threads=self.threads, max_size=2 << 20, adaptors=adaptors,
                         frontend=frontend, managed_max_size=1 << 20, managed_release_threshold=managed_threshold)
        self.p.preempt_every(preempt)
        arena = self.p.mm.allocator.arena
        if eager and arena is not None:
            # Fence at every legacy miss and keep no ready cache: a freed legacy block is handed
            # out by the next allocations, within the few steps of an example (by default the
            # arena fences once 32 blocks wait, and reuses through a cache of 64 per size).
            arena.quarantine_limit, arena.quarantine.cache_limit = -1, 0
        self.streams = [LEGACY]

    def teardown(self):
        try:
            if hasattr(self, "p"):
                try:
                    MANAGED_HOST_USES[0] += self.p.finish()["managed_host_uses"]
                    key = (self.threads, self.arena)
                    OPERATIONS[key] = OPERATIONS.get(key, 0) + self.p.operations
                    name = self.p.frontend.name
                    FRONTEND_OPERATIONS[name] = FRONTEND_OPERATIONS.get(name, 0) + self.p.operations
                finally:
                    self.p.close()
        finally:
            gc.enable()

    def families(self):
        return [f for f in self.p.families.values() if not f.zombie]

    @rule(blocking=st.booleans())
    def create_stream(self, blocking):
        self.streams.append(self.p.create_stream(blocking))

    @precondition(lambda self: len(self.streams) > 1)
    @rule(data=st.data())
    def destroy_stream(self, data):
        handle = data.draw(st.sampled_from(self.streams[1:]))
        if self.p.destroy_stream(handle):
            self.streams.remove(handle)

    @rule(data=st.data(), size=SIZES, scoped=st.booleans(), thread=st.integers(0, 7))
    def allocate(self, data, size, scoped, thread):
        stream = data.draw(st.sampled_from(self.streams)) if scoped else None
        self.p.allocate(size, stream, thread)

    @rule(data=st.data(), size=SIZES, scoped=st.booleans(), thread=st.integers(0, 7))
    def allocate_managed(self, data, size, scoped, thread):
        """``cuda.managed_array``: the host writes the new array at once (the host rule)."""
        stream = data.draw(st.sampled_from(self.streams)) if scoped else None
        self.p.allocate_managed(size, stream, thread)

    @precondition(lambda self: any(f.managed for f in self.families()))
    @rule(data=st.data(), thread=st.integers(0, 7))
    def host_access(self, data, thread):
        """The owner of a managed array reads or writes it on the host."""
        self.p.host_access(data.draw(st.sampled_from([f for f in self.families() if f.managed])), thread)

    @rule(data=st.data(), sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=4), scoped=st.booleans())
    def scratch(self, data, sizes, scoped):
        stream = data.draw(st.sampled_from(self.streams)) if scoped else None
        self.p.scratch(sizes, data.draw(st.sampled_from([1024, 8192])), stream, data.draw(st.integers(0, 7)))

    @precondition(lambda self: self.families())
    @rule(data=st.data(), start=st.integers(0, 2048))
    def view(self, data, start):
        self.p.view(data.draw(st.sampled_from(self.families())), start)

    @precondition(lambda self: self.families())
    @rule(data=st.data(), thread=st.integers(0, 7))
    def launch(self, data, thread):
        chosen = data.draw(st.lists(st.sampled_from(self.families()), min_size=1, max_size=3, unique_by=id))
        self.p.launch(data.draw(st.sampled_from(self.streams)), chosen, thread)

    @precondition(lambda self: self.families())
    @rule(data=st.data())
    def record_stream(self, data):
        self.p.record_stream(data.draw(st.sampled_from(self.families())), data.draw(st.sampled_from(self.streams)))

    @precondition(lambda self: self.p.families)
    @rule(data=st.data(), legalize=st.sampled_from(["record", "wait", "sync", "scope"]),
          how=st.sampled_from(["del", "del", "free", "cycle", "pending", "bare", "foreign"]), thread=st.integers(0, 7))
    def drop(self, data, legalize, how, thread):
        """Drop a reference; "scope" relies on an open ``defer_cleanup`` block (else "record")."""
        family = data.draw(st.sampled_from(list(self.p.families.values())))
        self.p.drop(family, legalize=legalize, how=how, thread=thread)

    @precondition(lambda self: self.p.families)
    @rule(data=st.data(), thread=st.integers(0, 7))
    def deferred_drops(self, data, thread):
        chosen = data.draw(st.lists(st.sampled_from(list(self.p.families.values())), max_size=3, unique_by=id))
        with self.p.mm.defer_cleanup():
            for family in chosen:
                self.p.drop(family, legalize="record", thread=thread)
            self.p.allocate(data.draw(SIZES), None, thread)

    @precondition(lambda self: len(self.p.defer_scopes) < 2)
    @rule()
    def open_defer(self):
        """A ``defer_cleanup`` block that stays open while other steps run (streams destroyed
        and their handles reused, resets, holds let go)."""
        self.p.open_defer()

    @precondition(lambda self: self.p.defer_scopes)
    @rule()
    def close_defer(self):
        self.p.close_defer()

    @rule(data=st.data(), line=st.integers(1, 80), during=st.sampled_from(["allocate", "drop"]),
          thread=st.integers(0, 7))
    def reset_inside(self, data, line, during, thread):
        """Another thread's ``reset()`` landing between two lines of an allocation or a release
        (:mod:`cuda_model.inject`)."""
        self.p.inject_reset(line, during)
        try:
            if during == "allocate":
                stream = data.draw(st.sampled_from(self.streams)) if data.draw(st.booleans()) else None
                self.p.allocate(data.draw(SIZES), stream, thread)
            elif self.p.families:
                family = data.draw(st.sampled_from(list(self.p.families.values())))
                self.p.drop(family, legalize=data.draw(st.sampled_from(["record", "wait"])),
                            how=data.draw(st.sampled_from(["del", "bare", "foreign"])), thread=thread)
        finally:
            self.p.inject = None

    @precondition(lambda self: PARK and self.families())
    @rule(data=st.data(), call=st.sampled_from(["cuEventRecord", "cuStreamWaitEvent", "cuCtxSynchronize",
                                                "cuMemAllocFromPoolAsync", "cuMemFreeAsync", "cuEventCreate",
                                                "cuMemPoolTrimTo"]),
          when=st.sampled_from(["enter", "exit"]))
    def park(self, data, call, when):
        """Another thread's launch-and-drop of an array, between two driver calls of the
        allocator (the window of the fence-before-snapshot and trim defects)."""
        self.p.park(data.draw(st.sampled_from(self.families())), data.draw(st.sampled_from(self.streams)), call, when)

    @precondition(lambda self: self.families())
    @rule(data=st.data())
    def hold(self, data):
        """An IPC export of a live array: its block is kept after its release until let go."""
        self.p.hold(data.draw(st.sampled_from(self.families())))

    @precondition(lambda self: self.p.holds)
    @rule(data=st.data(), bare=st.booleans())
    def let_go(self, data, bare):
        """The importer closes: the kept release runs (in a thread with no CUDA context, as in
        IPC's lease thread, when ``bare``)."""
        self.p.let_go(data.draw(st.integers(0, len(self.p.holds) - 1)), bare)

    @rule()
    def collect_garbage(self):
        gc.collect()

    @rule(data=st.data())
    def synchronize(self, data):
        kind = data.draw(st.sampled_from(["context", "stream", "wait", "foreign"]))
        if kind == "context":
            self.p.model.cuCtxSynchronize()
        elif kind == "foreign":  # another context's synchronize: its streams' work only
            self.p.foreign.submit(self.p.model.cuCtxSynchronize).result()
        elif kind == "stream":
            self.p.model.cuStreamSynchronize(data.draw(st.sampled_from(self.streams)))
        else:
            self.p.model.wait(data.draw(st.sampled_from(self.streams)), data.draw(st.sampled_from(self.streams)))

    @rule()
    def trim(self):
        self.p.mm.trim()

    @rule()
    def reset(self):
        self.p.reset()

    @invariant()
    def nothing_unordered(self):
        if hasattr(self, "p"):
            self.p.check()


FUZZ_SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=100, deadline=None,
                         suppress_health_check=list(HealthCheck))


def _case(threads: int, arena: bool):
    attributes = {"threads": threads, "arena": arena}
    if RULES:  # hide the other rules (a subclass attribute that is no rule)
        rules = [name for name, value in vars(LegalPrograms).items() if hasattr(value, "hypothesis_stateful_rule")]
        attributes.update({name: None for name in rules if name not in RULES})
    machine = type(f"Fuzz{threads}{'Arena' if arena else 'Pool'}", (LegalPrograms,), attributes)
    case = machine.TestCase
    case.settings = FUZZ_SETTINGS
    return case


TestFuzz1ThreadPool = _case(1, False)
TestFuzz1ThreadArena = _case(1, True)
TestFuzz4ThreadsPool = _case(4, False)
TestFuzz4ThreadsArena = _case(4, True)
TestFuzz8ThreadsPool = _case(8, False)
TestFuzz8ThreadsArena = _case(8, True)


@pytest.mark.parametrize("arena", [False, True])
@pytest.mark.parametrize("threads", [4, 8])
def test_concurrent_programs(threads, arena, frontend_name):
    """Real concurrency: ``threads`` host threads run random legal programs at once on one
    manager, handing arrays to each other to drop, with the interpreter switching threads as
    often as it can."""
    p = Program(arena=arena, threads=1, max_size=8 << 20, frontend=frontend_name)
    handoff: list = []
    lock = threading.Lock()
    errors: list = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def program(seed: int):
        rng = random.Random(seed)
        streams = [LEGACY, p.create_stream(True), p.create_stream(False)]
        mine = []
        try:
            for _ in range(150):
                action = rng.random()
                if action < 0.4 or not mine:
                    stream = rng.choice(streams + [None, None])
                    family = _allocate_here(p, rng.choice([64, 1000, 4096, 20_000]), stream)
                    if family is not None:
                        mine.append(family)
                elif action < 0.7:
                    family = rng.choice(mine)
                    _launch_here(p, rng.choice(streams), family)
                else:
                    family = mine.pop(rng.randrange(len(mine)))
                    _legalize_here(p, family, rng.choice(["record", "wait"]))
                    with lock:
                        handoff.append(family.refs.pop())  # another thread drops it
                with lock:
                    if handoff and rng.random() < 0.5:
                        handoff.pop(rng.randrange(len(handoff)))
            for family in mine:
                _legalize_here(p, family, "record")
            mine.clear()
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(repr(err))

    workers = [threading.Thread(target=program, args=(seed,)) for seed in range(threads)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        handoff.clear()
        p.families.clear()
        assert errors == []
        p.finish()
        OPERATIONS[("concurrent", threads, arena)] = threads * 150
    finally:
        sys.setswitchinterval(interval)
        p.close()


def _allocate_here(p: Program, size: int, stream):
    with p.using_stream(stream):
        pointer = p.mm.memalloc(size)
    return p._track(pointer, size, stream if stream is not None else LEGACY)


def _launch_here(p: Program, stream: int, family) -> None:
    if not p.model.would_follow(stream, family.token):
        p.model.wait(stream, family.stream)
    op = p.model.launch(stream, [(family.address, family.size, family.id)])
    family.uses.append((stream, op))


def _legalize_here(p: Program, family, how: str) -> None:
    for stream, op in family.uses:
        if not p.model.would_follow(family.stream, op):
            if how == "record":
                p.mm.record_stream(family.refs[0], stream)
            else:
                p.model.wait(family.stream, stream)


def test_operations_count():
    """Runs last in this file: the fuzzer ran at least 20,000 operations (CI's floor), a fair
    share of them on each installed frontend's classes."""
    total = sum(OPERATIONS.values())
    print(f"\nfuzzer operations: {total} ({OPERATIONS}; by frontend {FRONTEND_OPERATIONS}; "
          f"{MANAGED_HOST_USES[0]} host uses of managed memory checked)")
    if EXAMPLES >= 100:
        assert total >= 20_000, OPERATIONS
        assert MANAGED_HOST_USES[0] >= 1_000, MANAGED_HOST_USES
        assert all(FRONTEND_OPERATIONS.get(name, 0) >= 2_000 for name in FRONTENDS), FRONTEND_OPERATIONS
