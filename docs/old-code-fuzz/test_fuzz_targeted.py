"""OLDFUZZ (new file): targeted variants of tests/test_fuzz.py's state machine, for the defects
the generic machine cannot reach on the old allocator.  Every variant is a subclass of
LegalPrograms with its settings (FUZZ_SETTINGS) and its checks (model violations, problems,
warnings, arena invariants, the byte accounting at teardown), and changes only what its
docstring says (rules left out, narrower strategies, an extra rule).  Results: README.md.

* ``reset`` is left out of every variant: on the old code, an arena-mode allocation after
  ``mm.reset()`` raises AttributeError (``self._arena`` is None), and every violation the model
  reports has one hypothesis "origin" (cuda_model.py's assert), so shrinking would report that
  simplest one instead of the ordering defects.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

import numba_pool
from cuda.bindings import driver as real_cu
from model_harness import LEGACY, Program
from test_fuzz import FUZZ_SETTINGS, LegalPrograms, _launch_here


class NoReset(LegalPrograms):
    """The generic machine, arena mode, less ``reset``; automatic garbage collection is off while
    an example runs (cycles are still collected at the machine's own points: collect_garbage,
    the preempt hook, destroy_stream, finish), so that each example replays identically (with
    ``reject()`` in SkipDefect1, a cycle collected at another moment made hypothesis report
    FlakyStrategyDefinition)."""

    arena = True
    reset = None  # hypothesis collects rules by attribute: None removes the rule

    @initialize(preempt=st.sampled_from([0, 3, 7, 13]))
    def start(self, preempt):
        gc.disable()
        super().start(preempt)

    def teardown(self):
        try:
            super().teardown()
        finally:
            gc.enable()


class Owner:
    """A stream object that lives as long as the stream, as Numba's ``cuda.stream()`` does.  The
    old manager keys arena domains by the owner object; with the plain int handles the generic
    harness passes, every ``using_stream`` scope is a new key (a new domain) instead."""

    def __init__(self, handle: int):
        self.handle = real_cu.CUstream(handle)


def _own_streams(machine) -> None:
    machine.owners = {}
    real = machine._real_using_stream = numba_pool.using_stream
    numba_pool.using_stream = lambda s: real(machine.owners.get(s, s))


def _disown_streams(machine) -> None:
    if hasattr(machine, "_real_using_stream"):
        numba_pool.using_stream = machine._real_using_stream
        del machine._real_using_stream


class OwnedStreams(NoReset):
    """NoReset, with each created stream passed to ``using_stream`` as one persistent object
    (the same object until the stream is destroyed), so that a stream allocates many times in
    one arena domain: what takeover chains K -> T -> U (defect 2) need.  ``scratch`` is left out
    (see OtherThread.scratch)."""

    scratch = None

    @initialize(preempt=st.sampled_from([0, 3, 7, 13]))
    def start(self, preempt):
        super().start(preempt)
        _own_streams(self)

    def teardown(self):
        try:
            super().teardown()
        finally:
            _disown_streams(self)

    @rule(blocking=st.booleans())
    def create_stream(self, blocking):
        super().create_stream(blocking)
        self.owners[self.streams[-1]] = Owner(self.streams[-1])

    @precondition(lambda self: len(self.streams) > 1)
    @rule(data=st.data())
    def destroy_stream(self, data):
        before = set(self.streams)
        super().destroy_stream(data)
        for handle in before - set(self.streams):
            del self.owners[handle]  # the handle may come back for a new stream: a new object


class GuardedProgram(Program):
    """Program that marks the families a rule is working on (``busy``), so that a parked action
    run at a preempt point inside that rule (say, in the driver calls of its own drop) leaves
    them alone."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.busy: set[int] = set()

    @contextlib.contextmanager
    def _busy(self, families):
        ids = {f.id for f in families} - self.busy
        self.busy |= ids
        try:
            yield
        finally:
            self.busy -= ids

    def drop(self, family, **kw):
        if family.id not in self.families:  # a parked action dropped it while the rule ran
            return
        with self._busy([family]):
            return super().drop(family, **kw)

    def launch(self, stream, families, thread=0):
        with self._busy(families):
            return super().launch(stream, families, thread)

    def record_stream(self, family, stream):
        with self._busy([family]):
            return super().record_stream(family, stream)

    def view(self, family, start):
        with self._busy([family]):
            return super().view(family, start)


class OtherThread(NoReset):
    """NoReset, plus what another host thread may do between two driver calls of the allocator.
    ``park`` picks a live array, a stream and a driver function the allocator calls (with "enter"
    or "exit"); at the allocator's next such call (made from numba_pool code), the parked array
    is used by a kernel on that stream *then* dropped (legal: record_stream for the uses its
    allocation stream would not follow), in the thread making the call.  The harness's own
    preempt hook (releases of references dropped before, every ``period``-th call) is kept.  The
    generic hook only releases references dropped before, whose uses all came before (in host
    order) whatever the allocator does at that point, so it cannot open these windows."""

    CALLS = ["cuEventRecord", "cuStreamWaitEvent", "cuCtxSynchronize", "cuMemAllocFromPoolAsync",
             "cuMemFreeAsync", "cuEventCreate", "cuMemPoolTrimTo"]

    @initialize(preempt=st.sampled_from([0, 3, 7, 13]))
    def start(self, preempt):
        gc.disable()
        self.p = GuardedProgram(arena=self.arena, threads=self.threads, max_size=self.max_size)
        self.streams = [LEGACY]
        self.parked: list = []
        self.windows: list[str] = []
        self._preempt(preempt)

    max_size = 2 << 20
    #: Left out: on the old code, record_stream on a scratch array whose stream is destroyed before
    #: the scratch block goes leaks the block (the finalizer's cuEventRecord on the destroyed stream
    #: fails; repro_scratch_leak.py): not one of defects 1-4, and it would hide them when shrinking.
    scratch = None

    def _preempt(self, period: int) -> None:
        p, counter = self.p, iter(range(1, 1 << 62))

        def hook(phase, name):
            calls = next(counter)
            if period and calls % period == 0 and p.pending:
                p.pending.pop()
            if not self.parked:
                return
            family, stream, call, when = self.parked[-1]
            if (call, when) != (name, phase) or family.id in p.busy:
                return
            where = [f.f_code.co_name for f in _frames(sys._getframe()) if "numba_pool" in f.f_code.co_filename]
            if not where:  # a driver call of the harness itself, not of the allocator
                return
            self.parked.pop()
            if family.id in p.families and family.refs and not family.zombie and (
                    stream == LEGACY or stream in p.streams):
                self.windows.append(f"{phase} {name}: launch of owner {family.id} on {stream:#x} and drop, "
                                    f"inside {' < '.join(where[:6])}")
                _launch_here(p, stream, family)
                p._legalize(family, "record", 0)  # record_stream / synchronize: no p.run (same thread)
                del p.families[family.id]
                family.refs.clear()
        p.model.preempt = hook

    @precondition(lambda self: self.families())
    @rule(data=st.data(), call=st.sampled_from(CALLS), when=st.sampled_from(["exit", "enter"]))
    def park(self, data, call, when):
        family = data.draw(st.sampled_from(self.families()))
        self.parked.append((family, data.draw(st.sampled_from(self.streams)), call, when))

    def teardown(self):
        if os.environ.get("OLDFUZZ_TRACE") and getattr(self, "windows", None):
            print("WINDOWS", self.windows, file=sys.stderr)
        super().teardown()

    @invariant()
    def nothing_unordered(self):
        if hasattr(self, "p"):
            try:
                self.p.check()
            except AssertionError as err:
                raise AssertionError(f"{err}\nother-thread actions run at preempt points:\n  "
                                     + "\n  ".join(self.windows)) from None


class OtherThreadNoTrim(OtherThread):
    """OtherThread less ``trim`` and with no ``max_size`` (so no out-of-memory path): no
    synchronize-then-consolidate, i.e. only the fence window (defect 3) is left."""

    trim = None
    max_size = None


class OtherThreadUnscoped(OtherThread):
    """OtherThread with every allocation outside ``using_stream`` (``scoped`` always False): the
    arena then has one domain (the legacy stream's) and defect 1's KeyError cannot occur."""

    @rule(data=st.data(), size=st.one_of(st.integers(1, 4096), st.sampled_from([256, 1000, 4096])),
          thread=st.integers(0, 7))
    def allocate(self, data, size, thread):
        self.p.allocate(size, None, thread)


class OtherThreadUnscopedNoTrim(OtherThreadUnscoped):
    trim = None
    max_size = None


class SkipDefect1:
    """Mixin: discard (hypothesis ``reject()``) every example at the point where defect 1 would
    raise its KeyError (``SlabSource.order`` from a domain that has no event), so that the search
    goes on past it to the deeper defects instead of stopping at the first KeyError."""

    @initialize(preempt=st.sampled_from([0, 3, 7, 13]))
    def start(self, preempt):
        super().start(preempt)
        self.arm()

    def arm(self):
        source, run = getattr(self.p.mm, "_slab_source", None), self.p.run
        if source is None:  # not the old manager (the new code has no defect 1): nothing to skip
            return
        order = source.order

        def order_unless_defect1(earlier, later):
            if earlier != source.legacy_key and earlier not in source.events:
                raise Defect1Seen  # in a worker thread: hypothesis's reject() works only in the test's
            return order(earlier, later)

        def run_or_reject(*args):
            try:
                return run(*args)
            except Defect1Seen:
                reject()
        source.order = order_unless_defect1
        self.p.run = run_or_reject


class Defect1Seen(Exception):
    pass


class OwnedStreamsSkip1(SkipDefect1, OwnedStreams):
    """OwnedStreams, less the examples where defect 1 fires."""


class OtherThreadSkip1(SkipDefect1, OtherThread):
    """OtherThread (scoped allocations allowed), less the examples where defect 1 fires."""


FOCUS_SIZES = st.sampled_from([1000, 4096])  # arena blocks: 4 KiB blocks fill a 16 KiB slab in 4


class Focus:
    """Mixin for the focused runs: only allocate (arena sizes only), launch, drop (and park, trim
    where the variant adds them) -- the same rules, fewer of them, so that the few-step
    sequences a defect needs come up in a few hundred examples.  The streams are created by the
    initializer instead of a rule (one blocking, two non-blocking): with hypothesis's swarm
    testing, create_stream (the one rule never disabled by a precondition) took most steps."""

    view = record_stream = deferred_drops = collect_garbage = synchronize = destroy_stream = None
    scratch = trim = reset = create_stream = None

    owned = False  # True: streams passed as persistent objects, as in OwnedStreams

    @initialize(preempt=st.sampled_from([0, 3, 7, 13]))
    def start(self, preempt):
        super().start(preempt)
        if self.owned and not hasattr(self, "owners"):
            _own_streams(self)
        for blocking in (True, False, False):
            self._new_stream(blocking)

    def teardown(self):
        try:
            super().teardown()
        finally:
            _disown_streams(self)

    def _new_stream(self, blocking):
        self.streams.append(self.p.create_stream(blocking))
        if hasattr(self, "owners"):
            self.owners[self.streams[-1]] = Owner(self.streams[-1])

    @rule(data=st.data(), size=FOCUS_SIZES, scoped=st.booleans(), thread=st.integers(0, 7))
    def allocate(self, data, size, scoped, thread):
        stream = data.draw(st.sampled_from(self.streams)) if scoped else None
        self.p.allocate(size, stream, thread)


class Defect2Focus(Focus, SkipDefect1, OwnedStreams):
    """OwnedStreamsSkip1, focused."""


class Defect2Narrow(Defect2Focus):
    """Defect2Focus narrowed further: three non-blocking streams, every allocation 4096 bytes
    inside ``using_stream`` (four fill a slab, so a domain runs out and takes another over) and
    used at once by a kernel on its stream; drops legalized by record_stream or an event, not a
    context synchronize (which orders everything before it)."""

    @initialize(preempt=st.just(0))
    def start(self, preempt):
        gc.disable()
        LegalPrograms.start(self, preempt)
        _own_streams(self)
        SkipDefect1.arm(self)
        for _ in range(3):
            self._new_stream(False)

    @rule(data=st.data(), thread=st.integers(0, 7))
    def allocate(self, data, thread):
        """Allocate 4096 bytes on a stream and use them there at once (a kernel on that stream)."""
        stream = data.draw(st.sampled_from(self.streams[1:]))
        family = self.p.allocate(4096, stream, thread)
        if family is not None:
            self.p.launch(stream, [family], thread)

    @precondition(lambda self: self.p.families)
    @rule(data=st.data(), legalize=st.sampled_from(["record", "wait"]), thread=st.integers(0, 7))
    def drop(self, data, legalize, thread):
        """LegalPrograms.drop without "sync" (a context synchronize orders everything before it)."""
        family = data.draw(st.sampled_from(list(self.p.families.values())))
        self.p.drop(family, legalize=legalize, how="del", thread=thread)


class Defect3Focus(Focus, SkipDefect1, OtherThread):
    """OtherThreadSkip1, focused, without trim (no synchronize-then-consolidate: only fences),
    streams passed as persistent objects (a stream allocates again in the domain it took over,
    instead of every scope being a new domain that the next takeover finds without an event)."""

    owned = True


class Defect4Focus(Focus, SkipDefect1, OtherThread):
    """Defect3Focus with trim."""

    owned = True

    @rule()
    def trim(self):
        self.p.mm.trim()


class Defect3Narrow(Defect3Focus):
    """Defect3Focus narrowed: parked actions only at the fence's driver calls, no drop rule (the
    parked action is the only drop)."""

    CALLS = ["cuEventRecord", "cuStreamWaitEvent"]
    drop = None

    @precondition(lambda self: self.families())
    @rule(data=st.data(), call=st.sampled_from(CALLS), when=st.sampled_from(["exit", "enter"]))
    def park(self, data, call, when):
        OtherThread.park(self, data, call, when)


class Defect4Narrow(Defect4Focus):
    """Defect4Focus narrowed: parked actions only at the synchronize, no drop rule."""

    CALLS = ["cuCtxSynchronize"]
    drop = None

    @precondition(lambda self: self.families())
    @rule(data=st.data(), call=st.sampled_from(CALLS), when=st.sampled_from(["exit", "enter"]))
    def park(self, data, call, when):
        OtherThread.park(self, data, call, when)


def _frames(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def _case(machine, threads=1):
    machine = type(f"{machine.__name__}{threads}", (machine,), {"threads": threads})
    case = machine.TestCase
    case.settings = FUZZ_SETTINGS
    return case


TestNoReset1 = _case(NoReset)
TestNoReset4 = _case(NoReset, 4)
TestOwnedStreams1 = _case(OwnedStreams)
TestOwnedStreams4 = _case(OwnedStreams, 4)
TestOwnedStreamsSkip1 = _case(OwnedStreamsSkip1)
TestOwnedStreamsSkip4 = _case(OwnedStreamsSkip1, 4)
TestOtherThread1 = _case(OtherThread)
TestOtherThreadSkip1 = _case(OtherThreadSkip1)
TestOtherThreadNoTrim1 = _case(OtherThreadNoTrim)
TestOtherThreadUnscoped1 = _case(OtherThreadUnscoped)
TestDefect2Focus1 = _case(Defect2Focus)
TestDefect2Focus4 = _case(Defect2Focus, 4)
TestDefect3Focus1 = _case(Defect3Focus)
TestDefect2Narrow1 = _case(Defect2Narrow)
TestDefect3Narrow1 = _case(Defect3Narrow)
TestDefect4Narrow1 = _case(Defect4Narrow)
TestDefect4Focus1 = _case(Defect4Focus)
TestOtherThreadUnscopedNoTrim1 = _case(OtherThreadUnscopedNoTrim)
