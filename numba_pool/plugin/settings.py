"""The configuration in effect for the process's managers (``install()``'s, else the environment's, read at
the first initialization): forwards to the same-named methods of :data:`numba_pool.plugin.state.process`."""

from __future__ import annotations

from .. import config as _config
from .state import process


def config_in_effect() -> _config.PoolConfig:
    """:meth:`ProcessState.config_in_effect <numba_pool.plugin.state.ProcessState.config_in_effect>`.
    :raises ConfigError: when a ``NUMBA_POOL_*`` variable is bad."""
    return process.config_in_effect()


def installed() -> _config.PoolConfig | None:
    """:meth:`ProcessState.installed <numba_pool.plugin.state.ProcessState.installed>`."""
    return process.installed()


def set_config(config: _config.PoolConfig | None) -> None:
    """:meth:`ProcessState.set_config <numba_pool.plugin.state.ProcessState.set_config>`."""
    process.set_config(config)
