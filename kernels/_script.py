"""What the kernel scripts share: arguments, launch geometry and the closing report."""

from __future__ import annotations

import argparse
import sys
from collections import deque

THREADS_PER_BLOCK = 256


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
    return sizes


def _frontend_name(text: str) -> str:
    from numba_pool.cuda.frontend import FrontendError, parse_name

    try:
        return parse_name(text, "--frontend")
    except FrontendError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a frontend: expected 'numba-cuda' (numba.cuda) or 'mlir' "
                                         "(numba_cuda_mlir.cuda)") from None


def frontend_for(name: str, chosen: str | None):
    """The frontend the script runs on: ``chosen`` (``--frontend``'s), else the tools' choice
    (``NUMBA_POOL_FRONTEND``, else the one installed); imported now.  Exit with status 2 and
    one line when it is not installed, or ``NUMBA_POOL_FRONTEND`` names none."""
    from numba_pool.cuda import frontend as frontends

    try:
        return frontends.named(chosen, "--frontend")
    except frontends.FrontendError as err:
        print(f"{name}: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def require_gpu(name: str, frontend) -> None:
    """Exit with status 2 and one line on standard error when there is no CUDA GPU (Numba's own
    error is a 30-line traceback); under numba-cuda's CUDA simulator the script runs there."""
    from numba_pool.cuda.frontend import PACKAGES

    if not frontend.simulator and not frontend.cuda.is_available():
        print(f"{name}: no CUDA GPU is available here ({PACKAGES[frontend.name]}.is_available() is False): "
              "this script runs kernels on one", file=sys.stderr)
        raise SystemExit(2)


def parse_args(description: str, argv=None) -> argparse.Namespace:
    """The scripts' arguments; then, unless only ``--help`` was asked for, check numba_pool's
    configuration, the frontend and that there is a GPU (exit status 2 and one line otherwise).
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
    check_configuration(parser.prog)
    args.frontend = frontend_for(parser.prog, args.frontend)
    defaults = SIMULATOR_DEFAULTS if args.frontend.simulator else {"n": [1 << 20], "iterations": 10}
    for option, value in defaults.items():
        if getattr(args, option) is None:
            setattr(args, option, value)
    require_gpu(parser.prog, args.frontend)
    if args.snapshot is not None:
        import numba_pool

        numba_pool.record_history()
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
        print(f"{name}: {err}", file=sys.stderr)
        raise SystemExit(2) from None


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
    ``stats()``'s."""
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
    if snapshot is not None:
        _write_snapshot(snapshot, frontend)
    sys.stdout.flush()
    return 0 if ok else 1


def _print_summary(frontend) -> None:
    import numba_pool

    try:
        print(numba_pool.memory_summary(frontend=frontend.name))
    except RuntimeError as err:  # numba_pool is not the memory manager: its one line says why
        print(f"no memory summary: {err}")


def _write_snapshot(path: str, frontend) -> None:
    import gc

    import numba_pool

    # Arrays the script dropped but a reference cycle still holds are freed by the garbage
    # collector at a moment of its own; collect first, so the snapshot shows what the script
    # keeps (the GPU test counts them) whatever that moment was.
    gc.collect()
    try:
        stats = numba_pool.stats(frontend=frontend.name)
    except RuntimeError as err:  # numba_pool is not the memory manager: its one line says why
        print(f"no snapshot: {err}")
        return
    from numba_pool.observe.snapshot import dump, summarize

    snapshot = numba_pool.snapshot()
    dump(snapshot, path)
    totals = summarize(snapshot)
    reserved, allocated = totals["reserved"], totals["allocated"]
    print(f"snapshot: {path}: {len(snapshot['segments'])} segments, reserved {reserved} bytes, allocated {allocated} "
          f"bytes; stats: reserved {stats.pool_reserved_bytes + stats.host_reserved_bytes + stats.managed_reserved_bytes} "
          f"bytes, in use {stats.bytes_in_use} bytes")
