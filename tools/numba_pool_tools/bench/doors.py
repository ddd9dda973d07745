"""The doors' cost (issue 35): µs per allocate+free through numba_pool's door for cuda.core, CuPy and PyTorch
against that library's own allocator and RMM's allocator for it, where installed.

``python -m numba_pool_tools.bench.doors [--rounds N] [--pairs N]`` on a GPU machine, with numba_pool as
Numba's memory manager (it sets ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` for its children).

Method.  All libraries' allocators are measured in one interleaved run: round ``r`` runs :data:`PAIRS` pairs
per allocator, for every size and every library in turn, each library's allocators in an order rotated by ``r``;
a round's difference ``door - own`` is paired.  The table gives each allocator's median µs per pair and the median
difference.  A library's rounds are so spread over the whole run, and a round's figures are milliseconds apart: the
host's slow spells (all code about twice as slow, for seconds, on one core; docs/perf-notes.md) hit both sides of a
pair alike, and only the rounds inside them.  cuda.core and CuPy switch allocators in the bench's process; PyTorch
takes one allocator per process, so each of its allocators has a child process, started at once and kept, that runs
a round's pairs when asked.  A pair is the library's own call: ``Buffer`` allocate and ``close`` (cuda.core), the
allocator CuPy would call (``cupy.cuda.set_allocator``'s) and the drop of its ``MemoryPointer`` (CuPy),
``torch.empty(..., device="cuda")`` and its drop (PyTorch)."""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial

SIZES = [256, 64 << 10, 4 << 20]
ROUNDS = 21
PAIRS = 1000
#: The door's row and the library's own, per library (the difference the issue bounds at 2 µs).
OWN = {"cuda.core": "DeviceMemoryResource", "cupy": "MemoryPool", "torch": "caching allocator"}


def _timed(pair, size: int, pairs: int) -> float:
    start = time.perf_counter()
    for _ in range(pairs):
        pair(size)
    return (time.perf_counter() - start) / pairs * 1e6


def _interleave(libraries: dict, rounds: int, pairs: int) -> dict:
    """``{library: {size: {name: [µs per pair, one per round]}}}`` for ``libraries``, ``{library: (timers,
    synchronize)}`` where ``timer(size, pairs)`` runs ``pairs`` pairs and returns µs per pair.  Round ``r`` runs
    every size of every library, each library's allocators in an order rotated by ``r``: a library's rounds are
    spread over the whole run, and a round's figures are milliseconds apart."""
    out = {library: {size: {name: [] for name in timers} for size in SIZES}
           for library, (timers, _) in libraries.items()}
    for size in SIZES:
        for timers, synchronize in libraries.values():
            for timer in timers.values():  # warm-up: each allocator's pool holds a block of the size
                timer(size, pairs // 10 + 1)
            synchronize()
    for r in range(rounds):
        for size in SIZES:
            for library, (timers, synchronize) in libraries.items():
                names = list(timers)
                for name in names[r % len(names):] + names[:r % len(names)]:
                    out[library][size][name].append(timers[name](size, pairs))
                    synchronize()
    return out


def _timers(pairs_by_name: dict) -> dict:
    # ``pair(size)`` callables made timers for :func:`_interleave`.
    return {name: partial(_timed, pair) for name, pair in pairs_by_name.items()}


def cuda_core_allocators(stack, named: bool = True) -> tuple:
    """numba_pool's ``MemoryResource`` against cuda.core's ``DeviceMemoryResource``, on one stream made for
    the run (``named``), else on the device's default stream (where Numba's launches on the default stream
    allocate); and the floor of any Python resource: one that hands out a fixed address and frees nothing.
    Returns ``(timers, synchronize)`` for :func:`_interleave`."""
    from .core import cuda
    from cuda.core import Buffer, Device, DeviceMemoryResource, MemoryResource
    import numba_pool

    class Floor(MemoryResource):
        """cuda.core's cost of a ``Buffer`` from a resource written in Python, with no allocator behind it."""

        def allocate(self, size, stream=None):
            return Buffer.from_handle(0x1000, size, mr=self, stream=stream)

        def deallocate(self, ptr, size, stream=None):
            pass

        is_device_accessible, is_host_accessible, device_id = True, False, 0

    cuda.current_context()  # numba_pool is the memory manager from here
    device = Device(0)
    device.set_current()
    stream = device.create_stream() if named else device.default_stream

    def pair_of(resource):
        def pair(size):
            resource.allocate(size, stream=stream).close(stream)
        return pair
    return _timers({"numba_pool": pair_of(numba_pool.MemoryResource(0)),
                    OWN["cuda.core"]: pair_of(DeviceMemoryResource(0)),
                    "floor: a Python resource allocating nothing": pair_of(Floor())}), device.sync


def cupy_allocators(stack) -> tuple:
    """``numba_pool.cupy_allocator`` against CuPy's ``MemoryPool`` and ``MemoryAsyncPool`` and RMM's; a pair:
    ``allocator(size)``, dropped.  Returns ``(timers, synchronize)``."""
    from .core import cuda
    import cupy
    import numba_pool

    cuda.current_context()
    allocators = {"numba_pool": numba_pool.cupy_allocator, OWN["cupy"]: cupy.cuda.MemoryPool().malloc,
                  "MemoryAsyncPool": cupy.cuda.MemoryAsyncPool().malloc}
    try:
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator
        rmm.reinitialize(pool_allocator=True)
        allocators["RMM pool"] = rmm_cupy_allocator
    except Exception:  # noqa: BLE001 - RMM is an anchor, measured where installed
        pass
    return _timers(allocators), cupy.cuda.runtime.deviceSynchronize


def serve_torch_child(which: str, on_stream: bool = False) -> None:
    """A child's loop: PyTorch with ``which`` allocator (``numba_pool``, ``caching allocator``, ``RMM pool``, the
    floor), its tensors on the default stream or (``on_stream``) on a stream of PyTorch's pool; ``ready`` once
    installed, then for each line ``size pairs`` on standard input, that many pairs timed (µs per pair, then a
    synchronize), until standard input closes."""
    if which not in TORCH_ALLOCATORS:
        raise SystemExit(f"no PyTorch allocator is called {which!r}")
    import torch
    if which == "numba_pool":
        import numba_pool
        torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())
    elif which == TORCH_FLOOR:
        keep = _install_torch_floor()  # noqa: F841 - its callbacks and memory live while the child runs
    elif which == "RMM pool":
        import rmm
        from rmm.allocators.torch import rmm_torch_allocator
        rmm.reinitialize(pool_allocator=True)
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)

    def pair(size):
        torch.empty(size, dtype=torch.uint8, device="cuda")
    if on_stream:
        torch.cuda.set_stream(torch.cuda.Stream())  # (non-blocking, as PyTorch's pooled streams are)
    pair(SIZES[0])
    print("ready", flush=True)
    for line in sys.stdin:
        size, pairs = map(int, line.split())
        took = _timed(pair, size, pairs)
        torch.cuda.synchronize()
        print("took", took, flush=True)


_TOOLS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder holding the tools
ANSWER_TIMEOUT = 300  #: Seconds a child may take to start, or to answer for a round.


class _TorchChild:
    """A child process serving one PyTorch allocator's rounds (:func:`serve_torch_child`).  Its standard output is
    read by a thread into a queue, so that a child that hangs fails the run after :data:`ANSWER_TIMEOUT` seconds; a
    line that is not its answer (a library's print) is skipped."""

    def __init__(self, which: str, on_stream: bool = False):
        self.which = which
        self._said = tempfile.TemporaryFile("w+")  # its standard error: a pipe nobody reads could fill and block it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "numba_pool_tools.bench.doors", "--torch-child", which,
             *(["--on-stream"] if on_stream else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._said, text=True,
            env={**os.environ, "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "PYTHONPATH": os.pathsep.join(
                [_TOOLS, *filter(None, [os.environ.get("PYTHONPATH")])])})
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._answer("ready")

    def __call__(self, size: int, pairs: int) -> float:
        try:
            self.process.stdin.write(f"{size} {pairs}\n")
            self.process.stdin.flush()
        except OSError:  # the child is gone (a broken pipe)
            self._fail("it stopped")
        return float(self._answer("took ").split()[1])

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _answer(self, prefix: str) -> str:
        while True:
            try:
                line = self._lines.get(timeout=ANSWER_TIMEOUT)
            except queue.Empty:
                self._fail(f"no answer in {ANSWER_TIMEOUT} s")
            if line is None:
                self._fail("it stopped")
            if line.startswith(prefix):
                return line

    def _fail(self, what: str):
        self.process.kill()
        self.process.wait()
        self._said.seek(0)
        said = self._said.read().strip().splitlines()[-1:]
        self.close()
        raise RuntimeError(f"torch with {self.which}: no figure ({said or what})")

    def close(self) -> None:
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:  # a broken pipe: the child is gone
                pass
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._said.close()


#: PyTorch's cost of a pluggable allocator whose callbacks do nothing: one address for every tensor.
TORCH_FLOOR = "floor: callbacks allocating nothing"
#: PyTorch's allocators measured, each in a child: the door, the library's own, RMM's, the floor.
TORCH_ALLOCATORS = ("numba_pool", OWN["torch"], "RMM pool", TORCH_FLOOR)


def _install_torch_floor():
    """PyTorch's allocator made :data:`TORCH_FLOOR`: callbacks handing out one device address (a Numba array bigger
    than any size measured; one tensor lives at a time), as numba_pool's door makes them (the compiled module's C
    functions calling Python, else ``ctypes``); returns what must stay alive."""
    import ctypes

    from torch._C import _cuda_customAllocator
    from torch.cuda.memory import _CUDAAllocator, change_current_allocator

    from .core import cuda
    memory = cuda.device_array(max(SIZES), dtype="u1")
    address = memory.device_ctypes_pointer.value
    try:
        from numba_pool.cuda._native import torch_callbacks
        kept = ()
        made = _cuda_customAllocator(*torch_callbacks(lambda *_: address, lambda *_: None))
    except ImportError:
        malloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(lambda *_: address)
        free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(lambda *_: None)
        kept = malloc, free
        made = _cuda_customAllocator(*(ctypes.cast(f, ctypes.c_void_p).value for f in kept))
    change_current_allocator(_CUDAAllocator(made))
    return memory, kept


def torch_allocators(stack, on_stream: bool = False) -> tuple:
    """PyTorch's allocators, each in its child (:class:`_TorchChild`, closed by ``stack``), on the default stream or
    (``on_stream``: the door and PyTorch's own only) on a stream of their own.  Returns ``(timers, synchronize)``:
    each child synchronizes after its pairs."""
    children = {}
    for name in TORCH_ALLOCATORS[:2] if on_stream else TORCH_ALLOCATORS:
        try:
            children[name] = stack.enter_context(contextlib.closing(_TorchChild(name, on_stream)))
        except RuntimeError as err:
            if name == "numba_pool" or name == OWN["torch"]:
                raise
            print(err, file=sys.stderr)  # RMM is an anchor, measured where installed
    return children, lambda: None


LIBRARIES = {"cuda.core, a stream of its own": cuda_core_allocators,
             "cuda.core, the default stream": partial(cuda_core_allocators, named=False),
             "cupy": cupy_allocators, "torch": torch_allocators,
             "torch, a stream of its own": partial(torch_allocators, on_stream=True)}


def measure(rounds: int, pairs: int) -> dict:
    """``{library: figures for render, or the reason it was not measured}``, every installed library's allocators
    interleaved (:func:`_interleave`)."""
    measured, skipped = {}, {}
    with contextlib.ExitStack() as stack:
        for library, allocators in LIBRARIES.items():
            try:
                measured[library] = allocators(stack)
            except (ImportError, RuntimeError) as err:  # not installed, or a PyTorch child that cannot start
                skipped[library] = str(err)
        figures = _interleave(measured, rounds, pairs)
    return {library: figures.get(library, skipped.get(library)) for library in LIBRARIES}


def render(library: str, figures: dict) -> str:
    """A Markdown table: allocator, size, median µs per pair, and the door's paired difference to the own."""
    lines = [f"### {library}", "", "| size | allocator | µs per pair | numba_pool − it, µs |", "|---|---|---|---|"]
    for size, row in figures.items():
        ours = row.get("numba_pool", [])
        for name, values in row.items():
            paired = [a - b for a, b in zip(ours, values)] if name != "numba_pool" and ours else []
            diff = f"{statistics.median(paired):+.2f}" if paired else ""
            lines.append(f"| {size} B | {name} | {statistics.median(values):.2f} | {diff} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m numba_pool_tools.bench.doors", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--pairs", type=int, default=PAIRS)
    parser.add_argument("--torch-child", help=argparse.SUPPRESS)
    parser.add_argument("--on-stream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_child:
        serve_torch_child(args.torch_child, args.on_stream)
        return 0
    os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "numba_pool"
    try:
        measured = measure(args.rounds, args.pairs)
    except RuntimeError as err:  # a PyTorch child that stopped answering
        print(f"python -m numba_pool_tools.bench.doors: {err}", file=sys.stderr)
        return 1
    for library, figures in measured.items():
        print((render(library, figures) if isinstance(figures, dict) else f"### {library}\n\nnot measured: {figures}")
              + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
