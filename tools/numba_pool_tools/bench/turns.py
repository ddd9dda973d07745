"""Lock-step turns for the end-to-end bench: every worker of a round alive at once on one CPU
core, one running at a time, taking turns timed block by timed block.

Why: Numba binds the memory manager when it creates a context, so each manager is timed in its
own process.  Timed one after the other, managers were tens of seconds apart, and this
workplace's hosts have slow spells lasting seconds that hit whichever process is timing: on a
lent H100 (2026-11-22) default's ``cuda.device_array`` figures read 1.4-1.6x slower in two rounds
of three while its pinned figures, timed later in the same processes, did not, and every ratio
to default moved with them (docs/perf-notes.md).  Taking turns block by block (a block is one
timed repeat, 1-200 ms), the managers' repeats are a fraction of a second apart, so a spell
hits them alike; the issue's in-process ABAB, across processes.

Protocol: one byte at a time over two pipes per worker, whose descriptors the worker finds in
:data:`TURNS_VARIABLE` (``"READ,WRITE"``).

* The worker writes ``R`` once started (:meth:`Turn.begin`) and waits for ``g``: Python's start
  and the imports of ``python -m numba_pool_tools.bench`` run before any worker times anything, on
  every allowed core of the timing core's NUMA node at once (:func:`startup_cores`: the memory
  they touch is placed as it would be from the timing core); ``begin`` then pins the worker to
  the timing core.
* Holding the turn it runs everything, untimed work included (its checks, compilations and
  calibrations), so no other worker shares the core while one times.
* After each timed block it writes ``y`` and waits for the next ``g`` (:meth:`Turn.pass_turn`);
  when it is done it writes ``x`` and waits for ``q`` (:meth:`Turn.end`), back on the startup
  cores.  The parent says ``q`` to all once every worker is done, so their teardowns (the
  interpreter's, CUDA's: ~1 s each) run at once, while nobody times.  A worker that dies closes
  its pipe: the parent reads end of file and goes on with the others.  A worker from before
  ``q`` writes ``r`` and exits after ``x``; the parent waits for that exit before the next turn.
* **Phases.** The workers do not all time the same parts (the floors have no host rows, the
  anchors only the pipeline).  A worker starting a part writes its phase, a digit, and waits
  (:meth:`Turn.enter_phase`); the parent gives turns only to the workers in the lowest phase
  any worker is still in, so each part is timed by all the workers that have it, taking turns
  among themselves (without phases, the anchors' pipeline would take turns with default's
  pinned arrays).

The parent (:func:`run_in_turns`) starts every worker, waits for each ``R`` (or ``r``), gives
the turn to each in order until all are done, then says ``q`` to all and waits for their exits.  Without :data:`TURNS_VARIABLE` a worker runs alone and
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
READY, GO, YIELD, EXIT, QUIT = b"R", b"g", b"y", b"x", b"q"
READY_EXITS_AT_ONCE = b"r"  # a worker from before QUIT: it exits as soon as it is done
DIED = b""  # what the parent reads from a worker that died or that it killed
TURN_TIMEOUT_S = 300.0  # a worker holding the turn longer than this is killed


class Turn:
    """The worker's side: ``begin`` at its start, ``pass_turn`` after each timed block, ``end``
    when it exits.  Inactive (every method a no-op) without :data:`TURNS_VARIABLE`.

    :raises ValueError: when the variable is set but is not two descriptors, naming its value.
    """

    def __init__(self, environ=os.environ):
        value = environ.get(TURNS_VARIABLE, "").strip()
        self._fds = None
        self._startup_cores: set[int] | None = None
        if value:
            try:
                read, write = (int(part) for part in value.split(","))
            except ValueError:
                raise ValueError(f"{TURNS_VARIABLE}={value!r}: expected two file descriptors, READ,WRITE") from None
            self._fds = (read, write)

    @property
    def active(self) -> bool:
        return self._fds is not None

    def begin(self, core: int | None = None) -> None:
        """Pin every thread of this process to CPU ``core`` if given (the startup cores are kept
        for :meth:`end`), say this worker started, and wait for its first turn."""
        if self._fds and core is not None:
            self._startup_cores = os.sched_getaffinity(0)
            _pin_threads(os.getpid(), {core})
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
        """Leave the turns for good (at exit; once): back on the startup cores, wait until the
        parent says every worker is done, so that this one's teardown overlaps nobody's turn."""
        if self._fds:
            fds, self._fds = self._fds, None
            if self._startup_cores:
                _pin_threads(os.getpid(), self._startup_cores)
            try:
                os.write(fds[1], EXIT)
                os.read(fds[0], 1)  # QUIT, or end of file when the parent went away
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


def _pin_threads(pid: int, cores: set[int]) -> None:
    """Every thread of process ``pid`` on ``cores`` (Linux's affinity is a thread's own: numpy's
    BLAS threads exist before :meth:`Turn.begin`, CUDA's are made after it); only the thread
    ``pid`` itself where ``/proc`` cannot be read."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile
            pass


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
    started: bool = False  # it wrote R or r: a worker that never does ran without turns
    waits_for_quit: bool = False  # it wrote R: it exits when told (QUIT), not as soon as it is done
    problem: str = ""
    finished: bool = False


@dataclass(frozen=True)
class Outcome:
    """What a worker left: exit status, standard output and error, the seconds it held the
    turn, and whether it took turns (a ``numba_pool_tools.bench`` from before this protocol does not:
    it ran alone while the others started, so its figures are not comparable)."""

    status: int
    stdout: str
    stderr: str
    busy_s: float
    took_turns: bool


def run_in_turns(commands: dict[str, tuple[list[str], dict, str | None]], core: int | None = None,
                 turn_timeout_s: float = TURN_TIMEOUT_S) -> dict[str, Outcome]:
    """Run ``{label: (argv, env, cwd)}`` at once, in lock-step turns (this module's protocol),
    each started, if ``core`` is given, on :func:`startup_cores` (inherited from the starting
    thread, which is pinned around each start: no ``preexec_fn`` in a process with CUDA's
    threads) and pinned to ``core`` by :meth:`Turn.begin` (the worker passes it); return
    ``{label: Outcome}``.  A worker that holds the turn, or takes to exit, longer than
    ``turn_timeout_s`` seconds is killed; its stderr then says so.  On any exception here
    (an interrupt, a failed start) every worker is killed and reaped before it propagates.
    """
    workers: list[Worker] = []
    try:
        cores = None if core is None else startup_cores(core, os.sched_getaffinity(0))
        for label, (argv, env, cwd) in commands.items():
            workers.append(_start(label, argv, env, cwd, cores))
        for worker in workers:
            said = _read(worker, turn_timeout_s, "start")
            worker.started, worker.waits_for_quit = said in (READY, READY_EXITS_AT_ONCE), said == READY
            if not worker.started:
                _finish(worker, turn_timeout_s)
            elif said == READY_EXITS_AT_ONCE and core is not None:  # it does not pin itself in begin()
                _pin_threads(worker.process.pid, {core})
        queue = deque(w for w in workers if not w.finished)
        while queue:
            worker = _next_in_phase(queue)
            said = _give_turn(worker, turn_timeout_s)
            if said.isdigit():
                worker.phase = int(said)
            if not worker.finished:
                queue.append(worker)
            elif not (said == EXIT and worker.waits_for_quit):  # it exits now, or is dying, or was killed:
                _finish(worker, turn_timeout_s)  # its teardown must not overlap the next worker's turn
        _quit_all([w for w in workers if w.waits_for_quit], turn_timeout_s)
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


def startup_cores(core: int, allowed: set[int], nodes_folder: str = "/sys/devices/system/node") -> set[int]:
    """The CPU cores a worker starts on: those of ``allowed`` in ``core``'s NUMA node (Linux's
    ``nodeN/cpulist``), so that its imports run beside the others' and what they allocate lies
    in the timing core's node; ``{core}`` where the nodes cannot be read."""
    try:
        lists = [os.path.join(nodes_folder, name, "cpulist") for name in os.listdir(nodes_folder)
                 if name.startswith("node") and name[4:].isdigit()]
        for path in lists:
            with open(path) as f:
                node = parse_cpulist(f.read())
            if core in node:
                return (node & allowed) | {core}
    except (OSError, ValueError):
        pass
    return {core}


def parse_cpulist(text: str) -> set[int]:
    """Linux's CPU list format: ``"0-3,8,10-11"`` -> ``{0, 1, 2, 3, 8, 10, 11}``.

    :raises ValueError: for text not in that format.
    """
    cores: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return cores


def _quit_all(workers: list[Worker], timeout_s: float) -> None:
    """Tell every done worker to exit, then wait for all: their teardowns run at once, on their
    startup cores, after the last timed block of the round."""
    for worker in workers:
        try:
            os.write(worker.to_worker, QUIT)
        except OSError:  # it died: nothing to tell
            pass
    for worker in workers:
        _finish(worker, timeout_s)


def _start(label: str, argv: list[str], env: dict, cwd: str | None, cores: set[int] | None) -> Worker:
    go_read, go_write = os.pipe()  # parent -> worker: g
    say_read, say_write = os.pipe()  # worker -> parent: r, y, x, a phase
    stdout = tempfile.TemporaryFile("w+", errors="replace")
    stderr = tempfile.TemporaryFile("w+", errors="replace")
    env = {**env, TURNS_VARIABLE: f"{go_read},{say_write}"}
    try:
        with pinned_thread(cores):
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
def pinned_thread(cores: int | set[int] | None):
    """Inside: the calling thread on CPU core ``cores`` (one, or a set; Linux: a thread's own
    affinity), so that a process it starts inherits them from its first instruction; restored
    after.  Nothing for ``None``."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cores} if isinstance(cores, int) else cores)
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
        return DIED
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
        return DIED
    return os.read(worker.from_worker, 1)  # DIED (end of file) when it died


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
