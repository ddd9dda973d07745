"""The numba_pool EMM plugin's configuration: :class:`PoolConfig`, :data:`OPTIONS`, :func:`load`, from :mod:`.sizes`,
:mod:`.values` (the parsers) and :mod:`.variables` (the names).  Each option comes from its :func:`numba_pool.install`
keyword, else its ``NUMBA_POOL_*`` variable (read at first initialization); unset, empty or ``None`` is the default.
Parsing never touches CUDA (``numba-pool info`` reports bad values without a GPU).  A bad value raises a one-line
:class:`ConfigError` naming the variable or ``install(<keyword>)``, the value and what is accepted; nothing falls back
silently.  An unknown ``NUMBA_POOL_*`` variable warns (:class:`ConfigWarning`), naming the closest; so does an option of
a mode or cache that is off (:data:`SWITCHED`)."""

from __future__ import annotations

import dataclasses
import difflib
from functools import partial
import os
import warnings
from typing import Any, Callable, Mapping

import humanfriendly

from .errors import ConfigError, ConfigWarning
from .sizes import (ALIGNMENT, DEFAULT_ARENA_MAX_BLOCK, DEFAULT_ARENA_SLAB_SIZE, KEEP_ALL, MAX_BYTES, MIN_BARE_CAP,
                    SIZE_HELP, parse_arena_size, parse_host_max_size, parse_managed_max_size, parse_max_size,
                    parse_release_threshold, parse_size, release_limit)
from .values import BOOL_HELP, parse_bool, parse_optional_path, parse_path, parse_peer_access
from .variables import FRONTEND_VARIABLE, OTHER_VARIABLES, RETIRED, user_stacklevel, warn_unknown_variables

__all__ = ["ALIGNMENT", "BOOL_HELP", "DEFAULT_ARENA_MAX_BLOCK", "DEFAULT_ARENA_SLAB_SIZE", "FRONTEND_VARIABLE", "KEEP_ALL",
           "KNOWN_VARIABLES", "MAX_BYTES", "MIN_BARE_CAP", "OPTIONS", "OTHER_VARIABLES", "SIZE_HELP", "SWITCHED", "ConfigError",
           "ConfigWarning", "PoolConfig", "load", "load_for", "parse_arena_size", "parse_bool", "parse_host_max_size",
           "parse_managed_max_size", "parse_max_size", "parse_path", "parse_peer_access", "parse_release_threshold",
           "parse_size", "release_limit", "user_stacklevel"]


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """The configuration in effect for a process's managers; meanings: the README's ``NUMBA_POOL_*`` table.  Sizes in
    bytes; ``max_size`` is bytes or a fraction of device memory (:meth:`max_size_bytes` resolves it); ``log`` an
    absolute path or None.  ``host`` is off by default: a pinned block comes back only once the host saw its last
    use; ``managed`` is on (README, "Managed memory").  ``oom_snapshot`` and ``leak_report`` start the allocation
    history.  Build it with :func:`load`, which checks every value; the constructor checks nothing."""

    release_threshold: int = KEEP_ALL
    max_size: int | float | None = None
    initial_size: int = 0
    use_default_pool: bool = False
    arena: bool = False
    arena_max_block: int = DEFAULT_ARENA_MAX_BLOCK
    arena_slab_size: int = DEFAULT_ARENA_SLAB_SIZE
    log: str | None = None
    ipc: bool = True
    peer_access: str = "all"
    host: bool = False
    host_max_size: int | None = None
    host_release_threshold: int = KEEP_ALL
    managed: bool = True
    managed_max_size: int | None = None
    managed_release_threshold: int = KEEP_ALL
    managed_prefetch: bool = False
    oom_snapshot: str | None = None
    leak_report: bool = False
    cuda_core: bool = True

    def max_size_bytes(self, device_total: int) -> int | None:
        """The private pool's cap in bytes on a device of ``device_total`` bytes (None: no cap)."""
        return int(self.max_size * device_total) if isinstance(self.max_size, float) else self.max_size

    def describe(self) -> dict[str, str]:
        """Human-readable values of every option, for ``numba-pool info``."""
        def size(n: int) -> str:  # "0 bytes" once, not "0 bytes (0 bytes)"
            return humanfriendly.format_size(n, binary=True) + ("" if n < 1024 else f" ({n} bytes)")

        max_size = (f"{self.max_size:.0%} of device memory" if isinstance(self.max_size, float)
                    else "no cap" if self.max_size is None else size(self.max_size))
        return {
            "pool": "device default mempool" if self.use_default_pool else "private mempool (cuMemPoolCreate)",
            "release threshold": "keep all (never release on sync)" if self.release_threshold == KEEP_ALL else size(self.release_threshold),
            "max size": max_size,
            "initial size": size(self.initial_size),
            "arena": f"on: blocks up to {size(self.arena_max_block)}, slabs of {size(self.arena_slab_size)}" if self.arena else "off",
            "log": self.log or "off",
            "ipc": "exportable pool (POSIX file descriptors) where the device supports it" if self.ipc else "off",
            "peer access": ("every device that can reach this one (cuMemPoolSetAccess)" if self.peer_access == "all"
                            else "none: the pool's own device only"),
            "host": (f"on: pinned/mapped blocks cached (cuMemHostAlloc), cap "
                     f"{'none' if self.host_max_size is None else size(self.host_max_size)}, release threshold "
                     f"{'keep all' if self.host_release_threshold == KEEP_ALL else size(self.host_release_threshold)}"
                     if self.host else "off: Numba's cuMemHostAlloc/cuMemFreeHost per buffer"),
            "managed": (f"on: managed arrays from cuMemAllocManaged, blocks cached, cap "
                        f"{'none' if self.managed_max_size is None else size(self.managed_max_size)}, release threshold "
                        f"{'keep all' if self.managed_release_threshold == KEEP_ALL else size(self.managed_release_threshold)}, "
                        f"{'prefetched to the device at allocation' if self.managed_prefetch else 'no prefetch'}"
                        if self.managed else "off: Numba's cuMemAllocManaged/cuMemFree per array"),
            "oom snapshot": self.oom_snapshot or "off",
            "leak report": "on: the sites still holding memory, printed at exit" if self.leak_report else "off",
            "cuda.core": ("on: numba_pool.MemoryResource is the memory resource of each Numba context's "
                          "cuda.core Device (Numba's kernel launches allocate through it)" if self.cuda_core else "off"),
        }


# -- the options ----------------------------------------------------------------------------
OPTIONS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {  #: option name -> (environment variable, parser)
    "release_threshold": ("NUMBA_POOL_RELEASE_THRESHOLD", parse_release_threshold),
    "max_size": ("NUMBA_POOL_MAX_SIZE", parse_max_size),
    "initial_size": ("NUMBA_POOL_INITIAL_SIZE", parse_size),
    "use_default_pool": ("NUMBA_POOL_USE_DEFAULT_POOL", parse_bool),
    "arena": ("NUMBA_POOL_ARENA", parse_bool),
    "arena_max_block": ("NUMBA_POOL_ARENA_MAX_BLOCK", parse_arena_size),
    "arena_slab_size": ("NUMBA_POOL_ARENA_SLAB_SIZE", parse_arena_size),
    "log": ("NUMBA_POOL_LOG", parse_optional_path),
    "ipc": ("NUMBA_POOL_IPC", parse_bool),
    "peer_access": ("NUMBA_POOL_PEER_ACCESS", parse_peer_access),
    "host": ("NUMBA_POOL_HOST", parse_bool),
    "host_max_size": ("NUMBA_POOL_HOST_MAX_SIZE", parse_host_max_size),
    "host_release_threshold": ("NUMBA_POOL_HOST_RELEASE_THRESHOLD", parse_release_threshold),
    "managed": ("NUMBA_POOL_MANAGED", parse_bool),
    "managed_max_size": ("NUMBA_POOL_MANAGED_MAX_SIZE", parse_managed_max_size),
    "managed_release_threshold": ("NUMBA_POOL_MANAGED_RELEASE_THRESHOLD", parse_release_threshold),
    "managed_prefetch": ("NUMBA_POOL_MANAGED_PREFETCH", parse_bool),
    "oom_snapshot": ("NUMBA_POOL_OOM_SNAPSHOT", partial(parse_optional_path, what="a snapshot (pickle)")),
    "leak_report": ("NUMBA_POOL_LEAK_REPORT", parse_bool),
    "cuda_core": ("NUMBA_POOL_CUDA_CORE", parse_bool),
}

SWITCHED = {"arena": ("the arena", ("arena_max_block", "arena_slab_size")),  # read only while on; else they warn
            "host": ("the pinned cache", ("host_max_size", "host_release_threshold")),
            "managed": ("the managed cache", ("managed_max_size", "managed_release_threshold", "managed_prefetch"))}
#: Every ``NUMBA_POOL_*`` variable numba_pool reads; others are probable typos (:func:`.variables.probable_typo`).
KNOWN_VARIABLES = frozenset([variable for variable, _ in OPTIONS.values()] + [FRONTEND_VARIABLE] + list(OTHER_VARIABLES))

def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> PoolConfig:
    """Build the configuration from the environment and keyword overrides: :func:`load_for` ``install``'s."""
    return load_for("install", environ, overrides)


def load_for(caller: str, environ: Mapping[str, str] | None, overrides: dict[str, Any]) -> PoolConfig:
    """Build the configuration from the environment and the options the user gave ``caller``.
    :param caller: what the user called with ``overrides``, for messages (``install``, ``NumbaPoolPlugin``).
    :param environ: the environment to read (``os.environ`` when None).
    :param overrides: :func:`numba_pool.install`'s options, over the environment; ``None``: the default.
    :raises ConfigError: unknown option, bad value, contradiction; names the variable or ``<caller>(<option>)``."""
    environ = os.environ if environ is None else environ
    unknown = sorted(set(overrides) - set(OPTIONS))
    if unknown:
        hints = []
        for name in unknown:
            retired = RETIRED.get(f"NUMBA_POOL_{name.upper()}")
            bare = name.lower().removeprefix("numba_pool_")  # install(NUMBA_POOL_ARENA=1): the variable's name
            close = [bare] if bare in OPTIONS else difflib.get_close_matches(name, list(OPTIONS), n=1)
            hints.append(f"{name!r}" + (f" (no longer read: {retired})" if retired else
                                        f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"{caller}(): unknown option(s) {', '.join(hints)}: expected some of {', '.join(OPTIONS)}")
    warn_unknown_variables(environ, [variable for variable, _ in OPTIONS.values()] + [FRONTEND_VARIABLE])
    values: dict[str, Any] = {}
    given: dict[str, tuple[str, Any]] = {}  # option -> (source, value as typed), for the consistency messages
    for name, (variable, parser) in OPTIONS.items():
        if name in overrides:
            if overrides[name] is None:
                continue  # the default, whatever the environment says
            source, raw = f"{caller}({name})", overrides[name]
        elif environ.get(variable, "").strip():
            source, raw = variable, environ[variable]
        else:
            continue
        values[name] = parser(raw, source)
        given[name] = (source, raw)
    config = PoolConfig(**values)
    _check_consistency(config, given, caller)
    for switch, (title, names) in SWITCHED.items():  # each option set for a mode or cache that is off: one warning
        off = "{}={!r}".format(*given[switch]) if switch in given else "by default"
        for name in [name for name in names if name in given and not getattr(config, switch)]:
            warnings.warn("numba_pool: {}={!r} has no effect: ".format(*given[name]) + f"{title} is off ({off}; "
                          f"{OPTIONS[switch][0]}=1 or {caller}({switch}=True) turns it on)", ConfigWarning,
                          stacklevel=user_stacklevel())
    if config.use_default_pool and "ipc" not in given:  # the default pool cannot be exported
        config = dataclasses.replace(config, ipc=False)
    return config


def _named(config: PoolConfig, given: dict[str, tuple[str, Any]], name: str, nbytes: bool, caller: str) -> str:
    """How a consistency error names an option: as given, or the default; in bytes too when ``nbytes``."""
    value = getattr(config, name)
    nbytes = nbytes and isinstance(value, int) and not isinstance(value, bool)
    if name in given:
        source, raw = given[name]
        same = isinstance(raw, int) and raw == value  # an int typed in Python: bytes already
        return f"{source}={raw!r}" + ("" if same or not nbytes else f" ({value} bytes)")
    return (f"the default {name}" + (f" of {value} bytes" if nbytes else "")
            + f" (set {OPTIONS[name][0]} or {caller}({name}=...) to change it)")


def _check_consistency(config: PoolConfig, given: dict[str, tuple[str, Any]], caller: str) -> None:
    def named(name: str, nbytes: bool = True) -> str:
        return _named(config, given, name, nbytes, caller)

    if config.use_default_pool and config.ipc and "ipc" in given:
        raise ConfigError(f"{named('ipc', False)} asks for an exportable pool, but {named('use_default_pool')} selects "
                          "the device's default mempool, which cannot be exported (cuMemPoolExportToShareableHandle)")
    if config.use_default_pool and config.max_size is not None:
        raise ConfigError(
            f"{named('max_size', False)} caps the private mempool, but {named('use_default_pool')} selects the "
            "device's default mempool, which cannot be capped (CUmemPoolProps.maxSize is set at creation)")
    if config.initial_size > config.release_threshold:
        raise ConfigError(
            f"{named('initial_size')} is above {named('release_threshold')}: the reserve would be released at "
            "the first synchronization")
    if isinstance(config.max_size, int) and config.initial_size > config.max_size:
        raise ConfigError(f"{named('initial_size')} is above {named('max_size')}: the reserve must fit under the cap")
    if config.arena_max_block > config.arena_slab_size:
        raise ConfigError(
            f"{named('arena_max_block')} is larger than {named('arena_slab_size')}: a block must fit in a slab")