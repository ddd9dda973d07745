"""The errors and warnings of configuration parsing."""

from __future__ import annotations


class ConfigError(ValueError):
    """An unusable configuration value: its one-line message names the variable or keyword, value, what's accepted."""


class ConfigWarning(UserWarning):
    """A configuration that works but probably not as meant (an unknown ``NUMBA_POOL_*`` variable)."""
