"""``numba-pool info``: device, driver, per-device managed memory, versions, configuration, pool attributes."""

from __future__ import annotations

import os
import sys

import click

from ..cuda import driver as _driver
from ..cuda import frontend as frontends
from ..cuda.errors import CudaAPIError
from ..cuda.mempool import concurrent_managed_access
from ..plugin.managed_memory import why_not_served
from .errors import Failure, gpu_available, load_config, require_gpu, tools_frontend


@click.command()
def info() -> None:
    """Device, driver, who serves ``cuda.managed_array`` on each device and why, versions, both
    frontends (installed or not; the tools' choice and why), the doors onto the pool, the configuration
    in effect and the pool's attributes.  Imports no frontend but the one in use.

    Exit status 0; 2 for a bad ``NUMBA_POOL_*`` variable or a frontend not installed; 3 without a
    CUDA GPU, after the versions and the configuration."""
    config = load_config()
    from tabulate import tabulate

    import numba_pool

    rows = (_version_rows() + _frontend_rows(*_tools_choice()) + _door_rows(config)
            + [(f"config: {k}", v) for k, v in config.describe().items()])
    try:
        available = gpu_available()
    except Failure:  # the frontend to use is not installed: what is here, then why
        click.echo(tabulate(rows, tablefmt="plain"))
        raise
    if not available:
        click.echo(tabulate(rows, tablefmt="plain"))
        require_gpu()
    frontend = tools_frontend()
    numba_pool.install(frontend=frontend.name)
    device_rows = _device_rows(frontend.cuda.current_context().device) + _managed_rows(config)
    pool_rows = _pool_rows(numba_pool.stats(frontend=frontend.name))
    click.echo(tabulate(device_rows + rows + pool_rows, tablefmt="plain"))


def _version_rows() -> list[tuple[str, str]]:
    """Python's version, numba-pool's (and whether its compiled module is built) and cuda-bindings'."""
    import numba_pool

    try:
        from ..cuda import _native  # noqa: F401 - its presence is the row
        built = True
    except ImportError:
        built = False
    return [("python", sys.version.split()[0]), ("numba-pool", numba_pool.__version__),
            ("compiled module", "built: the hot paths' driver calls and PyTorch's callbacks in C" if built
             else "not built (no C compiler at install): cuda-python's functions and ctypes callbacks"),
            ("cuda-bindings", frontends.version("cuda-bindings") or "not installed")]


#: What ``info`` shows beside each frontend's own distribution: numba-cuda runs on numba.
ALSO_SHOWN = {frontends.NUMBA_CUDA: ("numba",), frontends.MLIR: ()}


def _tools_choice(environ=os.environ) -> tuple[str | None, str]:
    """:func:`~numba_pool.cuda.frontend.tools_choice`, its bad variable as the command's error.
    :raises Failure: when ``NUMBA_POOL_FRONTEND`` names no frontend."""
    try:
        return frontends.tools_choice(environ)
    except frontends.FrontendError as err:
        raise Failure(str(err)) from None


def _frontend_rows(chosen: str | None, why: str) -> list[tuple[str, str]]:
    """One row per frontend (installed or not, versions, module) and one for the tools' choice and why."""
    installed = frontends.installed()
    rows = []
    for name in frontends.NAMES:
        if name in installed:
            own = frontends.DISTRIBUTIONS[name]
            versions = [f"{own} {frontends.version(own) or '(version unknown)'}"]
            versions += [f"{d} {v}" for d in ALSO_SHOWN[name] if (v := frontends.version(d))]
            state = f"installed: {', '.join(versions)} ({frontends.PACKAGES[name]})"
        else:
            state = f"not installed ({frontends.EXTRAS[name]})"
        rows.append((f"frontend {name}", state))
    if chosen is None:
        used = "none"
    else:
        used = chosen if frontends.TITLES[chosen] == chosen else f"{chosen} ({frontends.TITLES[chosen]})"
    rows.append(("frontend in use", f"{used}: {why}"))
    return rows


def _door_rows(config) -> list[tuple[str, str]]:
    """One row per door onto the pool (issue 35): Numba's EMM plugin, cuda.core's resource (installed by
    the manager unless ``NUMBA_POOL_CUDA_CORE=0``), and CuPy's and PyTorch's, which a program installs."""
    def library(distribution: str, call: str) -> str:
        version = frontends.version(distribution)
        return f"{distribution} {version}: a program calls {call}" if version else f"{distribution} not installed"

    cupy = next((d for d in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if frontends.version(d)), "cupy-cuda13x")
    return [("door numba", "Numba's memory manager (EMM plugin)"),
            ("door cuda.core", "Numba's launches (Device.memory_resource)" if config.cuda_core
             else "off (NUMBA_POOL_CUDA_CORE=0): Numba's launches use cuda.core's own pool"),
            ("door cupy", library(cupy, "cupy.cuda.set_allocator(numba_pool.cupy_allocator)")),
            ("door torch", library("torch", "torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())"))]


def _device_rows(device) -> list[tuple[str, str]]:
    """The device (ordinal and name), its compute capability and the driver's CUDA version."""
    driver_version = _driver_version()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    return [("device", f"{device.id}: {name}"),
            ("compute capability", ".".join(map(str, device.compute_capability))),
            ("driver (CUDA version)", f"{driver_version // 1000}.{driver_version % 1000 // 10}")]


#: Who serves ``cuda.managed_array`` where numba_pool does not.
NUMBA_MANAGED = "managed arrays from Numba's own path (cuMemAllocManaged/cuMemFree per array)"


def _managed_rows(config) -> list[tuple[str, str]]:
    """One row per device: who serves its managed arrays and why (:func:`why_not_served`); no context made elsewhere.
    :raises Failure: when the driver refuses a query."""
    cu = _driver.cu
    try:
        count = _driver.check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        access = [concurrent_managed_access(cu, device_id) for device_id in range(count)]
    except CudaAPIError as err:
        raise Failure(str(err)) from None
    facts = [(concurrent, why_not_served(cu, device_id, config, concurrent)) for device_id, concurrent in enumerate(access)]
    served = ("numba_pool serves managed arrays from cuMemAllocManaged, blocks cached "
              "(host-attached ones, attach_global=False, stay Numba's)")
    return [(f"managed on device {device_id}",
             f"concurrent managed access: {'yes' if concurrent else 'no'}; "
             + (f"{NUMBA_MANAGED}: {reason}" if reason else served))
            for device_id, (concurrent, reason) in enumerate(facts)]


def _pool_rows(stats) -> list[tuple[str, str]]:
    """The pool's reserved and used bytes and their high watermarks (:func:`numba_pool.stats`)."""
    import humanfriendly

    def size(n: int) -> str:
        return f"{humanfriendly.format_size(n, binary=True)} ({n} bytes)"

    return [("pool reserved", size(stats.pool_reserved_bytes)), ("pool reserved high", size(stats.pool_reserved_high)),
            ("pool used", size(stats.pool_used_bytes)), ("pool used high", size(stats.pool_used_high))]


def _driver_version() -> int:
    """The CUDA version the driver supports, e.g. 13000 for 13.0 (``cuDriverGetVersion``)."""
    from cuda.bindings import driver

    err, version = driver.cuDriverGetVersion()
    if err:
        raise Failure(f"cuDriverGetVersion failed with {err.name}")
    return version
