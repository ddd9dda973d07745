"""The configuration in effect for every numba_pool manager of the process: the one
:func:`numba_pool.install` set, else the ``NUMBA_POOL_*`` environment, read once, when the
first context initializes the plugin."""

from __future__ import annotations

import threading

from .. import config as _config

_lock = threading.Lock()
_installed: _config.PoolConfig | None = None  # guarded by _lock


def config_in_effect() -> _config.PoolConfig:
    """The installed configuration; the environment's, read now, when none was.

    :raises ConfigError: when a ``NUMBA_POOL_*`` variable is bad.
    """
    global _installed
    with _lock:
        if _installed is None:
            _installed = _config.load()
        return _installed


def installed() -> _config.PoolConfig | None:
    """The configuration in effect, or None before ``install()`` and before the first manager
    read the environment."""
    with _lock:
        return _installed


def set_config(config: _config.PoolConfig | None) -> None:
    """Make ``config`` the configuration of managers initialized from now on (None: read the
    environment at the next initialization)."""
    global _installed
    with _lock:
        _installed = config
