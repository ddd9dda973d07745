"""Lock-step turns for the end-to-end bench: every worker of a round alive at once on one CPU
core, one running at a time, taking turns timed block by timed block.

Why: Numba binds the memory manager when it creates a context, so each manager is timed in its
own process.  Timed one after the other, managers were tens of seconds apart, and this
workplace's hosts have slow spells lasting seconds that hit whichever process is timing: on a
lent H100 (2026-11-22) default's ``cuda.device_array`` figures read 1.4-1.6x slower in two rounds
of three while its pinned figures, timed later in the same processes, did not, and every ratio
to default moved with them (docs/perf-notes.md).  Taking turns block by block (a block is one
timed repeat, 10-200 ms), the managers' repeats are a fraction of a second apart, so a spell
hits them alike; the issue's in-process ABAB, across processes.

Protocol: one byte at a time over two pipes per worker, whose descriptors the worker finds in
:data:`TURNS_VARIABLE` (``"READ,WRITE"``).

* The worker writes ``r`` once started (:meth:`Turn.begin`) and waits for ``g``: Python's start
  and the imports of ``python -m numba_pool.bench`` run before any worker times anything.
* Holding the turn it runs everything, untimed work included (its checks, compilations and
  calibrations), so no other worker shares the core while one times.
* After each timed block it writes ``y`` and waits for the next ``g`` (:meth:`Turn.pass_turn`);
  when it exits it writes ``x`` (:meth:`Turn.end`).  A worker that dies closes its pipe: the
  parent reads end of file and goes on with the others.
* **Phases.** The workers do not all time the same parts (the floors have no host rows, the
  anchors only the pipeline).  A worker starting a part writes its phase, a digit, and waits
  (:meth:`Turn.enter_phase`); the parent gives turns only to the workers in the lowest phase
  any worker is still in, so each part is timed by all the workers that have it, taking turns
  among themselves (without phases, the anchors' pipeline would take turns with default's
  pinned arrays).

The parent (:func:`run_in_turns`) starts every worker, waits for each ``r``, then gives the turn
to each in order until all have exited.  Without :data:`TURNS_VARIABLE` a worker runs alone and
every call here does nothing.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import tempfile
import time
from collections import deque
from dataclasses import dataclass

TURNS_VARIABLE = "NUMBA_POOL_BENCH_TURNS"
READY, GO, YIELD, EXIT = b"r", b"g", b"y", b"x"
TURN_TIMEOUT_S = 300.0  # a worker holding the turn longer than this is killed


class Turn:
    """The worker's side: ``begin`` at its start, ``pass_turn`` after each timed block, ``end``
    when it exits.  Inactive (every method a no-op) without :data:`TURNS_VARIABLE`.

    :raises ValueError: when the variable is set but is not two descriptors, naming its value.
    """

    def __init__(self, environ=os.environ):
        value = environ.get(TURNS_VARIABLE, "").strip()
        self._fds = None
        if value:
            try:
                read, write = (int(part) for part in value.split(","))
            except ValueError:
                raise ValueError(f"{TURNS_VARIABLE}={value!r}: expected two file descriptors, READ,WRITE") from None
            self._fds = (read, write)

    @property
    def active(self) -> bool:
        return self._fds is not None

    def begin(self) -> None:
        """Say this worker started, and wait for its first turn."""
        self._say(READY)

    def pass_turn(self) -> None:
        """Give the turn back after a timed block, and wait for the next."""
        self._say(YIELD)

    def enter_phase(self, phase: int) -> None:
        """Give the turn back before starting part ``phase`` (0-9; 0 at the start), and wait
        until every worker has left the phases before it."""
        if self._fds:
            if not 0 <= phase <= 9:
                raise ValueError(f"phase {phase}: expected 0 to 9")
            self._say(str(phase).encode())

    def end(self) -> None:
        """Leave the turns for good (at exit; once)."""
        if self._fds:
            fds, self._fds = self._fds, None
            try:
                os.write(fds[1], EXIT)
            except OSError:  # the parent went away: nobody waits for us
                pass

    def _say(self, message: bytes) -> None:
        """Write ``message`` and wait for the next turn.

        :raises SystemExit: when the parent is gone (a closed pipe): nobody gives turns.
        """
        if not self._fds:
            return
        try:
            os.write(self._fds[1], message)
            go = os.read(self._fds[0], 1)
        except OSError:
            go = b""
        if go != GO:
            self._fds = None
            raise SystemExit("bench: the parent stopped giving turns")


_turn: Turn | None = None


def worker_turn() -> Turn:
    """This process's :class:`Turn` (one per process, from the environment)."""
    global _turn
    if _turn is None:
        _turn = Turn()
    return _turn


# -- the parent -------------------------------------------------------------------------------

@dataclass
class Worker:
    """One worker of a round, as the parent sees it: its label, process, pipes, output files,
    the seconds it held the turn, and whether it took part in the turns at all."""

    label: str
    process: subprocess.Popen
    to_worker: int
    from_worker: int
    stdout: object
    stderr: object
    busy_s: float = 0.0
    phase: int = 0
    started: bool = False  # it wrote r: a worker that never does ran without turns
    problem: str = ""
    finished: bool = False


@dataclass(frozen=True)
class Outcome:
    """What a worker left: exit status, standard output and error, the seconds it held the
    turn, and whether it took turns (a ``numba_pool.bench`` from before this protocol does not:
    it ran alone while the others started, so its figures are not comparable)."""

    status: int
    stdout: str
    stderr: str
    busy_s: float
    took_turns: bool


def run_in_turns(commands: dict[str, tuple[list[str], dict, str | None]], core: int | None = None,
                 turn_timeout_s: float = TURN_TIMEOUT_S) -> dict[str, Outcome]:
    """Run ``{label: (argv, env, cwd)}`` at once, in lock-step turns (this module's protocol),
    each started on CPU core ``core`` if given (inherited from the starting thread, which is
    pinned around each start: no ``preexec_fn`` in a process with CUDA's threads); return
    ``{label: Outcome}``.  A worker that holds the turn, or takes to exit, longer than
    ``turn_timeout_s`` seconds is killed; its stderr then says so.  On any exception here
    (an interrupt, a failed start) every worker is killed and reaped before it propagates.
    """
    workers: list[Worker] = []
    try:
        for label, (argv, env, cwd) in commands.items():
            workers.append(_start(label, argv, env, cwd, core))
        for worker in workers:
            worker.started = _read(worker, turn_timeout_s, "start") == READY
            if not worker.started:
                _finish(worker, turn_timeout_s)
        queue = deque(w for w in workers if not w.finished)
        while queue:
            worker = _next_in_phase(queue)
            said = _give_turn(worker, turn_timeout_s)
            if said.isdigit():
                worker.phase = int(said)
            if worker.finished:
                _finish(worker, turn_timeout_s)  # its exit must not overlap the next worker's turn
            else:
                queue.append(worker)
    except BaseException:
        for worker in workers:
            worker.process.kill()
            worker.process.wait()
        raise
    finally:
        for worker in workers:
            os.close(worker.to_worker)
            os.close(worker.from_worker)
    return {w.label: _collect(w) for w in workers}


def _start(label: str, argv: list[str], env: dict, cwd: str | None, core: int | None) -> Worker:
    go_read, go_write = os.pipe()  # parent -> worker: g
    say_read, say_write = os.pipe()  # worker -> parent: r, y, x, a phase
    stdout = tempfile.TemporaryFile("w+", errors="replace")
    stderr = tempfile.TemporaryFile("w+", errors="replace")
    env = {**env, TURNS_VARIABLE: f"{go_read},{say_write}"}
    try:
        with pinned_thread(core):
            process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=True,
                                       pass_fds=(go_read, say_write))
    except BaseException:
        for fd in (go_read, go_write, say_read, say_write):
            os.close(fd)
        stdout.close()
        stderr.close()
        raise
    os.close(go_read)
    os.close(say_write)
    return Worker(label, process, go_write, say_read, stdout, stderr)


@contextlib.contextmanager
def pinned_thread(core: int | None):
    """Inside: the calling thread on CPU core ``core`` (Linux: a thread's own affinity), so that
    a process it starts inherits the core from its first instruction; restored after.  Nothing
    for ``None``."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _next_in_phase(queue: deque) -> Worker:
    """Take from ``queue`` the first worker in the lowest phase of those queued."""
    lowest = min(w.phase for w in queue)
    for _ in range(len(queue)):
        worker = queue.popleft()
        if worker.phase == lowest:
            return worker
        queue.append(worker)
    raise AssertionError("unreachable: some queued worker is in the lowest phase")


def _give_turn(worker: Worker, timeout_s: float) -> bytes:
    start = time.perf_counter()
    try:
        os.write(worker.to_worker, GO)
    except BrokenPipeError:
        worker.finished = True
        return EXIT
    said = _read(worker, timeout_s, "its turn")
    worker.busy_s += time.perf_counter() - start
    if said != YIELD and not said.isdigit():
        worker.finished = True
    return said


def _read(worker: Worker, timeout_s: float, during: str) -> bytes:
    ready, _, _ = select.select([worker.from_worker], [], [], timeout_s)
    if not ready:
        worker.problem = f"killed: held {during} longer than {timeout_s:.0f} s"
        worker.process.kill()
        return EXIT
    return os.read(worker.from_worker, 1) or EXIT  # end of file: it died


def _finish(worker: Worker, timeout_s: float) -> None:
    """Wait until ``worker`` has exited (its interpreter's and CUDA's teardown run on the
    shared core: it must not overlap another worker's turn); kill it after ``timeout_s``."""
    worker.finished = True
    try:
        worker.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        worker.problem = worker.problem or f"killed: took longer than {timeout_s:.0f} s to exit"
        worker.process.kill()
        worker.process.wait()


def _collect(worker: Worker) -> Outcome:
    status = worker.process.wait()
    worker.stdout.seek(0)
    worker.stderr.seek(0)
    out, err = worker.stdout.read(), worker.stderr.read()
    worker.stdout.close()
    worker.stderr.close()
    if worker.problem:
        err = f"{err}\nbench: {worker.label}: {worker.problem}"
    return Outcome(status, out, err, worker.busy_s, worker.started)
