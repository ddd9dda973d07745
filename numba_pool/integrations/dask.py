"""numba_pool on Dask workers: a ``distributed.WorkerPlugin`` that makes numba_pool Numba's
memory manager on every worker, and numba_pool's statistics per worker.

dask-cuda sets RMM up on each worker (``LocalCUDACluster(rmm_pool_size=...)``), but nothing sets
Numba's memory manager up there::

    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import numba_pool.integrations.dask as npd

    client = Client(LocalCUDACluster())
    client.register_plugin(npd.NumbaPoolPlugin(arena=True))  # frontend="mlir" for Numba-CUDA-MLIR
    ...  # tasks that use numba.cuda
    npd.stats(client)  # {worker address: {"status": "ok", "frontend": "numba-cuda", "current_bytes": ..., ...}}

The Numba CUDA frontend is the plugin's ``frontend`` (``"numba-cuda"`` or ``"mlir"``), else each
worker's own choice (:func:`numba_pool.cuda.frontend.for_tools`: ``NUMBA_POOL_FRONTEND``, else the
frontend imported there, else the one installed, numba-cuda first).

Register the plugin before Numba's first CUDA use on the workers (before any task used
``numba.cuda``), as for :func:`numba_pool.install`; workers that join later get it when they
start.  The CUDA context that dask-cuda creates on each worker at start (its preload,
``dask_cuda.initialize``) does not count: Numba adopts that primary context later and binds
numba_pool to it.  Do not also hand Numba to RMM (``rmm_allocator_external_lib_list`` with
``"numba"``, or ``rmm.allocators.numba``): both set Numba's memory manager.

Outcomes of the plugin's setup on a worker (each written to the worker's log, logger
``distributed.worker.numba_pool``, which ``client.get_worker_logs()`` shows, and given by
:func:`stats` as ``status`` and ``message``):

* a GPU, no Numba CUDA context yet: numba_pool is installed (log level INFO);
* no GPU on the worker, or the CUDA simulator: nothing installed, a warning (a cluster may mix
  CPU and GPU workers; registration goes on);
* Numba already used CUDA on the worker with another memory manager: nothing installed; the
  setup raises :class:`RuntimeError`, so ``client.register_plugin`` raises it on the client
  (the worker goes on, with Numba's own manager).  Registering again with the same options on
  a worker where numba_pool is already in effect is not an error.

Statistics are published through ``worker.metrics["numba_pool"]``: they appear in
``client.scheduler_info()["workers"][address]["metrics"]["numba_pool"]`` (refreshed at each
heartbeat); :func:`stats` asks the workers directly.  They never raise into the worker or the
scheduler: a failure becomes ``{"status": "error", "message": ...}``.  They include managed
memory's figures (``managed_on``, ``managed_reserved_bytes``, ``managed_in_use_bytes``,
``managed_cached_bytes``, ``managed_blocks``): ``managed_on`` is false where numba_pool leaves
``cuda.managed_array`` to Numba (``managed=False``, or a device without concurrent managed
access; ``numba-pool info`` on the worker's host says which).

Memory debugging on request (allocation history and snapshots), asked of the workers now, as :func:`stats` is::

    npd.record_history(client)  # numba_pool.record_history() on every worker
    ...  # the tasks to look at
    for address, snapshot in npd.snapshots(client).items():  # numba_pool.snapshot() of each worker
        with open(f"snapshot-{address.replace('/', '_').replace(':', '_')}.pickle", "wb") as f:
            pickle.dump(snapshot, f)  # what numba_pool.dump_snapshot writes: PyTorch's viewer reads it

:func:`record_history` switches the allocation history of the workers there now, on or off,
as :func:`numba_pool.record_history` does in one process: it is a switch of the running
process, not an option of numba_pool's installation, so it is a function beside :func:`stats`
and not an option of the plugin (whose options are :func:`numba_pool.install`'s, checked
against what is in effect when the plugin is registered again).  Workers that join later do not
record until it is called again; the plugin's ``leak_report`` and ``oom_snapshot`` options
start the history on every worker, joiners included, when numba_pool initializes there (its
first allocation).  :func:`snapshots` gives each
worker's snapshot (:func:`worker_snapshot`): its segments without the history, its frames and
traces with it.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

try:
    from distributed import WorkerPlugin
except ImportError as err:  # the missing one is distributed itself, not one of its needs
    if err.name not in ("distributed", "dask"):
        raise
    raise ImportError("numba_pool.integrations.dask needs Dask's distributed: pip install 'numba-pool[dask]'") from None

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

#: A child of the worker's logger, so that ``client.get_worker_logs()`` shows its lines.
logger = logging.getLogger("distributed.worker.numba_pool")

#: The key of numba_pool's statistics in ``worker.metrics`` and the plugin's name.
METRIC = "numba_pool"


class NumbaPoolPlugin(WorkerPlugin):
    """Calls :func:`numba_pool.install` with ``options`` on each worker when it is registered
    (or when a worker starts, for workers that join later), and publishes the worker's
    statistics as ``worker.metrics["numba_pool"]``.

    :param frontend: the Numba CUDA frontend to install numba_pool into on the workers,
        ``"numba-cuda"`` or ``"mlir"`` (kept as :attr:`frontend` and sent to the workers); None:
        each worker's own choice (:func:`numba_pool.cuda.frontend.for_tools`).
    :param options: :func:`numba_pool.install`'s options (sizes in bytes or with units, e.g.
        ``max_size="80%"``, ``arena=True``, ``managed_max_size="8 GiB"``); on the workers they
        override the workers' ``NUMBA_POOL_*`` environment variables.  ``log`` is one path for
        every worker: workers on one host would share the file, so leave it to the workers' own
        environment.
    :raises ConfigError: at construction, on the client, for an unknown option or a bad value.
    :raises FrontendError: at construction, on the client, for a ``frontend`` that names none.

    Its ``setup`` raises :class:`RuntimeError` when the frontend already used CUDA on the worker
    with another memory manager, or is not installed there (``client.register_plugin`` raises
    it); a worker without a GPU only gets a warning in its log.  Removing the plugin removes the
    metric; numba_pool stays the memory manager in worker processes where it was installed.
    """

    name = METRIC
    idempotent = False  # registering again with other options replaces the plugin (and tries them)

    def __init__(self, *, frontend: str | None = None, **options: Any):
        # Bad options fail here, not on every worker; the log's path is checked where it is written.
        _config.load(environ={}, **{k: v for k, v in options.items() if k != "log"})
        self.frontend = None if frontend is None else frontends.parse_name(frontend, "NumbaPoolPlugin(frontend)")
        self.options = options
        self.status = "not set up"
        self.message: str | None = None
        self.frontend_used: str | None = None  # on a worker: the frontend its setup chose

    def setup(self, worker) -> None:
        """Install numba_pool on ``worker`` (see the class).

        :raises RuntimeError: when the frontend already used CUDA on the worker under another
            memory manager, or with other numba_pool options, or is not installed there.
        """
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
        """The worker's numba_pool statistics for the plugin's frontend (see
        :func:`worker_statistics`), with the plugin's setup outcome when it installed nothing.
        Never raises."""
        result = worker_statistics(self.frontend_used or self.frontend)
        if self.status != "installed" and result["status"] != "error":
            result = {**result, "status": self.status, "message": self.message}
        return result


def _install(options: dict, frontend: str | None) -> tuple[str, str | None, str | None]:
    """Install numba_pool in this process for ``frontend`` (None: the tools' choice):
    ``(status, message, frontend's name)`` with status ``"installed"``, ``"no GPU"`` (nothing
    to install) or ``"not installed"`` (CUDA already used, or the frontend is not installed:
    the message says why)."""
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
    """Whether numba_pool with these options is already ``frontend``'s memory manager here (a
    plugin registered again, or ``NUMBA_CUDA_MEMORY_MANAGER=numba_pool`` on the worker)."""
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
    """numba_pool's statistics in this process (a worker) for ``frontend`` (``"numba-cuda"``,
    ``"mlir"``; None: the tools' choice), without creating a CUDA context.

    Keys: ``status``, one of ``"ok"``, ``"no CUDA context yet"``, ``"other manager"`` (the
    frontend's context has another memory manager: ``manager`` names it), ``"not initialized"``
    (numba_pool's manager has no pool yet), ``"no GPU"`` (the simulator), ``"error"``;
    ``frontend``, the frontend's name (absent when it could not be found); ``message``, one
    line, unless ``"ok"``.  (:class:`NumbaPoolPlugin`'s metric adds its setup outcome: ``"no
    GPU"``, ``"not installed"``.)  With ``"ok"``: ``device`` (the lowest device ordinal where
    the frontend has a context), ``manager`` (``"NumbaPoolManager"``) and the statistics of
    :func:`numba_pool.stats` (:meth:`PoolStatistics.to_dict
    <numba_pool.PoolStatistics.to_dict>`, every key: bytes and counts, the ``arena_*``,
    ``host_*`` and ``managed_*`` figures and their ``*_on`` switches); ``other_devices``,
    ``{ordinal as str: the same}``, when the frontend has contexts on more than one device.  Never raises.
    """
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
    """The statistics of ``context``'s manager: that frontend's numba_pool manager, asked
    directly (``numba_pool.stats()`` would make the context current on this thread, or create
    one)."""
    mm = getattr(context, "memory_manager", None)
    name = type(mm).__name__
    about = {"device": dev_id, "frontend": frontend.name, "manager": name}
    if not isinstance(mm, NumbaPoolManager):
        return {"status": "other manager", **about,
                "message": f"{frontend.title}'s memory manager on device {dev_id} is {name}, not numba_pool"}
    if mm.allocator is None:  # not initialized (or reset): statistics() would create the pool
        return {"status": "not initialized", **about,
                "message": f"numba_pool has no pool on device {dev_id} yet (nothing allocated since start or reset)"}
    # On the worker's event loop thread, where no context is current: the pool queries need one.
    context.push()
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
    """:func:`stats`'s function on each worker: the plugin's metric when it is registered,
    else :func:`worker_statistics` (numba_pool may be on through the workers' environment)."""
    metric = dask_worker.metrics.get(METRIC) if dask_worker is not None else None
    if metric is None:
        return worker_statistics()
    try:
        return metric(dask_worker)
    except Exception as err:
        return {"status": "error", "message": f"{type(err).__name__}: {err}"}


def stats(client) -> dict[str, dict]:
    """numba_pool's statistics of every worker of ``client``'s cluster, asked of the workers now
    (``client.run``), ``{worker address: dict}``; the dict is described by
    :func:`worker_statistics` (bytes and counts).  A worker that could not answer gets
    ``{"status": "error", "message": ...}``.  With an asynchronous client, returns an
    awaitable of the same.
    """
    return _then(client.run(_run_statistics, on_error="return"), _checked)


def _then(results, finish):
    """``finish(results)``, or, where ``results`` is awaitable (an asynchronous client), an
    awaitable of it."""
    if inspect.isawaitable(results):
        async def finished():
            return finish(await results)

        return finished()
    return finish(results)


def _checked(results: dict) -> dict[str, dict]:
    return {address: (result if isinstance(result, dict)
                      else {"status": "error", "message": f"{type(result).__name__}: {result}"})
            for address, result in results.items()}


# -- memory debugging on request: the history and snapshots -----------------------------------

def record_history(client, enabled: bool = True, stacks: str = "python",
                   max_entries: int = _history.DEFAULT_MAX_ENTRIES) -> dict[str, dict]:
    """:func:`numba_pool.record_history` with these arguments on every worker of ``client``'s
    cluster now (``client.run``): from now on, each worker records its allocations (with the
    Python stack at each, unless ``stacks="none"``) and their events, in a ring of
    ``max_entries``; ``enabled=False`` stops and drops the recording.  Workers that join later
    do not record until this is called again.  Returns each worker's recording after the call,
    ``{worker address: {"recording": True, "stacks": ..., "max_entries": ...}}`` or ``{...:
    {"recording": False}}``; with an asynchronous client, an awaitable of the same.

    :raises ValueError: (a worker's, raised again here) for another ``stacks`` or a
        ``max_entries`` below 1.
    """
    return _then(client.run(_record_history_here, enabled, stacks, max_entries), dict)


def _record_history_here(enabled: bool, stacks: str, max_entries: int) -> dict:
    """:func:`record_history`'s function on each worker: switch, then say what records."""
    _record_history(enabled, stacks=stacks, max_entries=max_entries)
    return recording()


def recording() -> dict:
    """This process's recording: ``{"recording": True, "stacks": "python" or "none",
    "max_entries": n}``, or ``{"recording": False}``."""
    current = process.recording
    if current is None:
        return {"recording": False}
    return {"recording": True, "stacks": current.stacks, "max_entries": current.max_entries}


def worker_snapshot() -> dict:
    """:func:`numba_pool.snapshot` of this process (a worker): the memory of every device
    numba_pool serves here, every frontend's, in the schema of PyTorch's
    ``torch.cuda.memory._snapshot()``, with the frames and traces of the allocation history where
    it records (:func:`record_history`).  Each manager's memory is read with its own CUDA context
    pushed, as for the statistics: on the worker's event loop thread none is current, and the
    pool's queries need one.  A process where numba_pool serves no device gives the empty
    snapshot.  Never raises: a failure gives the empty snapshot with ``error``, one line."""
    try:
        return debugging.snapshot_of(managers(), _segments_in_context)
    except Exception as err:  # one worker's failure must not lose the others' snapshots
        return failed_snapshot(f"{type(err).__name__}: {err}")


def _segments_in_context(manager) -> list[dict]:
    """``manager``'s segments (:func:`numba_pool.plugin.debugging.segments_of`), its context
    pushed around them; none, and nothing pushed, before it has a pool."""
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
    """Each worker's snapshot (:func:`worker_snapshot`: :func:`numba_pool.snapshot` there),
    asked of the workers of ``client``'s cluster now (``client.run``): ``{worker address:
    snapshot}``.  Written with ``pickle.dump`` (as :func:`numba_pool.dump_snapshot` writes
    one), PyTorch's viewer reads it.
    Frames and traces need the history on the workers (:func:`record_history`).  A worker that
    could not answer gets the empty snapshot with ``error`` (one line).  With an asynchronous
    client, returns an awaitable of the same.
    """
    return _then(client.run(worker_snapshot, on_error="return"), _snapshots_checked)


def _snapshots_checked(results: dict) -> dict[str, dict]:
    return {address: (result if isinstance(result, dict) else failed_snapshot(f"{type(result).__name__}: {result}"))
            for address, result in results.items()}
