"""What the kernel scripts share: arguments, launch geometry and the closing report."""

from __future__ import annotations

import argparse
import sys

THREADS_PER_BLOCK = 256


def blocks_for(n: int) -> int:
    """Blocks of :data:`THREADS_PER_BLOCK` threads covering ``n`` elements."""
    return (n + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK


def parse_args(description: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--n", type=int, default=1 << 20, help="elements per array (default 2^20)")
    parser.add_argument("--iterations", type=int, default=10, help="allocate/launch/free rounds")
    return parser.parse_args(argv)


def report(name: str, ok: bool, detail: str) -> int:
    """Print one line naming the memory manager in use; return the exit status."""
    from numba import cuda

    manager = type(cuda.current_context().memory_manager).__name__
    print(f"{name}: {'OK' if ok else 'WRONG RESULT'} ({detail}) under {manager}")
    sys.stdout.flush()
    return 0 if ok else 1
