"""``numba-pool info``: device, driver, versions, the configuration in effect and the pool's
attributes."""

from __future__ import annotations

import sys

import click

from .errors import Failure, gpu_available, load_config, require_gpu


@click.command()
def info() -> None:
    """Device, driver, versions, the configuration in effect and the pool's attributes.

    Exit status 0; 2 for a bad ``NUMBA_POOL_*`` variable (one line naming it); 3 without a CUDA
    GPU, after the versions and the configuration, which are then known to be good.
    """
    config = load_config()
    from numba import cuda
    from tabulate import tabulate

    import numba_pool

    rows = _version_rows() + [(f"config: {k}", v) for k, v in config.describe().items()]
    if not gpu_available():
        click.echo(tabulate(rows, tablefmt="plain"))
        require_gpu()
    numba_pool.install()
    device_rows = _device_rows(cuda.current_context().device)
    click.echo(tabulate(device_rows + rows + _pool_rows(numba_pool.stats()), tablefmt="plain"))


def _version_rows() -> list[tuple[str, str]]:
    """Python's version and those of numba, numba-cuda, cuda-bindings and numba-pool."""
    import numba
    import numba_cuda
    from cuda import bindings

    import numba_pool

    return [("python", sys.version.split()[0]), ("numba", numba.__version__), ("numba-cuda", numba_cuda.__version__),
            ("cuda-bindings", bindings.__version__), ("numba-pool", numba_pool.__version__)]


def _device_rows(device) -> list[tuple[str, str]]:
    """The device (ordinal and name), its compute capability and the driver's CUDA version."""
    driver_version = _driver_version()
    name = device.name.decode() if isinstance(device.name, bytes) else device.name
    return [("device", f"{device.id}: {name}"),
            ("compute capability", ".".join(map(str, device.compute_capability))),
            ("driver (CUDA version)", f"{driver_version // 1000}.{driver_version % 1000 // 10}")]


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
