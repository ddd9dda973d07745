"""The errors and warnings of configuration parsing."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot be used; the one-line message names the variable or
    keyword, its value, and what is accepted."""


class ConfigWarning(UserWarning):
    """A configuration that works but probably not as meant (an unknown ``NUMBA_POOL_*`` variable)."""
