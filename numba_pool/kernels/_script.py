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


def _simulated() -> bool:
    from numba_pool.cuda import simulator

    return simulator.enabled()


def require_gpu(name: str) -> None:
    """Exit with status 2 and one line on standard error when there is no CUDA GPU (Numba's own
    error is a 30-line traceback); under the CUDA simulator the script runs there."""
    from numba import cuda

    if not _simulated() and not cuda.is_available():
        print(f"{name}: no CUDA GPU is available here (numba.cuda.is_available() is False): "
              "this script runs kernels on one", file=sys.stderr)
        raise SystemExit(2)


def parse_args(description: str, argv=None) -> argparse.Namespace:
    """The scripts' arguments; then, unless only ``--help`` was asked for, check numba_pool's
    configuration and that there is a GPU (exit status 2 and one line otherwise)."""
    simulated = _simulated()
    parser = _OneLineParser(description=description)
    parser.add_argument("--n", type=_sizes, default=SIMULATOR_DEFAULTS["n"] if simulated else [1 << 20],
                        help="elements per array, or a comma-separated list cycled through the rounds "
                             "(default 2^20; 1024 under the CUDA simulator)")
    parser.add_argument("--iterations", type=_count(1), default=SIMULATOR_DEFAULTS["iterations"] if simulated else 10,
                        help="allocate/launch/free rounds (default 10; 3 under the CUDA simulator)")
    parser.add_argument("--keep", type=_count(0), default=0,
                        help="keep the last K arrays alive (a pipeline's window) instead of freeing each at once")
    parser.add_argument("--summary", action="store_true",
                        help="print numba_pool.memory_summary() at the end (when numba_pool is the memory manager)")
    args = parser.parse_args(argv)
    check_configuration(parser.prog)
    require_gpu(parser.prog)
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


def report(name: str, ok: bool, detail: str, summary: bool = False) -> int:
    """Print one line naming the memory manager in use (the CUDA simulator has none) and, with
    ``summary``, numba_pool's memory summary (or one line saying why there is none); return the
    exit status."""
    from numba import cuda

    if _simulated():
        manager = "the CUDA simulator (no memory manager)"
    else:
        manager = type(cuda.current_context().memory_manager).__name__
    print(f"{name}: {'OK' if ok else 'WRONG RESULT'} ({detail}) under {manager}")
    if summary:
        _print_summary()
    sys.stdout.flush()
    return 0 if ok else 1


def _print_summary() -> None:
    import numba_pool

    try:
        print(numba_pool.memory_summary())
    except RuntimeError as err:  # numba_pool is not the memory manager: its one line says why
        print(f"no memory summary: {err}")
