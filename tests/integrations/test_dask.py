"""numba_pool.integrations.dask without a GPU: the plugin's registration gives a clear outcome and never
hangs, the statistics never raise, and a missing distributed is one clear line.

Clusters run in a fresh interpreter with a time limit: install() changes the process's Numba,
and a hang must fail the test, not stall the suite.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pickle
import sys
import tempfile
import types

import pytest

from helpers import FRONTEND, FRONTENDS, GPU, MISSING_FRONTENDS, run_python
from numba_pool.cuda.frontend import MLIR, NUMBA_CUDA, PACKAGES, TITLES

pytest.importorskip("distributed")

import numba_pool  # noqa: E402
import numba_pool.integrations.dask as npd  # noqa: E402

CLUSTER_TIMEOUT = 180  # seconds for a whole subprocess: start, register, query, close

CLUSTER_PROGRAM = """
import json, time
from distributed import Client, LocalCluster
import numba_pool.integrations.dask as npd

def main():
    out = {}
    with LocalCluster(n_workers=1, processes=PROCESSES, threads_per_worker=1, dashboard_address=None) as cluster, \\
            Client(cluster) as client:
        if BEFORE:  # asks the worker's own frontend, importing it there
            out["before"] = list(npd.stats(client).values())
        try:
            out["register"] = list(client.register_plugin(npd.NumbaPoolPlugin(arena=True, **PLUGIN)).values())
        except RuntimeError as err:
            out["register"] = "RuntimeError: " + str(err)
        out["stats"] = list(npd.stats(client).values())
        deadline = time.monotonic() + 30  # the metric reaches the scheduler with a heartbeat
        while True:
            metrics = [w["metrics"].get("numba_pool") for w in client.scheduler_info()["workers"].values()]
            if all(metrics) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out["metrics"] = metrics
        out["logs"] = [m for logs in client.get_worker_logs().values() for _, m in logs if "numba_pool" in m]
        out["task"] = client.submit(sum, [1, 2], pure=False).result(timeout=60)  # the worker goes on
        out["frontends imported"] = list(client.run(lambda: [m for m in ("numba", "numba_cuda_mlir")
                                                             if m in __import__("sys").modules]).values())
    print(json.dumps(out))

if __name__ == "__main__":
    main()
"""

# Numba "already used CUDA" on the worker, for install()'s own check, on a machine without one:
# a device holding a context in Numba's device table, and a driver that says a GPU is there.
CUDA_ALREADY_USED = """
from numba import cuda
from numba.cuda.cudadrv.driver import driver

class UsedDevice:
    id = 0
    primary_context = object()

driver.devices[0] = UsedDevice()
cuda.is_available = lambda: True
"""


def run_cluster(processes: bool, prelude: str = "", env: dict | None = None, plugin: dict | None = None,
                before: bool = True) -> dict:
    code = prelude + (CLUSTER_PROGRAM.replace("PROCESSES", repr(processes)).replace("PLUGIN", repr(plugin or {}))
                      .replace("BEFORE", repr(before)))
    with tempfile.TemporaryDirectory() as scratch:  # Dask's worker space, removed afterwards
        env = {**(env or {}), "DASK_TEMPORARY_DIRECTORY": scratch}
        proc = run_python(code, env, timeout=CLUSTER_TIMEOUT)  # subprocess.TimeoutExpired fails the test
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(GPU, reason="checks a worker without a GPU")
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_registration_without_gpu_says_so_and_goes_on(processes):
    out = run_cluster(processes, env={"NUMBA_POOL_FRONTEND": ""})  # the workers' default frontend
    default = FRONTENDS[0]
    no_gpu = f"numba_pool not installed: no CUDA GPU on this worker ({PACKAGES[default]}.is_available() is False)"
    assert out["before"] == [{"status": "no CUDA context yet", "frontend": default, "message":
                              f"{TITLES[default]} has not used CUDA in this worker yet (no context, no allocation)"}]
    assert out["register"] == [{"status": "OK"}]  # a cluster may mix CPU and GPU workers
    for where in ("stats", "metrics"):
        [result] = out[where]
        assert result["status"] == "no GPU" and result["message"].endswith(no_gpu), (where, result)
        assert result["frontend"] == default, (where, result)
    assert any("WARNING" in line and no_gpu in line for line in out["logs"]), out["logs"]
    assert out["task"] == 3


@pytest.mark.skipif(GPU, reason="checks workers without a GPU")
@pytest.mark.skipif(MLIR not in FRONTENDS, reason=MISSING_FRONTENDS.get(MLIR, ""))
def test_the_plugin_carries_its_frontend_to_worker_processes():
    """``NumbaPoolPlugin(frontend="mlir")`` acts on Numba-CUDA-MLIR in a worker process whose own
    choice would be numba-cuda (the default where both are installed), and imports no numba
    there."""
    out = run_cluster(True, env={"NUMBA_POOL_FRONTEND": ""}, plugin={"frontend": "mlir"}, before=False)
    no_gpu = "numba_pool not installed: no CUDA GPU on this worker (numba_cuda_mlir.cuda.is_available() is False)"
    assert out["register"] == [{"status": "OK"}]
    for where in ("stats", "metrics"):
        [result] = out[where]
        assert result["frontend"] == "mlir" and result["status"] == "no GPU", (where, result)
        assert result["message"].endswith(no_gpu), (where, result)
    assert out["frontends imported"] == [["numba_cuda_mlir"]]  # not numba: the worker's default was not used
    assert out["task"] == 3


def test_the_frontend_is_checked_on_the_client_and_pickled_with_the_plugin():
    plugin = npd.NumbaPoolPlugin(frontend="numba_cuda_mlir", arena=True)
    assert (plugin.frontend, plugin.options) == (MLIR, {"arena": True})
    copy = pickle.loads(pickle.dumps(plugin))  # what reaches a worker
    assert (copy.frontend, copy.options) == (MLIR, {"arena": True})
    assert npd.NumbaPoolPlugin().frontend is None and npd.NumbaPoolPlugin(frontend="numba-cuda").frontend == NUMBA_CUDA
    with pytest.raises(numba_pool.FrontendError, match=r"NumbaPoolPlugin\(frontend\)='cupy' is not a frontend"):
        npd.NumbaPoolPlugin(frontend="cupy")


@pytest.mark.skipif(NUMBA_CUDA not in FRONTENDS, reason=MISSING_FRONTENDS.get(NUMBA_CUDA, ""))
def test_registration_after_cuda_was_used_raises_on_the_client():
    out = run_cluster(False, prelude=CUDA_ALREADY_USED, env={"NUMBA_POOL_FRONTEND": "numba-cuda"})
    assert str(out["register"]).startswith("RuntimeError: numba_pool.integrations.dask: worker inproc://"), out["register"]
    for part in ("numba_pool not installed: numba_pool.install: numba-cuda CUDA context(s) already exist on device(s) [0]",
                 "register the plugin before the first task that uses numba.cuda"):
        assert part in out["register"]
    [result] = out["stats"]
    assert result["status"] == "not installed" and "already exist" in result["message"], result
    assert any("ERROR" in line and "already exist" in line for line in out["logs"]), out["logs"]
    assert out["task"] == 3


@pytest.mark.skipif(NUMBA_CUDA not in FRONTENDS, reason=MISSING_FRONTENDS.get(NUMBA_CUDA, ""))
def test_under_the_simulator_nothing_is_installed():  # numba-cuda's simulator
    out = run_cluster(False, env={"NUMBA_ENABLE_CUDASIM": "1", "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool",
                                  "NUMBA_POOL_FRONTEND": "numba-cuda"})
    assert out["before"] == [{"status": "no GPU", "frontend": "numba-cuda", "message": (
        "the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host memory and has no "
        "memory manager for numba_pool to replace")}]
    assert out["register"] == [{"status": "OK"}]
    [result] = out["stats"]
    assert result["status"] == "no GPU" and "numba_pool not installed: the CUDA simulator is on" in result["message"]
    assert out["task"] == 3


def test_bad_options_fail_on_the_client():
    with pytest.raises(numba_pool.ConfigError, match=r"^NumbaPoolPlugin\(\): unknown option"):
        npd.NumbaPoolPlugin(arena_size=1)
    with pytest.raises(numba_pool.ConfigError, match=r"^NumbaPoolPlugin\(arena\)='maybe' is not a switch"):
        npd.NumbaPoolPlugin(arena="maybe")  # the user called NumbaPoolPlugin, not install()
    with pytest.raises(numba_pool.ConfigError, match="max_size"):
        npd.NumbaPoolPlugin(max_size="lots")
    with pytest.raises(numba_pool.ConfigError, match=r"NumbaPoolPlugin\(log\)=123 is not a file path"):
        npd.NumbaPoolPlugin(log=123)  # issue 36: was accepted, to fail on every worker
    assert npd.NumbaPoolPlugin(log="alloc.csv", arena=True).options["log"] == "alloc.csv"
    assert npd.NumbaPoolPlugin(max_size="50%", arena=True).options == {"max_size": "50%", "arena": True}


def test_missing_distributed_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # "import distributed" fails
    monkeypatch.delitem(sys.modules, "numba_pool.integrations.dask")
    with pytest.raises(ImportError) as caught:
        importlib.import_module("numba_pool.integrations.dask")
    assert str(caught.value) == ("numba_pool.integrations.dask needs Dask's distributed: pip install '.[dask]' in a "
                                 "numba-pool checkout (or pip install distributed)")  # numba-pool is not on PyPI
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


class FakeContext:
    """A Numba context as worker_statistics sees it: a memory manager, push and pop."""

    def __init__(self, memory_manager):
        self.memory_manager = memory_manager
        self.pushed = 0

    def push(self):
        self.pushed += 1

    def pop(self):
        self.pushed -= 1


def fake_manager(statistics):
    mm = object.__new__(numba_pool.NumbaPoolManager)  # no CUDA: only what worker_statistics reads
    mm.allocator = object()
    mm.statistics = lambda: statistics
    return mm


def test_statistics_of_a_numba_pool_context_and_another(monkeypatch):
    figures = numba_pool.PoolStatistics(**{f.name: 3 for f in dataclasses.fields(numba_pool.PoolStatistics)
                                           if f.default is dataclasses.MISSING})
    ours, theirs = FakeContext(fake_manager(figures)), FakeContext(object())
    monkeypatch.setattr(npd, "_contexts", lambda frontend: {0: ours, 2: theirs})
    result = npd.worker_statistics()
    expected = figures.to_dict() if hasattr(figures, "to_dict") else dataclasses.asdict(figures)
    name, title = FRONTEND.name, FRONTEND.title
    assert result == {"status": "ok", "device": 0, "frontend": name, "manager": "NumbaPoolManager", **expected,
                      "other_devices": {"2": {
                          "status": "other manager", "device": 2, "frontend": name, "manager": "object",
                          "message": f"{title}'s memory manager on device 2 is object, not numba_pool"}}}
    assert ours.pushed == 0  # pushed for the pool queries, popped again
    json.dumps(result)  # goes to the scheduler as it is


def test_statistics_without_to_dict_use_asdict():
    @dataclasses.dataclass
    class Old:
        total_allocations: int = 5

    assert npd._as_dict(Old()) == {"total_allocations": 5}


def test_statistics_never_raise(monkeypatch):
    def broken(*args):
        raise OSError("driver gone")

    monkeypatch.setattr(npd, "_contexts", broken)
    assert npd.worker_statistics() == {"status": "error", "message": "OSError: driver gone"}
    failing = FakeContext(fake_manager(None))
    failing.memory_manager.statistics = broken
    monkeypatch.setattr(npd, "_contexts", lambda frontend: {1: failing})
    assert npd.worker_statistics() == {"status": "error", "message": "OSError: driver gone"}
    assert failing.pushed == 0


def test_plugin_metric_adds_the_setup_outcome(monkeypatch):
    class Worker:
        address = "tcp://worker:1"
        metrics: dict = {}

    monkeypatch.setattr(npd, "_install", lambda options, frontend: ("no GPU", "numba_pool not installed: no CUDA GPU",
                                                                    FRONTEND.name))
    monkeypatch.setattr(npd, "_contexts", lambda frontend: {})
    plugin, worker = npd.NumbaPoolPlugin(), Worker()
    plugin.setup(worker)
    assert worker.metrics[npd.METRIC](worker) == {
        "status": "no GPU", "frontend": FRONTEND.name, "message": "worker tcp://worker:1: numba_pool not installed: no CUDA GPU"}
    assert npd._run_statistics(worker) == worker.metrics[npd.METRIC](worker)
    plugin.teardown(worker)
    assert npd.METRIC not in worker.metrics


# -- managed memory's figures and options ------------------------------------------------------

#: A device's figures with managed memory on: every field a distinct value, so that a key taken
#: from the wrong field shows.
MANAGED_FIGURES = dict(managed_on=True, managed_reserved_bytes=3 << 20, managed_in_use_bytes=1 << 20,
                       managed_cached_bytes=2 << 20, managed_blocks=5)
MANAGED_KEYS = set(MANAGED_FIGURES)


def managed_statistics() -> numba_pool.PoolStatistics:
    required = [f.name for f in dataclasses.fields(numba_pool.PoolStatistics) if f.default is dataclasses.MISSING]
    return numba_pool.PoolStatistics(**{name: 7 for name in required}, **MANAGED_FIGURES)


def test_the_plugins_metric_carries_the_managed_figures(monkeypatch):
    class Worker:
        address = "tcp://worker:1"
        metrics: dict = {}

    monkeypatch.setattr(npd, "_install", lambda options, frontend: ("installed", None, FRONTEND.name))
    monkeypatch.setattr(npd, "_contexts", lambda frontend: {0: FakeContext(fake_manager(managed_statistics()))})
    plugin, worker = npd.NumbaPoolPlugin(), Worker()
    plugin.setup(worker)
    metric = worker.metrics[npd.METRIC](worker)
    assert metric["status"] == "ok" and MANAGED_KEYS <= set(metric)
    assert {key: metric[key] for key in MANAGED_KEYS} == MANAGED_FIGURES
    assert npd._run_statistics(worker) == metric  # what npd.stats(client) gets from this worker
    assert json.loads(json.dumps(metric))["managed_on"] is True  # reaches the scheduler as it is


# A worker in this process (threads) whose numba_pool serves managed memory: setup "installs" and
# its frontend has one context, whose manager has managed figures.
MANAGED_WORKER = f"""
import numba_pool
import numba_pool.integrations.dask as npd_fake

class FakeContext:
    def __init__(self, memory_manager):
        self.memory_manager = memory_manager
    def push(self):
        pass
    def pop(self):
        pass

mm = object.__new__(numba_pool.NumbaPoolManager)
mm.allocator = object()
mm.statistics = lambda: numba_pool.PoolStatistics(
    **{{n: 7 for n in {sorted(f.name for f in dataclasses.fields(numba_pool.PoolStatistics)
                               if f.default is dataclasses.MISSING)!r}}}, **{MANAGED_FIGURES!r})
npd_fake._install = lambda options, frontend: ("installed", None, {FRONTEND.name!r})
npd_fake._contexts = lambda frontend: {{0: FakeContext(mm)}}
"""


def test_managed_figures_reach_the_scheduler_with_the_workers_metrics():
    out = run_cluster(False, prelude=MANAGED_WORKER, before=False,
                      plugin={"managed_max_size": "1 GiB", "managed_prefetch": True},
                      env={"NUMBA_POOL_FRONTEND": FRONTEND.name})
    assert out["register"] == [{"status": "OK"}]
    for where in ("stats", "metrics"):  # asked of the worker; sent by its heartbeat
        [result] = out[where]
        assert result["status"] == "ok" and result["frontend"] == FRONTEND.name, (where, result)
        assert {key: result.get(key) for key in MANAGED_KEYS} == MANAGED_FIGURES, (where, result)
    assert out["task"] == 3


def test_the_plugin_takes_the_managed_options_and_hands_them_to_install(monkeypatch):
    options = {"managed": True, "managed_max_size": "1 GiB", "managed_release_threshold": "64 MiB",
               "managed_prefetch": True}
    plugin = npd.NumbaPoolPlugin(arena=True, **options)
    copy = pickle.loads(pickle.dumps(plugin))  # what reaches a worker
    assert copy.options == {"arena": True, **options}
    installed = []
    gpu = types.SimpleNamespace(name=FRONTEND.name, simulator=False,
                                cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setattr(npd.frontends, "named", lambda name, what: gpu)
    monkeypatch.setattr(npd, "install", lambda **kw: installed.append(kw))
    monkeypatch.setattr(npd, "_contexts", lambda frontend: {})

    class Worker:
        address = "tcp://worker:1"
        metrics: dict = {}

    copy.setup(Worker())
    assert copy.status == "installed" and installed == [{"frontend": FRONTEND.name, "arena": True, **options}]
    assert numba_pool.config.load(environ={}, **options) == numba_pool.config.PoolConfig(
        managed_max_size=1 << 30, managed_release_threshold=64 << 20, managed_prefetch=True)
    assert npd.NumbaPoolPlugin(managed=False).options == {"managed": False}


@pytest.mark.parametrize("options, culprit", [
    ({"managed": "maybe"}, "NumbaPoolPlugin(managed)='maybe' is not a switch"),
    ({"managed_max_size": "lots"}, "NumbaPoolPlugin(managed_max_size)='lots' is not a size"),
    ({"managed_initial_size": "2 MiB"}, "'managed_initial_size' (no longer read: managed blocks come from cuMemAllocManaged"),
    ({"managed_prefetsh": True}, "did you mean 'managed_prefetch'?"),
])
def test_bad_managed_options_fail_on_the_client(options, culprit):
    with pytest.raises(numba_pool.ConfigError) as caught:
        npd.NumbaPoolPlugin(**options)
    assert culprit in str(caught.value)


# -- memory debugging on request: the history and snapshots ------------------------------------

class PushCounting:
    """What a Numba context does for worker_snapshot: push and pop (the model's stand-in has
    neither); counts both."""

    def __init__(self, context):
        self.pushes = self.pops = 0
        context.push, context.pop = self.push, self.pop

    def push(self):
        self.pushes += 1

    def pop(self):
        self.pops += 1


@pytest.fixture
def program(monkeypatch):
    """numba_pool's real manager on the CUDA model (tests/cuda_model), the history off after;
    the process's managers are this one alone (other tests' managers may still be alive)."""
    from cuda_model.harness import Program
    from numba_pool.plugin import api

    p = Program(arena=True)
    monkeypatch.setattr(npd, "managers", lambda: [p.mm])
    monkeypatch.setattr(api, "managers", lambda: [p.mm])
    yield p
    numba_pool.record_history(False)
    p.close()


def allocate_here(p, size: int):
    return p.mm.memalloc(size)  # the line a snapshot's frames must name


def test_a_workers_snapshot_is_numba_pools_read_in_each_managers_context(program):
    context = PushCounting(program.context)
    numba_pool.record_history()
    kept, dropped = allocate_here(program, 1000), allocate_here(program, 100_000)
    del dropped
    snapshot = npd.worker_snapshot()
    assert context.pushes == context.pops >= 1  # the context was current while the pool was read
    assert snapshot == numba_pool.snapshot() and "error" not in snapshot
    [block] = [b for s in snapshot["segments"] for b in s["blocks"] if b["requested_size"] == 1000]
    assert block["state"] == "active_allocated" and block["frames"][0]["name"] == "allocate_here"
    assert [e["action"] for e in snapshot["device_traces"][0]] == ["alloc", "alloc", "free_requested", "free_completed"]
    pickle.loads(pickle.dumps(snapshot))  # goes to the client as it is
    del kept


def test_a_snapshot_without_the_history_has_the_segments_and_no_frames(program):
    PushCounting(program.context)
    kept = allocate_here(program, 1000)
    snapshot = npd.worker_snapshot()
    assert snapshot["segments"] and snapshot["device_traces"] == [[]]
    assert all(b["frames"] == [] for s in snapshot["segments"] for b in s["blocks"])
    del kept


def test_a_manager_without_a_pool_is_read_without_pushing_its_context():
    context = types.SimpleNamespace(push=lambda: pytest.fail("pushed"), pop=lambda: pytest.fail("popped"))
    mm = object.__new__(numba_pool.NumbaPoolManager)  # not initialized: no pool
    mm.allocator, mm.context = None, context
    assert npd._segments_in_context(mm) == []


def test_a_workers_snapshot_never_raises(monkeypatch, program):
    def broken():
        raise OSError("driver gone")

    monkeypatch.setattr(npd, "managers", broken)
    assert npd.worker_snapshot() == {"segments": [], "device_traces": [], "allocator_settings": {"allocator": "numba_pool"},
                                     "error": "OSError: driver gone"}
    program.context.push = broken  # a context that cannot be made current
    monkeypatch.setattr(npd, "managers", lambda: [program.mm])
    assert npd.worker_snapshot()["error"] == "OSError: driver gone"


class FakeClient:
    """``client.run`` on two workers in this process: the second fails where errors are returned;
    with ``asynchronous``, an awaitable of the same."""

    def __init__(self, asynchronous: bool = False):
        self.asynchronous = asynchronous

    def run(self, function, *args, on_error="raise"):
        results = {"tcp://a:1": function(*args)}
        if on_error == "return":
            results["tcp://b:2"] = OSError("worker lost")
        if self.asynchronous:
            async def later():
                return results

            return later()
        return results


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_snapshots_by_worker_address_a_worker_that_failed_says_so(program, asynchronous):
    import asyncio

    PushCounting(program.context)
    kept = allocate_here(program, 1000)
    result = npd.snapshots(FakeClient(asynchronous))
    if asynchronous:
        result = asyncio.run(result)
    assert result == {"tcp://a:1": numba_pool.snapshot(),
                      "tcp://b:2": {"segments": [], "device_traces": [], "allocator_settings": {"allocator": "numba_pool"},
                                    "error": "OSError: worker lost"}}
    del kept


def test_record_history_switches_every_worker_and_says_what_records(program):
    from numba_pool.observe import history
    from numba_pool.plugin.state import process

    assert npd.record_history(FakeClient(), stacks="none", max_entries=10) == {
        "tcp://a:1": {"recording": True, "stacks": "none", "max_entries": 10}}
    assert process.recording.stacks == "none" and program.mm.path.layers[0] == "history"
    assert npd.record_history(FakeClient()) == {
        "tcp://a:1": {"recording": True, "stacks": "python", "max_entries": history.DEFAULT_MAX_ENTRIES}}
    assert npd.record_history(FakeClient(), enabled=False) == {"tcp://a:1": {"recording": False}}
    assert process.recording is None and "history" not in program.mm.path.layers
    with pytest.raises(ValueError, match=r"stacks='cpp' must be one of 'python', 'none'"):
        npd.record_history(FakeClient(), stacks="cpp")


# A worker in this process (threads) with numba_pool's manager on the CUDA model: the history is
# switched on through the client, an array allocated, and each worker's snapshot asked for.
SNAPSHOT_PROGRAM = """
import json, sys
sys.path.insert(0, TESTS)
from distributed import Client, LocalCluster
from cuda_model.harness import Program
import numba_pool.integrations.dask as npd

def main():
    p = Program(arena=True)
    p.context.push = p.context.pop = lambda: None
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None) as cluster, \\
            Client(cluster) as client:
        out = {"recording": list(npd.record_history(client, max_entries=100).values())}
        kept = p.mm.memalloc(1000)  # in this process: the worker's
        [snapshot] = npd.snapshots(client).values()
        out["blocks"] = [(b["requested_size"], b["frames"][0]["name"] if b["frames"] else None)
                         for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        out["traces"] = [e["action"] for e in snapshot["device_traces"][0]]
        out["off"] = list(npd.record_history(client, enabled=False).values())
        del kept
    p.close()
    print(json.dumps(out))

if __name__ == "__main__":
    main()
"""


def test_a_workers_snapshot_reaches_the_client_through_dask():
    from helpers import TESTS

    with tempfile.TemporaryDirectory() as scratch:
        proc = run_python(SNAPSHOT_PROGRAM.replace("TESTS", repr(TESTS)), {"DASK_TEMPORARY_DIRECTORY": scratch},
                          timeout=CLUSTER_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["recording"] == [{"recording": True, "stacks": "python", "max_entries": 100}]
    assert out["blocks"] == [[1000, "main"]] and out["traces"] == ["alloc"]
    assert out["off"] == [{"recording": False}]


@pytest.mark.parametrize("call, client, line", [
    ("stats", None, "numba_pool.integrations.dask.stats: client=None (NoneType) is not a Dask client "
                    "(distributed.Client)"),
    ("snapshots", "tcp://127.0.0.1:8786", "numba_pool.integrations.dask.snapshots: client='tcp://127.0.0.1:8786' "
                                          "(str) is not a Dask client (distributed.Client): connect first, "
                                          "Client('tcp://127.0.0.1:8786')"),
    ("record_history", 3, "numba_pool.integrations.dask.record_history: client=3 (int) is not a Dask client "
                          "(distributed.Client)"),
])
def test_a_helper_given_no_client_says_so_in_one_line(call, client, line):
    """Not ``AttributeError: 'NoneType' object has no attribute 'run'`` (issue 36)."""
    with pytest.raises(TypeError) as caught:
        getattr(npd, call)(client)
    assert str(caught.value) == line
