"""The legacy stream's barrier as a *cost*: how many operations the library under test
(numba_pool) enqueued on a legacy default stream during each allocation and each release the
program made.

An operation on a legacy default stream waits for all earlier work of every blocking stream of
its context, and all later work of every blocking stream waits for it (CUDA Driver API, "Stream
synchronization behavior"): a barrier between all of a program's streams, which Numba's default
manager never puts at an allocation or a free.  So the model counts them.

Whose operation: the library's when, walking the stack outward from the driver call, a frame of
the library's package comes before any frame of the program (the files of this package other
than the model's own: :mod:`cuda_model.harness`, :mod:`cuda_model.inject`, the model's tests);
other frames (a test, a planted bug, ``threading``) are looked through.  So a finalizer's
release, a release run at a preempt point or an injected reset is the library's; the harness's
own launches, copies, waits and synchronizes (also those it parks inside a driver call of the
library) are the program's.

Which call: :meth:`_Costs.attributed` brackets one call of the program (the harness brackets its
allocations and the drop of an array's last reference), with whether a ``defer_cleanup`` was
open.  A library operation on a legacy stream (of any context) while a bracket is open counts for
that call, whichever thread enqueues it: an operation a release left for later and a later
allocation issues counts for that allocation.  Outside every bracket it counts as *elsewhere*
(``defer_cleanup``'s exit, trim, reset, statistics, a release an IPC hold let go).  A call during
which the library synchronized the context (``cuCtxSynchronize``: rule 8's fallback, out of
memory, a reset landing inside the call) is *excused*: its operations are counted apart.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from .base import _MODEL_FILES, _call_site
from .ordering import Op, _Stream, describe_stream

_HERE = os.path.dirname(os.path.abspath(__file__))
#: Where the library under test lives (numba_pool's package), as found without importing it.
LIBRARY = os.path.dirname(importlib.util.find_spec("numba_pool").origin) + os.sep
#: Examples kept per kind of call (the first calls that issued legacy-stream operations).
EXAMPLES = 3

_LIBRARY, _PROGRAM, _MODEL_FRAME, _OTHER = "library", "program", "model", "other"


class Whose:
    """Whether the driver call being made is the library's (see the module docstring)."""

    def __init__(self, library: str = LIBRARY):
        self.library = os.path.normcase(os.path.abspath(library))
        self._kinds: dict[str, str] = {}

    def _kind(self, filename: str) -> str:
        kind = self._kinds.get(filename)
        if kind is None:
            path = os.path.normcase(os.path.abspath(filename))
            if path.startswith(self.library):
                kind = _LIBRARY
            elif path in _MODEL_FILES:
                kind = _MODEL_FRAME
            elif os.path.dirname(path) == os.path.normcase(_HERE):
                kind = _PROGRAM
            else:
                kind = _OTHER
            self._kinds[filename] = kind
        return kind

    def library_call(self) -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            kind = self._kind(frame.f_code.co_filename)
            if kind is _LIBRARY:
                return True
            if kind is _PROGRAM:
                return False
            frame = frame.f_back
        return False


@dataclass
class _Call:
    group: str  # "allocation" or "release"
    variant: str  # "", "managed", "scratch" ...
    deferred: bool
    ops: list = field(default_factory=list)  # descriptions of the library's legacy-stream ops
    synchronized: bool = False


@dataclass
class CallFigures:
    """The library's legacy-stream operations in one kind of call: ``calls`` made, ``ops``
    issued in them, ``calls_with_ops`` (calls that issued at least one), ``most`` in one call;
    ``excused_calls`` / ``excused_ops``: calls in which the library synchronized the context,
    counted apart; ``examples``: the operations of the first calls that issued some."""

    calls: int = 0
    ops: int = 0
    calls_with_ops: int = 0
    most: int = 0
    excused_calls: int = 0
    excused_ops: int = 0
    examples: list = field(default_factory=list)

    def add(self, call: _Call) -> None:
        self.calls += 1
        if call.synchronized:
            self.excused_calls += 1
            self.excused_ops += len(call.ops)
            return
        if call.ops:
            self.ops += len(call.ops)
            self.calls_with_ops += 1
            self.most = max(self.most, len(call.ops))
            if len(self.examples) < EXAMPLES:
                self.examples.append(list(call.ops))

    def merge(self, other: "CallFigures") -> None:
        for name in ("calls", "ops", "calls_with_ops", "excused_calls", "excused_ops"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.most = max(self.most, other.most)
        self.examples += other.examples[:EXAMPLES - len(self.examples)]


@dataclass
class LegacyCost:
    """What :meth:`_Costs.legacy_cost` reports: :class:`CallFigures` per kind of call, keyed by
    ``(group, variant, deferred)`` (``group`` "allocation" or "release"; ``variant`` "",
    "managed", "scratch"; ``deferred``: a ``defer_cleanup`` was open), and ``elsewhere``, the
    library's legacy-stream operations outside every call."""

    by_call: dict = field(default_factory=dict)
    elsewhere: int = 0

    def figures(self, group: str, deferred: Optional[bool] = None, variant: Optional[str] = None) -> CallFigures:
        """The figures of every kind of call of ``group`` (``"allocation"``, ``"release"``),
        only those made with a ``defer_cleanup`` open or not (``deferred``) and of one
        ``variant`` when given."""
        total = CallFigures()
        for (g, v, d), figures in sorted(self.by_call.items()):
            if g == group and (deferred is None or d == deferred) and (variant is None or v == variant):
                total.merge(figures)
        return total

    def merge(self, other: "LegacyCost") -> None:
        for key, figures in other.by_call.items():
            self.by_call.setdefault(key, CallFigures()).merge(figures)
        self.elsewhere += other.elsewhere

    def __str__(self) -> str:
        lines = ["legacy-stream operations the library enqueued (excused: calls that synchronized the context):",
                 f"  {'call':<40} {'calls':>7} {'ops':>6} {'calls with ops':>15} {'most':>5} {'excused':>8}"]
        for (group, variant, deferred), f in sorted(self.by_call.items()):
            name = group + (f" ({variant})" if variant else "") + (" in defer_cleanup" if deferred else "")
            lines.append(f"  {name:<40} {f.calls:>7} {f.ops:>6} {f.calls_with_ops:>15} {f.most:>5} "
                         f"{f.excused_calls:>8}")
        lines.append(f"  elsewhere (scope exits, trim, reset, statistics ...): {self.elsewhere}")
        return "\n".join(lines)


class _Costs:
    """The model's side: brackets, and the count of the library's legacy-stream operations."""

    def _init_costs(self, library: str) -> None:
        self.whose = Whose(library)
        self._calls: list[_Call] = []  # the open brackets, innermost last
        self._cost = LegacyCost()

    @contextlib.contextmanager
    def attributed(self, group: str, variant: str = "", deferred: bool = False):
        """While open, the library's legacy-stream operations count for one call of the
        program: an ``"allocation"`` or a ``"release"`` (``variant``: "managed", "scratch" ...;
        ``deferred``: made with a ``defer_cleanup`` open).  Brackets nest (the innermost
        counts)."""
        call = _Call(group, variant, deferred)
        with self._lock:
            self._calls.append(call)
        try:
            yield call
        finally:
            with self._lock:
                self._calls.remove(call)
                self._cost.by_call.setdefault((group, variant, deferred), CallFigures()).add(call)

    def legacy_cost(self) -> LegacyCost:
        """The figures so far (a copy): see :class:`LegacyCost`."""
        with self._lock:
            copy = LegacyCost()
            copy.merge(self._cost)
            return copy

    def _legacy_cost_stats(self) -> dict:
        """The figures as plain counts, for :meth:`CudaModel.stats`."""
        cost = self._cost
        out = {"legacy_ops_elsewhere": cost.elsewhere}
        for group in ("allocation", "release"):
            figures = cost.figures(group)
            out.update({f"{group}_calls": figures.calls, f"legacy_ops_at_{group}s": figures.ops,
                        f"{group}s_with_legacy_ops": figures.calls_with_ops,
                        f"most_legacy_ops_per_{group}": figures.most,
                        f"legacy_ops_at_excused_{group}s": figures.excused_ops})
        return out

    def _note_legacy_op(self, s: _Stream, op: Op, library: bool) -> None:
        """A new op on a legacy stream (under the model's lock)."""
        if not library:
            return
        if not self._calls:
            self._cost.elsewhere += 1
            return
        call = self._calls[-1]
        if len(call.ops) < 8:
            call.ops.append(f"{op.kind} on the {describe_stream(s.handle, s.id)} at {_call_site()}")
        else:
            call.ops.append(op.kind)

    def _note_context_synchronize(self, library: bool) -> None:
        if library and self._calls:
            self._calls[-1].synchronized = True
