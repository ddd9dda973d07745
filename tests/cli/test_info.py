"""The library's command line, ``numba-pool`` (``numba-pool info``): one line on standard error
naming the culprit, exit status 2, no traceback, for bad configuration; 3 without a GPU; what
``info`` shows on a (faked) GPU machine; and the commands that moved to ``numba-pool-tools``
named in one line (exit status 2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from helpers import FRONTEND, GPU, PACKAGE_PARENT, check_one_line_error, cuda
from numba_pool.cli import MOVED, main
from numba_pool.cuda.frontend import PACKAGES

TYPO = "NUMBA_POOL_" + "ARNEA"  # NUMBA_POOL_ARENA mistyped, split so the scan of known names skips it


def numba_pool_cli(*args, env=None, cwd=PACKAGE_PARENT):
    """``python -m numba_pool ARGS``."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "numba_pool", *args], env=full_env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_unknown_command_is_one_line():
    result = CliRunner().invoke(main, ["replai"])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "No such command 'replai'")


@pytest.mark.parametrize("command", MOVED)
def test_a_moved_command_says_where_it_went_in_one_line_exit_2(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout,
                         f"'numba-pool {command}' moved to the numba-pool-tools command: pip install -e ./tools from "
                         f"a numba-pool checkout, then run numba-pool-tools {command}")


def test_a_moved_command_in_a_real_process():
    proc = numba_pool_cli("bench", "--part", "allocator")
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, "'numba-pool bench' moved to the numba-pool-tools command")


def test_bad_configuration_is_one_clear_line_and_exit_2():
    proc = numba_pool_cli("info", env={"NUMBA_POOL_INITIAL_SIZE": "a lot"})
    assert proc.returncode == 2
    assert "NUMBA_POOL_INITIAL_SIZE='a lot' is not a size" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
def test_without_gpu_one_line_and_exit_3():
    proc = numba_pool_cli("info")
    assert proc.returncode == 3  # 2 is a bad configuration: a script can tell them apart
    assert "no CUDA GPU is available" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
def test_info_without_gpu_prints_versions_and_configuration_first():
    proc = numba_pool_cli("info", env={"NUMBA_POOL_ARENA": "1"})
    assert proc.returncode == 3 and proc.stderr.strip().splitlines() == [
        f"Error: no CUDA GPU is available here ({PACKAGES[FRONTEND.name]}.is_available() is False): numba-pool needs one "
        "for this command"]
    for row in ("numba-pool", "frontend numba-cuda", "frontend mlir", "frontend in use", "compiled module", "cuda-bindings", "config: arena"):
        assert row in proc.stdout
    assert "on: blocks up to 64 KiB" in proc.stdout  # the configuration in effect, not the defaults


def test_info_prints_the_managed_options_in_effect():
    proc = numba_pool_cli("info", env={
        "NUMBA_POOL_MANAGED_MAX_SIZE": "1 GiB", "NUMBA_POOL_MANAGED_RELEASE_THRESHOLD": "64MiB",
        "NUMBA_POOL_MANAGED_PREFETCH": "yes"})
    assert proc.returncode == (0 if GPU else 3), proc.stderr  # without a GPU, after the configuration
    rows = _as_rows(proc.stdout)
    assert rows["config: managed"] == (
        "on: managed arrays from cuMemAllocManaged, blocks cached, cap 1 GiB (1073741824 bytes), release threshold "
        "64 MiB (67108864 bytes), prefetched to the device at allocation")
    if GPU:  # one row per device, each saying who serves its managed arrays
        assert "managed on device 0" in rows and rows["managed on device 0"].startswith("concurrent managed access: ")
    else:
        assert not any(name.startswith("managed on device") for name in rows)  # no device facts without a GPU


@pytest.mark.parametrize("variable, value, culprit", [
    ("NUMBA_POOL_MANAGED", "maybe", "NUMBA_POOL_MANAGED='maybe' is not a switch"),
    ("NUMBA_POOL_MANAGED_MAX_SIZE", "lots", "NUMBA_POOL_MANAGED_MAX_SIZE='lots' is not a size"),
    ("NUMBA_POOL_MANAGED_PREFETCH", "2", "NUMBA_POOL_MANAGED_PREFETCH='2' is not a switch"),
])
def test_info_names_a_bad_managed_variable_in_one_line_exit_2(variable, value, culprit):
    result = CliRunner().invoke(main, ["info"], env={variable: value})
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, culprit)


def test_info_bad_managed_switch_in_a_real_process():
    proc = numba_pool_cli("info", env={"NUMBA_POOL_MANAGED": "maybe"})
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, "NUMBA_POOL_MANAGED='maybe' is not a switch")


def test_info_says_a_retired_managed_variable_is_ignored():
    proc = numba_pool_cli("info", env={"NUMBA_POOL_MANAGED_INITIAL_SIZE": "2 MiB"})
    assert proc.returncode == (0 if GPU else 3), proc.stderr
    assert ("NUMBA_POOL_MANAGED_INITIAL_SIZE is no longer read and is ignored: managed blocks come from "
            "cuMemAllocManaged") in proc.stderr
    assert "did you mean" not in proc.stderr



def test_help_lists_the_commands():
    proc = numba_pool_cli("--help")
    assert proc.returncode == 0
    assert "info" in proc.stdout and "numba-pool-tools" in proc.stdout  # where the moved ones went
    for moved in MOVED:
        assert f"  {moved} " not in proc.stdout


# -- the commands on a GPU, faked: what they show and hand on ----------------------------------------

def _as_rows(table: str) -> dict[str, str]:
    """A plain two-column table as ``{name: value}``."""
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in table.strip().splitlines())


#: The fake GPU machine's devices: ordinal -> CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS.
CONCURRENT_MANAGED_ACCESS = {0: 1, 1: 0}


@pytest.fixture
def fake_gpu_info(monkeypatch):
    """``numba-pool info`` on a fake GPU machine of two devices (device 1 current, without
    concurrent managed access): yields what it asked numba_pool and the driver."""
    import numba_pool
    from cuda.bindings import driver

    from numba_pool.cli import info

    device = SimpleNamespace(id=1, name=b"Fake GPU", compute_capability=(9, 0))
    asked = []

    def attribute(attr, dev):
        asked.append(("attribute", attr, int(dev)))
        return 0, CONCURRENT_MANAGED_ACCESS[int(dev)]

    monkeypatch.setattr(info, "gpu_available", lambda: True)
    monkeypatch.setattr(numba_pool, "install", lambda **kw: asked.append(("install", kw)))
    monkeypatch.setattr(cuda, "current_context", lambda: SimpleNamespace(device=device))  # the tools' frontend's
    monkeypatch.setattr(driver, "cuDriverGetVersion", lambda: (0, 13020))
    monkeypatch.setattr(driver, "cuDeviceGetCount", lambda: (0, len(CONCURRENT_MANAGED_ACCESS)))
    monkeypatch.setattr(driver, "cuDeviceGetAttribute", attribute)
    monkeypatch.setattr(numba_pool, "stats", lambda **kw: asked.append(("stats", kw)) or SimpleNamespace(
        pool_reserved_bytes=2 << 20, pool_reserved_high=4 << 20, pool_used_bytes=1024, pool_used_high=3000))
    yield asked


def test_info_shows_the_device_and_the_pools_bytes_from_numba_pool_stats(fake_gpu_info):
    from cuda.bindings import driver

    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0, result.output
    access = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
    assert fake_gpu_info == [("install", {"frontend": FRONTEND.name}), ("attribute", access, 0),
                             ("attribute", access, 1), ("stats", {"frontend": FRONTEND.name})]
    rows = _as_rows(result.stdout)
    assert rows["frontend in use"].startswith(FRONTEND.name)
    assert list(rows)[:6] == ["device", "compute capability", "driver (CUDA version)", "managed on device 0",
                              "managed on device 1", "python"]
    assert rows["device"] == "1: Fake GPU" and rows["compute capability"] == "9.0"
    assert rows["driver (CUDA version)"] == "13.2" and "config: arena" in rows
    assert list(rows)[-4:] == ["pool reserved", "pool reserved high", "pool used", "pool used high"]
    assert rows["pool reserved"] == "2 MiB (2097152 bytes)" and rows["pool reserved high"] == "4 MiB (4194304 bytes)"
    assert rows["pool used"] == "1 KiB (1024 bytes)" and rows["pool used high"] == "2.93 KiB (3000 bytes)"


def test_info_says_per_device_whether_numba_pool_serves_managed_arrays(fake_gpu_info):
    rows = _as_rows(CliRunner().invoke(main, ["info"]).stdout)
    assert rows["managed on device 0"] == (
        "concurrent managed access: yes; numba_pool serves managed arrays from cuMemAllocManaged, blocks cached "
        "(host-attached ones, attach_global=False, stay Numba's)")
    assert rows["managed on device 1"] == (
        "concurrent managed access: no; managed arrays from Numba's own path (cuMemAllocManaged/cuMemFree per "
        "array): device 1 has no concurrent managed access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS is 0): the "
        "host must not touch managed memory while a kernel runs")


def test_info_says_numba_serves_managed_arrays_when_switched_off(fake_gpu_info):
    result = CliRunner().invoke(main, ["info"], env={"NUMBA_POOL_MANAGED": "0"})
    assert result.exit_code == 0, result.output
    rows = _as_rows(result.stdout)
    numba = "managed arrays from Numba's own path (cuMemAllocManaged/cuMemFree per array): NUMBA_POOL_MANAGED is off"
    assert rows["managed on device 0"] == f"concurrent managed access: yes; {numba}"
    assert rows["managed on device 1"] == (
        f"concurrent managed access: no; {numba}")
    assert rows["config: managed"] == "off: Numba's cuMemAllocManaged/cuMemFree per array"


def test_info_names_a_failed_managed_access_query_in_one_line(fake_gpu_info, monkeypatch):
    from cuda.bindings import driver

    refused = driver.CUresult.CUDA_ERROR_INVALID_DEVICE
    monkeypatch.setattr(driver, "cuDeviceGetAttribute", lambda attr, dev: (refused, 0))
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout,
                         "cuDeviceGetAttribute(CONCURRENT_MANAGED_ACCESS) failed with CUDA_ERROR_INVALID_DEVICE")


def test_the_command_alone_prints_its_help():
    proc = numba_pool_cli()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("Usage: numba-pool") and "info" in proc.stdout


def test_info_lists_the_doors_onto_the_pool(monkeypatch):
    # Issue 35, item 5: which doors are installed, without importing CuPy or PyTorch.
    from numba_pool.cuda import frontend as frontends
    real = frontends.version
    monkeypatch.setattr(frontends, "version", lambda d: "2.11.0" if d == "torch" else None if d.startswith("cupy")
                        else real(d))
    rows = _as_rows(CliRunner().invoke(main, ["info"], env={"NUMBA_POOL_CUDA_CORE": "0"}).stdout)
    assert rows["door numba"] == "Numba's memory manager (EMM plugin)"
    assert rows["door cuda.core"].startswith("off (NUMBA_POOL_CUDA_CORE=0)")
    assert rows["door cupy"] == "cupy-cuda13x not installed"
    assert rows["door torch"] == ("torch 2.11.0: a program calls "
                                  "torch.cuda.memory.change_current_allocator(numba_pool.torch_allocator())")


def test_a_variable_typo_is_one_warning_line_naming_the_command(monkeypatch):
    """Not ``click/core.py:911: ConfigWarning: ...`` and its source line: the frame Python names is Click's."""
    monkeypatch.setenv(TYPO, "1")
    monkeypatch.setenv("NUMBA_POOL_INITIAL_SIZE", "a lot")  # stops info before any GPU question
    result = CliRunner().invoke(main, ["info"], prog_name="numba-pool")
    assert result.exit_code == 2 and "Traceback" not in result.stderr, result.stderr
    warning, error = result.stderr.splitlines()
    assert warning == (f"numba-pool: warning: {TYPO} is not a numba_pool variable and is ignored: did you "
                       "mean NUMBA_POOL_ARENA?")
    assert error.startswith("Error: NUMBA_POOL_INITIAL_SIZE='a lot' is not a size"), error


def test_the_simulator_warning_of_python_m_numba_pool_is_one_line_naming_the_command():
    """Not ``<frozen runpy>:112: SimulatorWarning: ...``: numba_pool leaves the import-time note to the command."""
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "numba_pool", "info"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "runpy" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[0].startswith("numba-pool: warning: NUMBA_CUDA_MEMORY_MANAGER=numba_pool is "
                                                  "ignored"), proc.stderr
