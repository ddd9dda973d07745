"""numba_pool on Dask workers: :class:`NumbaPoolPlugin` (a ``distributed.WorkerPlugin``) installs numba_pool on every
worker; :func:`stats`, :func:`record_history` and :func:`snapshots` ask the workers now (``client.run``).  Nothing here
raises into a worker or the scheduler (a failure becomes ``{"status": "error", "message": ...}``).  Usage, outcomes,
caveats (register before Numba's first CUDA use; not with RMM's ``rmm.allocators.numba``): docs/guide.md, "Dask"::

    client.register_plugin(npd.NumbaPoolPlugin(arena=True))  # frontend="mlir" for Numba-CUDA-MLIR
    npd.stats(client)  # {worker address: {"status": "ok", "frontend": "numba-cuda", ...}}"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from typing import Any

try:
    from distributed import WorkerPlugin
except ImportError as err:  # the missing one is distributed itself, not one of its needs
    if err.name not in ("distributed", "dask"):
        raise
    raise ImportError("numba_pool.integrations.dask needs Dask's distributed: pip install '.[dask]' in a numba-pool "
                      "checkout (or pip install distributed)") from None

from .. import config as _config
from ..cuda import frontend as frontends
from ..cuda import simulator
from ..observe import history as _history
from ..observe import snapshot as _snapshot
from ..plugin import debugging, settings
from ..plugin.api import install
from ..plugin.api import record_history as _record_history
from ..plugin.manager import NumbaPoolManager, managers
from ..plugin.state import process

logger = logging.getLogger("distributed.worker.numba_pool")  # the worker's logger's child: client.get_worker_logs()
METRIC = "numba_pool"  # the key of numba_pool's statistics in ``worker.metrics``, and the plugin's name


class NumbaPoolPlugin(WorkerPlugin):
    """Runs :func:`numba_pool.install` on each worker (joiners too); publishes ``worker.metrics["numba_pool"]``.
    :param frontend: ``"numba-cuda"``, ``"mlir"``, or None: each worker's choice (:func:`.frontend.for_tools`).
    :param options: :func:`numba_pool.install`'s, over the workers' ``NUMBA_POOL_*`` (not ``log``: a host's path).
    :raises ConfigError: on the client, for an unknown option or a bad value; FrontendError: for a bad ``frontend``."""

    name = METRIC
    idempotent = False  # registering again with other options replaces the plugin (and tries them)

    def __init__(self, *, frontend: str | None = None, **options: Any):
        # Bad options fail here, not on every worker; the log's path is checked where it is written (its type here).
        _config.load_for("NumbaPoolPlugin", {}, {k: v for k, v in options.items() if k != "log"})
        log = options.get("log")
        if log is not None and not isinstance(log, (str, os.PathLike)):
            raise _config.ConfigError(f"NumbaPoolPlugin(log)={log!r} is not a file path: expected the path of a CSV "
                                      "file to write (on each worker)")
        self.frontend = None if frontend is None else frontends.parse_name(frontend, "NumbaPoolPlugin(frontend)")
        self.options = options
        self.status = "not set up"
        self.message: str | None = None
        self.frontend_used: str | None = None  # on a worker: the frontend its setup chose

    def setup(self, worker) -> None:
        """Install numba_pool on ``worker``; without a GPU, only a warning in its log.  :raises RuntimeError: when the
        frontend used CUDA there under another manager or options, or is not installed (register_plugin raises it)."""
        worker.metrics[METRIC] = self.metric
        where = f"worker {getattr(worker, 'address', '?')}"
        status, message, self.frontend_used = _install(self.options, self.frontend)
        self.status, self.message = status, message and f"{where}: {message}"
        if status == "installed":
            logger.info("numba_pool is the memory manager of %s on %s (options %s)", self.frontend_used, where,
                        self.options or "none")
        elif status == "not installed":
            logger.error("numba_pool.integrations.dask: %s", self.message)
            raise RuntimeError(f"numba_pool.integrations.dask: {self.message}")
        else:
            logger.warning("numba_pool.integrations.dask: %s", self.message)

    def teardown(self, worker) -> None:
        """Remove the metric (numba_pool stays the memory manager in this process)."""
        if worker.metrics.get(METRIC) == self.metric:
            del worker.metrics[METRIC]

    def metric(self, worker=None) -> dict:
        """:func:`worker_statistics` for its frontend (and the setup's outcome if that failed); never raises."""
        result = worker_statistics(self.frontend_used or self.frontend)
        if self.status != "installed" and result["status"] != "error":
            result = {**result, "status": self.status, "message": self.message}
        return result


def _install(options: dict, frontend: str | None) -> tuple[str, str | None, str | None]:
    """Install numba_pool here: ``(status, message, frontend's name)``; status installed, no GPU or not installed."""
    try:
        chosen = frontends.named(frontend, "NumbaPoolPlugin(frontend)")
    except frontends.FrontendError as err:
        return "not installed", f"numba_pool not installed: {err}", frontend
    if chosen.simulator:
        return "no GPU", f"numba_pool not installed: {simulator.NO_MEMORY_MANAGER}", chosen.name
    module = frontends.PACKAGES[chosen.name]
    if not chosen.cuda.is_available():  # initializes the driver, creates no context
        return "no GPU", f"numba_pool not installed: no CUDA GPU on this worker ({module}.is_available() is False)", \
            chosen.name
    try:
        install(frontend=chosen.name, **options)
    except RuntimeError as err:
        if _in_effect(options, chosen):
            return "installed", None, chosen.name
        return "not installed", (f"numba_pool not installed: {err}; register the plugin before the first task that "
                                 f"uses {module}, or restart the workers (client.restart()) first"), chosen.name
    return "installed", None, chosen.name


def _in_effect(options: dict, frontend) -> bool:
    """Whether numba_pool with these options is already ``frontend``'s memory manager here."""
    plugin = getattr(frontend.driver, "_memory_manager", None)
    return (settings.installed() == _config.load(**options)
            and isinstance(plugin, type) and issubclass(plugin, NumbaPoolManager)
            and all(isinstance(getattr(c, "memory_manager", None), NumbaPoolManager)
                    for c in _contexts(frontend).values()))


def _contexts(frontend) -> dict:
    """``frontend``'s contexts in this process, ``{device ordinal: Context}``; creates none."""
    return {dev_id: dev.primary_context for dev_id, dev in sorted(frontend.driver.driver.devices.items())
            if getattr(dev, "primary_context", None) is not None}


def worker_statistics(frontend: str | None = None) -> dict:
    """numba_pool's statistics here for ``frontend`` (None: the tools' choice), creating no CUDA context; never
    raises.  Keys: ``status`` (``"ok"``, ``"no CUDA context yet"``, ``"other manager"``, ``"not initialized"``,
    ``"no GPU"``, ``"error"``; the plugin's metric adds ``"not installed"``), ``frontend``, ``message`` (one line,
    unless ``"ok"``).  With ``"ok"``: ``device`` (the lowest ordinal with a context), ``manager`` and the figures
    (:meth:`~numba_pool.PoolStatistics.to_dict`); ``other_devices``, ``{ordinal as str: the same}``, for others."""
    try:
        chosen = frontends.named(frontend, "NumbaPoolPlugin(frontend)")
        if chosen.simulator:
            return {"status": "no GPU", "frontend": chosen.name, "message": simulator.NO_MEMORY_MANAGER}
        contexts = _contexts(chosen)
        if not contexts:
            return {"status": "no CUDA context yet", "frontend": chosen.name,
                    "message": f"{chosen.title} has not used CUDA in this worker yet (no context, no allocation)"}
        per_device = {dev_id: _context_statistics(dev_id, context, chosen) for dev_id, context in contexts.items()}
        first, *others = per_device
        result = dict(per_device[first])
        if others:
            result["other_devices"] = {str(dev_id): per_device[dev_id] for dev_id in others}
        return result
    except Exception as err:  # a metric must not raise into the worker or the scheduler
        return {"status": "error", "message": f"{type(err).__name__}: {err}"}


def _context_statistics(dev_id: int, context, frontend) -> dict:
    """``context``'s manager's statistics, asked directly (``numba_pool.stats()`` could create a context)."""
    mm = getattr(context, "memory_manager", None)
    name = type(mm).__name__
    about = {"device": dev_id, "frontend": frontend.name, "manager": name}
    if not isinstance(mm, NumbaPoolManager):
        return {"status": "other manager", **about,
                "message": f"{frontend.title}'s memory manager on device {dev_id} is {name}, not numba_pool"}
    if mm.allocator is None:  # not initialized (or reset): statistics() would create the pool
        return {"status": "not initialized", **about,
                "message": f"numba_pool has no pool on device {dev_id} yet (nothing allocated since start or reset)"}
    context.push()  # none is current on the worker's event loop thread; the pool queries need one
    try:
        statistics = mm.statistics()
    finally:
        context.pop()
    return {"status": "ok", **about, **_as_dict(statistics)}


def _as_dict(statistics) -> dict:
    """:meth:`PoolStatistics.to_dict` (``dataclasses.asdict`` where it is absent)."""
    to_dict = getattr(statistics, "to_dict", None)
    return to_dict() if to_dict is not None else dataclasses.asdict(statistics)


def _run_statistics(dask_worker=None) -> dict:
    """:func:`stats`'s function on a worker: the plugin's metric, else :func:`worker_statistics`."""
    metric = dask_worker.metrics.get(METRIC) if dask_worker is not None else None
    if metric is None:
        return worker_statistics()
    try:
        return metric(dask_worker)
    except Exception as err:
        return {"status": "error", "message": f"{type(err).__name__}: {err}"}


def stats(client) -> dict[str, dict]:
    """Every worker's :func:`worker_statistics` now, ``{worker address: dict}``; a worker that could not answer gets
    ``{"status": "error", ...}``.  Asynchronous client: an awaitable.  :raises TypeError: as :func:`_client`."""
    return _then(_client(client, "stats").run(_run_statistics, on_error="return"), _checked)


def _client(client, call: str):
    """``client``; :raises TypeError: for no Dask client (no ``client.run``), naming ``call``'s argument."""
    if not callable(getattr(client, "run", None)):  # else an AttributeError from deep inside
        hint = f": connect first, Client({client!r:.120})" if isinstance(client, str) else ""
        raise TypeError(f"numba_pool.integrations.dask.{call}: client={client!r:.120} ({type(client).__name__}) is not "
                        f"a Dask client (distributed.Client){hint}")
    return client


def _then(results, finish):
    """``finish(results)``, or an awaitable of it where ``results`` is awaitable."""
    if inspect.isawaitable(results):
        async def finished():
            return finish(await results)

        return finished()
    return finish(results)


def _checked(results: dict) -> dict[str, dict]:
    return {address: (result if isinstance(result, dict)
                      else {"status": "error", "message": f"{type(result).__name__}: {result}"})
            for address, result in results.items()}


def record_history(client, enabled: bool = True, stacks: str = "python",
                   max_entries: int = _history.DEFAULT_MAX_ENTRIES) -> dict[str, dict]:
    """:func:`numba_pool.record_history` on every worker now; joiners do not record until it is called again.
    Returns ``{worker address: recording()}``; asynchronous client: an awaitable.
    :raises ValueError: (a worker's) for another ``stacks`` or ``max_entries`` < 1; TypeError: as :func:`_client`."""
    return _then(_client(client, "record_history").run(_record_history_here, enabled, stacks, max_entries), dict)


def _record_history_here(enabled: bool, stacks: str, max_entries: int) -> dict:
    """:func:`record_history`'s function on each worker: switch, then say what records."""
    _record_history(enabled, stacks=stacks, max_entries=max_entries)
    return recording()


def recording() -> dict:
    """``{"recording": True, "stacks": "python" or "none", "max_entries": n}`` here, or ``{"recording": False}``."""
    current = process.recording
    if current is None:
        return {"recording": False}
    return {"recording": True, "stacks": current.stacks, "max_entries": current.max_entries}


def worker_snapshot() -> dict:
    """:func:`numba_pool.snapshot` of this process, each manager's context pushed (none is current on
    the worker's event loop thread).  Never raises: a failure gives :func:`failed_snapshot`."""
    try:
        return debugging.snapshot_of(managers(), _segments_in_context)
    except Exception as err:  # one worker's failure must not lose the others' snapshots
        return failed_snapshot(f"{type(err).__name__}: {err}")


def _segments_in_context(manager) -> list[dict]:
    """``manager``'s segments, its context pushed; none before it has a pool."""
    if manager.allocator is None:
        return []
    context = manager.context
    context.push()
    try:
        return debugging.segments_of(manager)
    finally:
        context.pop()


def failed_snapshot(message: str) -> dict:
    """The empty snapshot (no segment, no trace), with ``error``: ``message``."""
    return {**_snapshot.build({}, None), "error": message}


def snapshots(client) -> dict[str, dict]:
    """Each worker's :func:`worker_snapshot` now, ``{worker address: snapshot}`` (pickle it for PyTorch's viewer); a
    worker failing gets :func:`failed_snapshot`.  Asynchronous client: an awaitable.  TypeError: as :func:`_client`."""
    return _then(_client(client, "snapshots").run(worker_snapshot, on_error="return"), _snapshots_checked)


def _snapshots_checked(results: dict) -> dict[str, dict]:
    return {address: (result if isinstance(result, dict) else failed_snapshot(f"{type(result).__name__}: {result}"))
            for address, result in results.items()}
