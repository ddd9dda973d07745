"""Unpickling a snapshot file's bytes for :mod:`~numba_pool_tools.snapshot.load`: plain data only, and only
once a throwaway process has shown that unpickling them ends, within bounded memory and time.

Plain data only: a pickle that names a class or a function (which could run code when loaded) is refused
(:class:`NotPlainData`).  That is not enough: CPython's unpickler itself can be made to do unbounded work by a
file of a few bytes, before any check of what it builds can run, and without ever returning to Python code:

- a memo index is a number in the file, and the unpickler sizes its memo table to twice it: seven bytes
  (``None``, then ``LONG_BINPUT`` at 2**28) take 4 GiB and 20 s;
- a tuple used as a dict key is hashed whole, and a pickle shares references: forty tuples each holding
  the one before twice, about 300 bytes, take 2**40 steps to hash, and the unpickler never returns;
- a tuple nested 300,000 deep used as a key is hashed recursively in C, and the interpreter crashes (SIGSEGV).

No hook of the unpickler sees these (it calls back into Python only to read its input and to look up
classes), and no signal handler runs inside them.  So, where ``os.fork`` exists, :func:`plain_data` first
unpickles the bytes in a forked child with its address space limited (Linux: ``RLIMIT_AS``, to what it has
plus :func:`memory_budget`) and its time bounded (:func:`time_budget`: the parent kills it; ``RLIMIT_CPU``
too, should the parent die first).  The child's end is all that is used: it finished (the data, or an
exception such as a bad opcode), ran out of memory, ran out of time, or was killed by a signal.  Only when it
finished does this process unpickle the same bytes itself, which then does the same, bounded, work.  Without
``os.fork`` (Windows) the bytes are unpickled here directly, with only the bound on the file's size.

Both unpicklings run with the garbage collector off: plain data need not be collected while it is built,
and a 60 MB snapshot unpickles in 1.1 s instead of 2.6 s.
"""

from __future__ import annotations

import faulthandler
import gc
import io
import math
import os
import pickle
import selectors
import signal
import warnings

try:
    import resource  # imported here, not in the child: an import there could wait on a lock a thread held
except ImportError:  # Windows: no fork either
    resource = None

#: The child's memory beyond what it shares with this process, for any file, and per byte of the file: a
#: numba_pool or PyTorch snapshot takes about 10 bytes of memory for each byte of its pickle.
MEMORY_FLOOR = 128 << 20
MEMORY_PER_BYTE = 32
#: The child's CPU time, for any file, and per byte of the file: a snapshot unpickles at 25 to 60 MB/s.
SECONDS_FLOOR = 1.0
BYTES_PER_SECOND = 4 << 20
#: The parent's wait, in seconds of wall-clock time per second of the child's CPU time: on a loaded machine the
#: child may wait for a CPU; its CPU limit (``RLIMIT_CPU``), not the clock, stops a pickle that computes.
WALL_PER_CPU_SECOND = 3
#: The child's exit statuses: it finished unpickling (the data, or an exception), ran out of memory, or
#: failed before it began (a bug here).
_FINISHED, _OUT_OF_MEMORY, _NOT_BEGUN = 0, 3, 4


class NotPlainData(pickle.UnpicklingError):
    """The pickle names a class or a function."""


class Unbounded(Exception):
    """Unpickling the bytes ran out of the child's memory or time, or killed it: the message says which."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise NotPlainData(f"it names {module}.{name}, and only plain data (dicts, lists, strings, numbers) is read")


def memory_budget(size: int) -> int:
    """Bytes the child may allocate to unpickle a file of ``size`` bytes."""
    return MEMORY_FLOOR + MEMORY_PER_BYTE * size


def time_budget(size: int) -> float:
    """Seconds the child may take to unpickle a file of ``size`` bytes."""
    return SECONDS_FLOOR + size / BYTES_PER_SECOND


def plain_data(data: bytes):
    """The plain data pickled in ``data``.

    :raises Unbounded: unpickling them in a child took more than :func:`memory_budget` or :func:`time_budget`,
        or a signal killed it.
    :raises NotPlainData: the pickle names a class or a function.
    :raises Exception: whatever else the unpickler raises on bytes that are no pickle (EOFError when cut short).
    """
    if hasattr(os, "fork"):
        _try_in_a_child(data, memory_budget(len(data)), time_budget(len(data)))
    return _unpickled(data)


def _unpickled(data: bytes):
    collecting = gc.isenabled()
    gc.disable()  # plain data needs no collection while it is built (it is collected as usual after)
    try:
        return _PlainData(io.BytesIO(data)).load()
    finally:
        if collecting:
            gc.enable()


def _try_in_a_child(data: bytes, memory: int, seconds: float) -> None:
    """Unpickle ``data`` in a forked child limited to ``memory`` more bytes and ``seconds`` of CPU time (the wall
    clock: :data:`WALL_PER_CPU_SECOND` times that); raise :class:`Unbounded` unless it finished."""
    read_end, write_end = os.pipe()  # its write end closes when the child ends, however it ends
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns when forking a process with threads, as a lock another thread holds stays
            # held in the child; the child only unpickles (malloc's locks are reset at a fork) and exits.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as err:
        os.close(read_end)
        os.close(write_end)
        raise Unbounded(f"cannot start the process to unpickle it in first, within bounds ({err.strerror or err})")
    if pid == 0:
        os.close(read_end)
        _child(data, memory, seconds, write_end)  # does not return
    os.close(write_end)
    ended = False
    try:
        with selectors.DefaultSelector() as selector:  # not select.select: it refuses descriptors above 1023
            selector.register(read_end, selectors.EVENT_READ)
            ended = bool(selector.select(seconds * WALL_PER_CPU_SECOND))
    finally:
        os.close(read_end)
        if not ended:
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    most = f"the most for a file of {len(data):,} bytes"
    if not ended or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == getattr(signal, "SIGXCPU", None)):
        raise Unbounded(f"unpickling it takes more than {seconds:.1f} s, {most}")
    if os.WIFSIGNALED(status):
        name = _signal_name(os.WTERMSIG(status))
        if name in ("SIGSEGV", "SIGBUS"):
            raise Unbounded(f"unpickling it crashes the interpreter ({name}: a structure nested too deep?)")
        raise Unbounded(f"unpickling it kills the interpreter ({name})")
    if os.WEXITSTATUS(status) == _OUT_OF_MEMORY:
        raise Unbounded(f"unpickling it takes more than {memory >> 20:,} MiB of memory, {most}")
    if os.WEXITSTATUS(status) != _FINISHED:
        raise Unbounded(f"the process to unpickle it in first, within bounds, failed (exit status "
                        f"{os.WEXITSTATUS(status)}); a bug of numba-pool-tools")


def _child(data: bytes, memory: int, seconds: float, write_end: int) -> None:
    """The forked child: unpickle ``data`` within the limits, then leave at once (no cleanup: the
    parent's buffers and exit handlers are not the child's to run); ``write_end``, the pipe the
    parent waits on, stays open until then."""
    status = _NOT_BEGUN
    try:
        _silenced(write_end)
        _limited(memory, seconds)
        gc.disable()
        status = _FINISHED
        _PlainData(io.BytesIO(data)).load()
    except MemoryError:
        status = _OUT_OF_MEMORY if status == _FINISHED else _NOT_BEGUN
    except BaseException:  # noqa: BLE001  (the parent meets the same exception when it unpickles)
        pass
    finally:
        os._exit(status)


def _silenced(write_end: int) -> None:
    """Nothing of the child's reaches the user: a crash's report (``faulthandler``, a fatal error) included.
    (A process started with its standard output or error closed has the pipe there: it stays.)"""
    faulthandler.disable()
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        if fd != write_end:
            os.dup2(devnull, fd)


def _limited(memory: int, seconds: float) -> None:
    """Limit this process's address space to its size now plus ``memory`` (where Linux says its size),
    its CPU time to ``seconds`` (rounded up to whole seconds: ``SIGXCPU`` then), and its core
    dumps to none (a crash here is expected, and a core of a large process slow to write).  A limit
    that cannot be set is left as it is: the parent still bounds the wall-clock time."""
    def lower(limit: int, value: int) -> None:
        soft, hard = resource.getrlimit(limit)
        value = min([value, *(v for v in (soft, hard) if v != resource.RLIM_INFINITY)])
        try:
            resource.setrlimit(limit, (value, hard))
        except (OSError, ValueError):
            pass

    lower(resource.RLIMIT_CORE, 0)
    lower(resource.RLIMIT_CPU, math.ceil(seconds))
    try:
        with open("/proc/self/statm") as f:
            address_space = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: only the time bounds the child (RLIMIT_AS is not enforced on macOS)
        return
    lower(resource.RLIMIT_AS, address_space + memory)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
