"""The configuration in effect for every numba_pool manager of the process: the one
:func:`numba_pool.install` set, else the ``NUMBA_POOL_*`` environment, read once, when the
first context initializes the plugin.  Kept by the process state
(:data:`numba_pool.plugin.state.process`)."""

from __future__ import annotations

from .. import config as _config
from .state import process


def config_in_effect() -> _config.PoolConfig:
    """The installed configuration; the environment's, read now, when none was.

    :raises ConfigError: when a ``NUMBA_POOL_*`` variable is bad.
    """
    return process.config_in_effect()


def installed() -> _config.PoolConfig | None:
    """The configuration in effect, or None before ``install()`` and before the first manager
    read the environment."""
    return process.installed()


def set_config(config: _config.PoolConfig | None) -> None:
    """Make ``config`` the configuration of managers initialized from now on (None: read the
    environment at the next initialization)."""
    process.set_config(config)
