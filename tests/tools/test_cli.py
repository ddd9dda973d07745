"""The command line's errors: one line on standard error naming the culprit, exit status 2, no
traceback, for bad configuration, bad options, bad input files and machines without a GPU.

:data:`BAD` is the table CI runs: command line and input file -> the text the error line must
hold.  Every row runs in process (Click's runner: fast); the rows marked ``subprocess`` run again
as a real ``python -m numba_pool``, so that "no traceback" is checked on a real standard error.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from helpers import FRONTEND, GPU, PACKAGE_PARENT, check_one_line_error, cuda
from numba_pool.cli import main
from numba_pool.cuda.frontend import PACKAGES

HEADER = b"Thread,Time,Action,Pointer,Size,Stream\n"
GOOD = HEADER + b"1,t,allocate,0x20,8,0x1\n1,t,free,0x20,8,0x1\n"
#: The source checkout this file is in (tests/tools/ is two levels below it).
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def numba_pool_cli(*args, env=None, cwd=PACKAGE_PARENT, prelude=None):
    """``python -m numba_pool ARGS``; with ``prelude``, Python code run first in the same process."""
    full_env = {**os.environ, **(env or {})}
    command = [sys.executable, "-m", "numba_pool", *args]
    if prelude:
        command = [sys.executable, "-c", f"{prelude}\nimport sys, runpy\nsys.argv = ['numba-pool', *sys.argv[1:]]\n"
                                         "runpy.run_module('numba_pool', run_name='__main__')", *args]
    return subprocess.run(command, env=full_env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _gzip_cut() -> bytes:
    whole = gzip.compress(GOOD + b"".join(b"1,t,allocate,%#x,8,0x1\n" % (0x100 * i) for i in range(1, 5000)))
    return whole[: len(whole) // 2]


# id -> (argv after "replay" with {log} and {tmp} filled in, the log's bytes, text the error must hold)
BAD = {
    "plot-folder-missing": (["{log}", "--plot", "/nonexistent/dir/x.png"], GOOD, "folder '/nonexistent/dir' does not exist"),
    "plot-format-txt": (["{log}", "--plot", "{tmp}/out.txt"], GOOD, "cannot write '.txt' files"),
    "plot-is-a-folder": (["{log}", "--plot", "{tmp}"], GOOD, "is a directory"),
    "csv-field-over-128k": (["{log}"], HEADER + b"1,t,allocate,0x10," + b"9" * 200_000 + b",0x1\n",
                            "line 2: '1,t,allocate,0x10,9999"),
    "csv-quoted-field-over-csv-limit": (["{log}"], HEADER + b'1,t,"allocate",0x10,"' + b"9" * 200_000 + b'",0x1\n',
                                        "line 2: '1,t,\"allocate\",0x10,\"9999"),
    "binary-file": (["{log}"], b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "line 1: not a text file"),
    "gzip-cut-short": (["{log}"], _gzip_cut(), "damaged gzip file"),
    "utf16-file": (["{log}"], codecs.BOM_UTF16_LE + GOOD.decode().encode("utf-16-le"), "UTF-16"),
    "empty-file": (["{log}"], b"", "line 1: the file is empty"),
    "wrong-header": (["{log}"], b"a,b,c\n", "line 1: 'a,b,c': expected the header"),
    "free-never-allocated": (["{log}"], HEADER + b"1,t,free,0x99,5,0x1\n", "line 2: '1,t,free,0x99,5,0x1': free of a pointer"),
    "double-free": (["{log}"], GOOD + b"1,t,free,0x20,8,0x1\n", "line 4: '1,t,free,0x20,8,0x1': double free (0x20)"),
    "negative-size": (["{log}"], HEADER + b"1,t,allocate,0x10,-5,0x1\n", "size '-5' is negative"),
    "pointer-over-64-bits": (["{log}"], HEADER + b"1,t,allocate,0x1" + b"0" * 16 + b",8,0x1\n", "does not fit in 64 bits"),
    "bad-byte-in-line": (["{log}"], HEADER + b"1,t,allocate,0x10,8\xff,0x1\n", "line 2: '1,t,allocate,0x10,8\\\\xff,0x1'"),
    "slab-size-not-a-size": (["{log}", "--slab-size", "big"], GOOD, "--slab-size='big' is not a size"),
    "slab-size-not-256-multiple": (["{log}", "--slab-size", "1000"], GOOD, "--slab-size=1000 bytes is not a positive multiple of 256"),
    "max-block-zero": (["{log}", "--max-block", "0"], GOOD, "--max-block=0 bytes"),
    "max-block-above-slab-size": (["{log}", "--max-block", "8 MiB", "--slab-size", "4 MiB"], GOOD,
                                  "--max-block=8388608 bytes (8 MiB) is above --slab-size=4194304 bytes"),
    "release-threshold-not-a-size": (["{log}", "--release-threshold", "lots"], GOOD, "--release-threshold='lots' is not a size"),
    "release-threshold-negative": (["{log}", "--release-threshold", "-1"], GOOD, "--release-threshold='-1'"),
    "trace-missing": (["{tmp}/nope.csv"], None, "nope.csv' does not exist"),
    "trace-is-a-folder": (["{tmp}"], None, "is a directory"),
    "unknown-option": (["{log}", "--frobnicate"], GOOD, "No such option '--frobnicate'"),
    "no-trace": ([], None, "Missing argument 'TRACE'"),
}
SUBPROCESS = {"plot-folder-missing", "csv-field-over-128k", "binary-file", "max-block-above-slab-size"}


def _argv(tmp_path, argv, content) -> list[str]:
    log = tmp_path / "trace.csv"
    if content is not None:
        log.write_bytes(content)
    return [a.format(log=log, tmp=tmp_path) for a in argv]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2(tmp_path, case):
    argv, content, culprit = BAD[case]
    result = CliRunner().invoke(main, ["replay", *_argv(tmp_path, argv, content)])
    assert isinstance(result.exception, SystemExit), result.exception  # not an exception escaping
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, culprit)


@pytest.mark.parametrize("case", sorted(SUBPROCESS))
def test_bad_input_in_a_real_process(tmp_path, case):
    argv, content, culprit = BAD[case]
    proc = numba_pool_cli("replay", *_argv(tmp_path, argv, content))
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, culprit)


def test_unknown_command_is_one_line():
    result = CliRunner().invoke(main, ["replai"])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "No such command 'replai'")


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path):
    log = tmp_path / "trace.csv"
    log.write_bytes(GOOD)
    proc = numba_pool_cli("replay", str(log), "--plot", str(tmp_path / "x.png"),
                          prelude="import sys; sys.modules['matplotlib'] = None")
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, "pip install 'numba-pool[plot]'")
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_in_process(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    log = tmp_path / "trace.csv"
    log.write_bytes(GOOD)
    result = CliRunner().invoke(main, ["replay", str(log), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "pip install 'numba-pool[plot]'")


# Inputs that used to fail and must replay.
GOOD_INPUTS = {
    "release-threshold-all": (["{log}", "--release-threshold", "all"], GOOD),
    "release-threshold-size": (["{log}", "--release-threshold", "1 MiB"], GOOD),
    "byte-order-mark": (["{log}"], codecs.BOM_UTF8 + GOOD),
    "crlf-line-ends": (["{log}"], GOOD.replace(b"\n", b"\r\n")),
    "gzip": (["{log}"], gzip.compress(GOOD)),
    "huge-thread-field": (["{log}"], HEADER + b"x" * 200_000 + b",t,allocate,0x20,8,0x1\n1,t,free,0x20,8,0x1\n"),
    "quoted-fields": (["{log}"], HEADER + b'"1","t","allocate","0x20","8","0x1"\n1,t,free,0x20,8,0x1\n'),
}


@pytest.mark.parametrize("case", GOOD_INPUTS)
def test_inputs_that_replay(tmp_path, case):
    argv, content = GOOD_INPUTS[case]
    result = CliRunner().invoke(main, ["replay", *_argv(tmp_path, argv, content)])
    assert result.exit_code == 0, result.output
    assert "operations                         2" in result.stdout and "end to end, reading included" in result.stdout


def test_plot_without_extension_prints_the_real_path(tmp_path):
    log = tmp_path / "trace.csv"
    log.write_bytes(GOOD)
    result = CliRunner().invoke(main, ["replay", str(log), "--plot", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == f"plot written to {tmp_path / 'out.png'}"
    assert (tmp_path / "out.png").stat().st_size > 1000 and not (tmp_path / "out").exists()


def test_help_shows_sizes_in_human_units():
    result = CliRunner().invoke(main, ["replay", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # as wrapped for any terminal width
    assert "(default: 4 MiB)" in text and "(default: 64 KiB)" in text and "(default: all)" in text


@pytest.mark.parametrize("command", ["info", "bench"])
def test_bad_configuration_is_one_clear_line_and_exit_2(command):
    proc = numba_pool_cli(command, env={"NUMBA_POOL_INITIAL_SIZE": "a lot"})
    assert proc.returncode == 2
    assert "NUMBA_POOL_INITIAL_SIZE='a lot' is not a size" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("command", ["info", "bench"])
def test_without_gpu_one_line_and_exit_3(command):
    proc = numba_pool_cli(command)
    assert proc.returncode == 3  # 2 is a bad configuration: a script can tell them apart
    assert "no CUDA GPU is available" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
def test_info_without_gpu_prints_versions_and_configuration_first():
    proc = numba_pool_cli("info", env={"NUMBA_POOL_ARENA": "1"})
    assert proc.returncode == 3 and proc.stderr.strip().splitlines() == [
        f"Error: no CUDA GPU is available here ({PACKAGES[FRONTEND.name]}.is_available() is False): numba-pool needs one "
        "for this command"]
    for row in ("numba-pool", "frontend numba-cuda", "frontend mlir", "frontend in use", "cuda-bindings", "config: arena"):
        assert row in proc.stdout
    assert "on: blocks up to 64 KiB" in proc.stdout  # the configuration in effect, not the defaults


def test_info_prints_the_managed_options_in_effect():
    proc = numba_pool_cli("info", env={
        "NUMBA_POOL_MANAGED_MAX_SIZE": "1 GiB", "NUMBA_POOL_MANAGED_RELEASE_THRESHOLD": "64MiB",
        "NUMBA_POOL_MANAGED_INITIAL_SIZE": "2 MiB", "NUMBA_POOL_MANAGED_PREFETCH": "yes"})
    assert proc.returncode == (0 if GPU else 3), proc.stderr  # without a GPU, after the configuration
    rows = _as_rows(proc.stdout)
    assert rows["config: managed"] == (
        "on: managed arrays from a managed mempool, blocks cached, cap 1 GiB (1073741824 bytes), release threshold "
        "64 MiB (67108864 bytes), initial size 2 MiB (2097152 bytes), prefetched to the device at allocation")
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


def test_info_names_a_managed_reserve_above_its_cap_in_one_line():
    result = CliRunner().invoke(main, ["info"], env={"NUMBA_POOL_MANAGED_INITIAL_SIZE": "2 MiB",
                                                     "NUMBA_POOL_MANAGED_MAX_SIZE": "1 MiB"})
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout,
                         "NUMBA_POOL_MANAGED_INITIAL_SIZE='2 MiB' (2097152 bytes) is above NUMBA_POOL_MANAGED_MAX_SIZE='1 MiB'")


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("module", ["numba_pool.kernels.increment", "numba_pool.kernels.sqrt", "numba_pool.kernels.fill"])
def test_kernel_scripts_without_gpu_one_line_and_exit_2(module):
    # From the source checkout's top level: numba_pool comes from the checkout there, whose
    # numba_pool/kernels is a shim onto kernels/.
    checkout = CHECKOUT
    proc = subprocess.run([sys.executable, "-m", module, "--iterations", "1"], cwd=checkout, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"{module.rsplit('.', 1)[1]}.py: no CUDA GPU is available here ({PACKAGES[FRONTEND.name]}.is_available() is "
        "False): this script runs kernels on one"]


def test_kernel_scripts_name_a_bad_variable_in_one_line_before_anything_runs():
    checkout = CHECKOUT
    env = {**os.environ, "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_POOL_ARENA_MAX_BLOCK": "1000"}
    proc = subprocess.run([sys.executable, "-m", "numba_pool.kernels.sqrt", "--iterations", "1"], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sqrt.py: NUMBA_POOL_ARENA_MAX_BLOCK='1000'"), lines


def test_kernels_import_from_a_checkout_without_the_editable_finder():
    """``python -m numba_pool.kernels.sqrt`` inside a checkout with a plain (not editable)
    install or none: only sys.path's finder, and numba_pool is the checkout's."""
    checkout = CHECKOUT
    code = ("import sys, os; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in repr(f)]\n"
            "sys.path.insert(0, os.getcwd())\n"
            "import numba_pool, numba_pool.kernels.sqrt as s\n"
            "print(os.path.dirname(numba_pool.__file__), s.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [os.path.join(checkout, "numba_pool"), os.path.join(checkout, "numba_pool", "kernels", "sqrt.py")]


def test_help_lists_the_commands():
    proc = numba_pool_cli("--help")
    assert proc.returncode == 0
    for command in ("bench", "info", "replay"):
        assert command in proc.stdout


def test_bench_help_offers_the_host_rows_switch():
    result = CliRunner().invoke(main, ["bench", "--help"])
    text = " ".join(result.stdout.split())
    assert result.exit_code == 0 and "--host-rows / --no-host-rows" in text and "NUMBA_POOL_HOST=1" in text
    assert "seed" not in text.lower()


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
        "concurrent managed access: yes; numba_pool serves managed arrays from a managed mempool, blocks cached "
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


@pytest.fixture
def fake_gpu_bench(monkeypatch):
    """``numba-pool bench`` on a fake GPU, its parts replaced: yields what ``report.run`` was given
    and lets a test set what it returns or raises."""
    from numba import cuda

    from numba_pool.bench import report
    from numba_pool.cli import bench

    asked = {"returns": ({"device": "Fake GPU"}, [])}

    def run(setting, **options):
        asked.update(setting=setting, options=options)
        if isinstance(asked["returns"], Exception):
            raise asked["returns"]
        return asked["returns"]

    monkeypatch.setattr(bench, "require_gpu", lambda: None)
    monkeypatch.setattr(cuda, "get_current_device", lambda: SimpleNamespace(name=b"Fake GPU"))
    monkeypatch.setattr(report, "run", run)
    yield asked


def test_bench_hands_its_options_to_the_parts_and_writes_their_report(fake_gpu_bench, tmp_path):
    core = min(os.sched_getaffinity(0))
    result = CliRunner().invoke(main, ["bench", "--no-anchors", "--with-rmm", "--part", "end-to-end", "--rounds", "3",
                                       "--core", str(core), "--baseline", str(tmp_path), "--json",
                                       str(tmp_path / "out.json")])
    assert result.exit_code == 0, result.output
    setting, options = fake_gpu_bench["setting"], fake_gpu_bench["options"]
    assert (setting.device, setting.core) == ("Fake GPU", core)
    assert options == {"part": "end-to-end", "baseline": str(tmp_path), "anchors": True, "plain_pool": False,
                       "no_arena": False, "rounds": 3, "runs": 1, "warm_up": 1, "turns": True, "host_rows": True,
                       "managed_rows": True, "device_rows": True}
    assert json.loads((tmp_path / "out.json").read_text()) == {"device": "Fake GPU"}
    assert result.stdout.strip().splitlines()[-1].startswith("self-checks passed")


def test_bench_exits_1_when_a_check_failed(fake_gpu_bench):
    from numba_pool.bench.checks import Flag

    fake_gpu_bench["returns"] = ({}, [Flag("end to end", "256", "numba_pool", "rounds disagree")])
    result = CliRunner().invoke(main, ["bench"])
    assert result.exit_code == 1 and result.stdout.strip().splitlines()[-1].startswith("SELF-CHECKS: 1 FAILED")


def test_a_bench_part_that_cannot_go_on_is_one_line_and_exit_2(fake_gpu_bench):
    from numba_pool.bench.report import BenchError

    fake_gpu_bench["returns"] = BenchError("benchmark of numba_pool failed: exit 1:\nImportError: libcuda.so")
    result = CliRunner().invoke(main, ["bench"])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "Error: benchmark of numba_pool failed: exit 1: ImportError: libcuda.so")


def test_bench_refuses_a_core_it_may_not_run_on_in_one_line(fake_gpu_bench):
    result = CliRunner().invoke(main, ["bench", "--core", str(max(os.sched_getaffinity(0)) + 1)])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "not a CPU core this process may run on")
    assert "setting" not in fake_gpu_bench



def test_the_command_alone_prints_its_help():
    proc = numba_pool_cli()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("Usage: numba-pool") and "replay" in proc.stdout


@pytest.mark.parametrize("argument, culprit", [
    (["--iterations", "-1"], "argument --iterations: '-1': must be at least 1"),
    (["--keep", "-5"], "argument --keep: '-5': must be at least 0"),
    (["--iterations", "two"], "argument --iterations: 'two' is not a whole number"),
])
def test_kernel_scripts_refuse_bad_counts_in_one_line(argument, culprit):
    proc = subprocess.run([sys.executable, "-m", "numba_pool.kernels.sqrt", *argument], cwd=CHECKOUT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f"sqrt.py: error: {culprit}"], proc.stderr
