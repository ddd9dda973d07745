"""What the kernel scripts share: arguments, launch geometry, the closing report, and how a script ends.

Exit statuses, as ``numba-pool``'s and ``numba-pool-tools``': 0 done, 1 a wrong result, 2 bad input (an argument,
a ``NUMBA_POOL_*`` variable, a frontend not installed, arrays too large for the memory there is, a snapshot the
setup cannot write), 3 no CUDA GPU (or a snapshot asked for under the CUDA simulator, which has no memory manager
to take one from).  Each error and warning is one line on standard error naming the script, no traceback."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections import deque

THREADS_PER_BLOCK = 256
#: Exit statuses (module docstring).
BAD_INPUT, NO_GPU = 2, 3
#: Bytes of the smallest host copy every script makes of an element (a float32): what ``--n`` is checked against.
ELEMENT_BYTES = 4


def blocks_for(n: int) -> int:
    """Blocks of :data:`THREADS_PER_BLOCK` threads covering ``n`` elements."""
    return (n + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK


#: Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) kernels run in Python, one thread
#: at a time: the defaults shrink so that a script finishes in seconds.
SIMULATOR_DEFAULTS = {"n": [1024], "iterations": 3}


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments as one line naming the argument and its value (argparse's own error adds
    the usage line), exit status 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _count(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r}: must be at least {least}")
        return value
    return parse


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of element counts") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: element counts must be positive")
    _check_fits(max(sizes), text)
    return sizes


def _check_fits(n: int, text: str) -> None:
    """Refuse, before any work, ``n`` elements whose host copy alone exceeds this machine's memory (numpy would
    raise its ``_ArrayMemoryError`` from deep inside a round, under the simulator for the "device" array too)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not known here: MemoryError is still caught by run()
        return
    needed = n * ELEMENT_BYTES
    if needed > memory:
        raise argparse.ArgumentTypeError(f"{text!r}: {n:,} elements of {ELEMENT_BYTES} bytes take {_gib(needed)}, "
                                         f"more than this machine's memory ({_gib(memory)})")


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):,.1f} GiB"


def _frontend_name(text: str) -> str:
    from numba_pool.cuda.frontend import FrontendError, parse_name

    try:
        return parse_name(text, "--frontend")
    except FrontendError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a frontend: expected 'numba-cuda' (numba.cuda) or 'mlir' "
                                         "(numba_cuda_mlir.cuda)") from None


def fail(name: str, message: str, status: int = BAD_INPUT):
    """Exit with ``status`` after one line on standard error, ``NAME: message``."""
    print(f"{name}: {message}", file=sys.stderr)
    raise SystemExit(status)


def frontend_for(name: str, chosen: str | None):
    """The frontend the script runs on: ``chosen`` (``--frontend``'s), else the tools' choice
    (``NUMBA_POOL_FRONTEND``, else the one installed); imported now.  Exit with status 2 and
    one line when it is not installed, or ``NUMBA_POOL_FRONTEND`` names none."""
    from numba_pool.cuda import frontend as frontends

    try:
        return frontends.named(chosen, "--frontend")
    except frontends.FrontendError as err:
        fail(name, str(err))


def require_gpu(name: str, frontend) -> None:
    """Exit with status 3 and one line on standard error when there is no CUDA GPU (Numba's own
    error is a 30-line traceback); under numba-cuda's CUDA simulator the script runs there."""
    from numba_pool.cuda.frontend import PACKAGES

    if not frontend.simulator and not frontend.cuda.is_available():
        fail(name, f"no CUDA GPU is available here ({PACKAGES[frontend.name]}.is_available() is False): "
                   "this script runs kernels on one", NO_GPU)


def snapshot_path(parser: argparse.ArgumentParser, path: str) -> str:
    """``--snapshot``'s file, tried before any work (:func:`numba_pool.config.parse_path`, creating nothing), so
    that an unwritable path fails now, not after the run; exit status 2 and one line otherwise."""
    from numba_pool.config import ConfigError, parse_path

    try:
        return parse_path(path, "--snapshot", "a snapshot file (a pickle)")
    except ConfigError as err:
        parser.error(str(err))


def start_history(name: str, frontend) -> None:
    """Record the allocation history for ``--snapshot``; where numba_pool refuses to (a RuntimeError: nothing to
    record), exit before running, with the reason in one line: status 3 under the simulator, else 2."""
    import numba_pool

    try:
        numba_pool.record_history()
    except RuntimeError as err:
        fail(name, f"--snapshot: no snapshot can be written: {err}", NO_GPU if frontend.simulator else BAD_INPUT)


def parse_args(description: str, argv=None) -> argparse.Namespace:
    """The scripts' arguments; then, unless only ``--help`` was asked for, check ``--snapshot``'s path, numba_pool's
    configuration, the frontend (exit status 2 and one line otherwise) and that there is a GPU (3), in that order.
    ``args.frontend`` is the :class:`~numba_pool.cuda.frontend.Frontend` to run on."""
    parser = _OneLineParser(description=description)
    parser.add_argument("--n", type=_sizes, default=None,
                        help="elements per array, or a comma-separated list cycled through the rounds "
                             "(default 2^20; 1024 under the CUDA simulator)")
    parser.add_argument("--iterations", type=_count(1), default=None,
                        help="allocate/launch/free rounds (default 10; 3 under the CUDA simulator)")
    parser.add_argument("--keep", type=_count(0), default=0,
                        help="keep the last K arrays alive (a pipeline's window) instead of freeing each at once")
    parser.add_argument("--summary", action="store_true",
                        help="print numba_pool.memory_summary() at the end (when numba_pool is the memory manager)")
    parser.add_argument("--snapshot", metavar="FILE", default=None,
                        help="record the allocation history and write a snapshot to FILE at the end "
                             "(numba_pool.dump_snapshot: PyTorch's memory viewer reads it)")
    parser.add_argument("--frontend", type=_frontend_name, default=None,
                        help="the Numba CUDA frontend: numba-cuda (numba.cuda) or mlir (numba_cuda_mlir.cuda) "
                             "(default: NUMBA_POOL_FRONTEND, else the one installed, numba-cuda first)")
    args = parser.parse_args(argv)
    if args.snapshot is not None:
        args.snapshot = snapshot_path(parser, args.snapshot)
    check_configuration(parser.prog)
    args.frontend = frontend_for(parser.prog, args.frontend)
    defaults = SIMULATOR_DEFAULTS if args.frontend.simulator else {"n": [1 << 20], "iterations": 10}
    for option, value in defaults.items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    require_gpu(parser.prog, args.frontend)
    if args.snapshot is not None:
        start_history(parser.prog, args.frontend)
    return args


def check_configuration(name: str) -> None:
    """Exit with status 2 and numba_pool's one-line message when a ``NUMBA_POOL_*`` variable is
    bad, before Numba would raise it from deep inside its first allocation."""
    import os

    if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") != "numba_pool":
        return
    from numba_pool.config import ConfigError, load

    try:
        load()
    except ConfigError as err:
        fail(name, str(err))


class Window:
    """Keeps the last ``keep`` arrays alive (none when ``keep`` is 0), like a pipeline holding
    its recent results."""

    def __init__(self, keep: int):
        self.items = deque(maxlen=keep) if keep > 0 else None

    def add(self, item) -> None:
        if self.items is not None:
            self.items.append(item)


def report(name: str, ok: bool, detail: str, summary: bool = False, frontend=None, snapshot: str | None = None) -> int:
    """Print one line naming the memory manager in use (the CUDA simulator has none) and the
    frontend, ``sqrt: OK (1048576 elements x 10) under NumbaPoolManager, frontend numba-cuda``,
    and, with ``summary``, numba_pool's memory summary (or one line saying why there is none);
    return the exit status.  ``frontend``: the one the script ran on (None: the tools').
    ``snapshot``: a file to write numba_pool's snapshot to, with one line of its totals and
    ``stats()``'s; where none can be written, one line on standard error says why, and the
    status is 3 under the simulator, else 2 (a wrong result's 1 comes first)."""
    if frontend is None:
        from numba_pool.cuda.frontend import for_tools

        frontend = for_tools()
    if frontend.simulator:
        manager = "the CUDA simulator (no memory manager)"
    else:
        manager = type(frontend.cuda.current_context().memory_manager).__name__
    print(f"{name}: {'OK' if ok else 'WRONG RESULT'} ({detail}) under {manager}, frontend {frontend.title}")
    if summary:
        _print_summary(frontend)
    status = _write_snapshot(name, snapshot, frontend) if snapshot is not None else 0
    sys.stdout.flush()
    return status if ok else 1


def _print_summary(frontend) -> None:
    import numba_pool

    try:
        print(numba_pool.memory_summary(frontend=frontend.name))
    except RuntimeError as err:  # numba_pool is not the memory manager: its one line says why
        print(f"no memory summary: {err}")


def _write_snapshot(name: str, path: str, frontend) -> int:
    """Write the snapshot to ``path``; the exit status: 0, or, with one line on standard error, why none was written:
    3 under the simulator (no memory manager to take it from), 2 otherwise (numba_pool not the memory manager, or
    the file became unwritable)."""
    import gc

    import numba_pool

    # Arrays the script dropped but a reference cycle still holds are freed by the garbage
    # collector at a moment of its own; collect first, so the snapshot shows what the script
    # keeps (the GPU test counts them) whatever that moment was.
    gc.collect()
    try:
        stats = numba_pool.stats(frontend=frontend.name)
    except RuntimeError as err:  # numba_pool is not the memory manager: its one line says why
        print(f"{name}.py: --snapshot: no snapshot written to {path}: {err}", file=sys.stderr)
        return NO_GPU if frontend.simulator else BAD_INPUT
    from numba_pool.observe.snapshot import dump, summarize

    snapshot = numba_pool.snapshot()
    try:
        dump(snapshot, path)
    except OSError as err:  # the path was checked at the start; the disk may have changed since
        print(f"{name}.py: --snapshot: cannot write {path}: {err.strerror or err}", file=sys.stderr)
        return BAD_INPUT
    totals = summarize(snapshot)
    reserved, allocated = totals["reserved"], totals["allocated"]
    print(f"snapshot: {path}: {len(snapshot['segments'])} segments, reserved {reserved} bytes, allocated {allocated} "
          f"bytes; stats: reserved {stats.pool_reserved_bytes + stats.host_reserved_bytes + stats.managed_reserved_bytes} "
          f"bytes, in use {stats.bytes_in_use} bytes")
    return 0


def run(main) -> int:
    """What ``python kernels/NAME.py`` runs: ``main()``'s exit status, with each warning as one line naming the
    script (not a frame of the checkout or of runpy), and memory running out as one line, exit status 2.  Called
    before numba_pool is imported (``kernels`` imports it lazily): its import-time warnings are shown so too."""
    name = os.path.basename(sys.argv[0]) or "kernel script"
    with warnings.catch_warnings():  # restored after: main() may run inside another program
        warnings.showwarning = lambda message, *_: print(f"{name}: warning: {message}", file=sys.stderr)
        try:
            return main()
        except Exception as err:
            if not _out_of_memory(err):
                raise
            fail(name, f"out of memory: {' '.join(str(err).split())}: try a smaller --n")


def _out_of_memory(err: BaseException) -> bool:
    """Host memory running out (numpy's MemoryError, under the simulator for "device" arrays too), or the GPU's (a
    CUDA_ERROR_OUT_OF_MEMORY, raised as each frontend's own CudaAPIError class, hence its message read)."""
    return isinstance(err, MemoryError) or "CUDA_ERROR_OUT_OF_MEMORY" in str(err)
