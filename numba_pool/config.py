"""Configuration of the numba_pool EMM plugin.

Every option can come from an environment variable (read once, when the first CUDA context
initializes the plugin) or from :func:`numba_pool.install` keyword arguments, which take
precedence.  Parsing never touches CUDA, so ``numba-pool info`` can report a bad value on a
machine without a GPU.

A bad value raises :class:`ConfigError`, whose message names the variable (or the keyword
argument), the value, and what is accepted.  Nothing falls back silently to a default; a
variable that is unset or empty means "use the default".
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping

import humanfriendly

#: Release threshold meaning "keep every byte cached" (``UINT64_MAX``), the seeds' point: a
#: mempool that never gives memory back on synchronization serves each allocation from cache.
KEEP_ALL = 2**64 - 1

#: Default largest block served by the arena (bytes).  Measured (README, arena section): on the
#: shipped logs, blocks of 200 KB in the arena raise peak reserved / peak requested to 1.16,
#: while at 64 KiB both replay within 1.01; and the arena's gain over the mempool path matters
#: most for the small, frequent arrays that dominate Numba workloads.
DEFAULT_ARENA_MAX_BLOCK = 64 << 10
#: Default slab the arena takes from the mempool (bytes); see the README's arena section.
DEFAULT_ARENA_SLAB_SIZE = 4 << 20

SIZE_HELP = "bytes (e.g. 1048576) or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"
BOOL_HELP = "0 or 1 (also false/true, no/yes, off/on)"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names it and what is accepted."""


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """The configuration in effect for every numba_pool memory manager of a process.

    Sizes are in bytes.  ``max_size`` is either bytes (int) or a fraction of the device's total
    memory (float in (0, 1]); :meth:`max_size_bytes` resolves it once the device is known.
    """

    release_threshold: int = KEEP_ALL
    max_size: int | float | None = None
    initial_size: int = 0
    use_default_pool: bool = False
    arena: bool = False
    arena_max_block: int = DEFAULT_ARENA_MAX_BLOCK
    arena_slab_size: int = DEFAULT_ARENA_SLAB_SIZE
    log: str | None = None

    def max_size_bytes(self, device_total: int) -> int | None:
        """The hard cap of the private pool in bytes for a device of ``device_total`` bytes."""
        if isinstance(self.max_size, float):
            return int(self.max_size * device_total)
        return self.max_size

    def describe(self) -> dict[str, str]:
        """Human-readable values of every option, for ``numba-pool info``."""
        def size(n: int) -> str:
            return f"{humanfriendly.format_size(n, binary=True)} ({n} bytes)"

        if isinstance(self.max_size, float):
            max_size = f"{self.max_size:.0%} of device memory"
        else:
            max_size = "no cap" if self.max_size is None else size(self.max_size)
        return {
            "pool": "device default mempool" if self.use_default_pool else "private mempool (cuMemPoolCreate)",
            "release threshold": "keep all (never release on sync)" if self.release_threshold == KEEP_ALL else size(self.release_threshold),
            "max size": max_size,
            "initial size": size(self.initial_size),
            "arena": (f"on: blocks up to {size(self.arena_max_block)}, slabs of {size(self.arena_slab_size)}"
                      if self.arena else "off"),
            "log": self.log or "off",
        }


# -- parsing of single values -------------------------------------------------------------

_PLAIN_NUMBER = re.compile(r"^\s*[0-9]+(\.[0-9]*)?\s*$")
# The grammar we accept; humanfriendly would also take prefixes alone ("12 p" = 12 PB).
_SIZE = re.compile(r"^\s*[0-9]+(\.[0-9]*)?\s*([KMGT]i?B|B|bytes?)?\s*$", re.IGNORECASE)


def parse_size(value: Any, source: str) -> int:
    """Parse a size in bytes: an int, or a string of bytes or a number with a binary (KiB...)
    or decimal (KB...) unit.

    :param source: what the value came from (an environment variable or ``install(name=...)``),
        quoted in the error.
    :raises ConfigError: for anything else, negative sizes and fractional bytes.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{source}={value!r} is not a size: expected {SIZE_HELP}")
    if isinstance(value, int):
        nbytes = value
    else:
        if _PLAIN_NUMBER.match(value) and "." in value:
            raise ConfigError(f"{source}={value!r} is not a whole number of bytes: expected {SIZE_HELP}")
        if not _SIZE.match(value):
            raise ConfigError(f"{source}={value!r} is not a size: expected {SIZE_HELP}")
        try:
            nbytes = humanfriendly.parse_size(value)
        except humanfriendly.InvalidSize:
            raise ConfigError(f"{source}={value!r} is not a size: expected {SIZE_HELP}") from None
    if nbytes < 0:
        raise ConfigError(f"{source}={value!r} is negative: expected {SIZE_HELP}")
    return nbytes


def parse_release_threshold(value: Any, source: str) -> int:
    """A size, or ``all``/``max`` (also ``None`` from Python) for :data:`KEEP_ALL`."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("all", "max")):
        return KEEP_ALL
    try:
        return parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; or 'all' to keep every byte cached") from None


def parse_max_size(value: Any, source: str) -> int | float | None:
    """A size in bytes, or a fraction of device memory: a float in (0, 1], ``0.5`` or ``50%``."""
    if value is None:
        return None
    fraction = None
    if isinstance(value, float):
        fraction = value
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith("%") and _PLAIN_NUMBER.match(text[:-1]):
            fraction = float(text[:-1]) / 100
        elif _PLAIN_NUMBER.match(text) and "." in text:
            fraction = float(text)
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise ConfigError(f"{source}={value!r} is not a fraction of device memory in (0, 1]")
        return fraction
    try:
        nbytes = parse_size(value, source)
    except ConfigError as err:
        raise ConfigError(f"{err}; or a fraction of device memory such as 0.5 or 50%") from None
    if nbytes == 0:
        raise ConfigError(f"{source}={value!r}: a pool capped at 0 bytes cannot serve anything; unset it for no cap")
    return nbytes


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(value: Any, source: str) -> bool:
    """``True``/``False``, or one of the words in :data:`BOOL_HELP`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise ConfigError(f"{source}={value!r} is not a switch: expected {BOOL_HELP}")


def parse_path(value: Any, source: str) -> str:
    """A file path to write to; its folder must exist."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ConfigError(f"{source}={value!r} is not a file path")
    path = os.fspath(value)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"{source}={value!r}: folder {folder!r} does not exist")
    return path


# -- the options ----------------------------------------------------------------------------

#: option name -> (environment variable, parser)
OPTIONS = {
    "release_threshold": ("NUMBA_POOL_RELEASE_THRESHOLD", parse_release_threshold),
    "max_size": ("NUMBA_POOL_MAX_SIZE", parse_max_size),
    "initial_size": ("NUMBA_POOL_INITIAL_SIZE", parse_size),
    "use_default_pool": ("NUMBA_POOL_USE_DEFAULT_POOL", parse_bool),
    "arena": ("NUMBA_POOL_ARENA", parse_bool),
    "arena_max_block": ("NUMBA_POOL_ARENA_MAX_BLOCK", parse_size),
    "arena_slab_size": ("NUMBA_POOL_ARENA_SLAB_SIZE", parse_size),
    "log": ("NUMBA_POOL_LOG", parse_path),
}


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> PoolConfig:
    """Build the configuration from environment variables and keyword overrides.

    :param environ: the environment to read (``os.environ`` when None).
    :param overrides: option values from :func:`numba_pool.install`; they win over the
        environment.
    :raises ConfigError: an unknown option, a bad value, or options that contradict each other.
    """
    environ = os.environ if environ is None else environ
    unknown = sorted(set(overrides) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}: expected some of {', '.join(OPTIONS)}")
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (variable, parser) in OPTIONS.items():
        if name in overrides:
            sources[name] = f"install({name}=...)"
            values[name] = parser(overrides[name], f"install({name})")
        elif environ.get(variable, "").strip():
            sources[name] = variable
            values[name] = parser(environ[variable], variable)
    config = PoolConfig(**values)
    _check_consistency(config, sources)
    return config


def _check_consistency(config: PoolConfig, sources: dict[str, str]) -> None:
    if config.use_default_pool and config.max_size is not None:
        raise ConfigError(
            f"{sources['max_size']} caps the private mempool, but {sources['use_default_pool']} selects the "
            "device's default mempool, which cannot be capped (CUmemPoolProps.maxSize is set at creation)")
    if config.initial_size > config.release_threshold:
        raise ConfigError(
            f"{sources['initial_size']}={config.initial_size} bytes is above {sources['release_threshold']}="
            f"{config.release_threshold} bytes: the reserve would be released at the first synchronization")
    if isinstance(config.max_size, int) and config.initial_size > config.max_size:
        raise ConfigError(
            f"{sources['initial_size']}={config.initial_size} bytes is above {sources['max_size']}="
            f"{config.max_size} bytes")
    if config.arena_max_block > config.arena_slab_size:
        raise ConfigError(
            f"arena_max_block ({config.arena_max_block} bytes) is larger than arena_slab_size "
            f"({config.arena_slab_size} bytes): a block must fit in a slab")
    for name in ("arena_max_block", "arena_slab_size"):
        if getattr(config, name) < 256:
            raise ConfigError(f"{sources.get(name, name)}={getattr(config, name)} bytes is below the 256-byte block alignment")
