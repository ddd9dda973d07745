"""The tools' command line, ``numba-pool-tools`` (``replay``, ``bench``): one line on standard
error naming the culprit, exit status 2, no traceback, for bad configuration, bad options, bad
input files and machines without a GPU.

:data:`BAD` is the table CI runs: command line and input file -> the text the error line must
hold.  Every row runs in process (Click's runner: fast); the rows marked ``subprocess`` run again
as a real ``python -m numba_pool_tools``, so that "no traceback" is checked on a real standard
error.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from helpers import GPU, PACKAGE_PARENT, check_one_line_error
from numba_pool_tools.cli import main

TYPO = "NUMBA_POOL_" + "ARNEA"  # NUMBA_POOL_ARENA mistyped, split so the scan of known names skips it

HEADER = b"Thread,Time,Action,Pointer,Size,Stream\n"
GOOD = HEADER + b"1,t,allocate,0x20,8,0x1\n1,t,free,0x20,8,0x1\n"


def numba_pool_cli(*args, env=None, cwd=PACKAGE_PARENT, prelude=None):
    """``python -m numba_pool_tools ARGS``; with ``prelude``, Python code run first in the same process."""
    full_env = {**os.environ, **(env or {})}
    command = [sys.executable, "-m", "numba_pool_tools", *args]
    if prelude:
        command = [sys.executable, "-c", f"{prelude}\nimport sys, runpy\nsys.argv = ['numba-pool-tools', *sys.argv[1:]]\n"
                                         "runpy.run_module('numba_pool_tools', run_name='__main__')", *args]
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


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path):
    log = tmp_path / "trace.csv"
    log.write_bytes(GOOD)
    proc = numba_pool_cli("replay", str(log), "--plot", str(tmp_path / "x.png"),
                          prelude="import sys; sys.modules['matplotlib'] = None")
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, "pip install -e './tools[plot]'")
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_in_process(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    log = tmp_path / "trace.csv"
    log.write_bytes(GOOD)
    result = CliRunner().invoke(main, ["replay", str(log), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "pip install -e './tools[plot]'")


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



def test_bad_configuration_is_one_clear_line_and_exit_2():
    proc = numba_pool_cli("bench", env={"NUMBA_POOL_INITIAL_SIZE": "a lot"})
    assert proc.returncode == 2
    assert "NUMBA_POOL_INITIAL_SIZE='a lot' is not a size" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
def test_without_gpu_one_line_and_exit_3():
    proc = numba_pool_cli("bench")
    assert proc.returncode == 3  # 2 is a bad configuration: a script can tell them apart
    assert "no CUDA GPU is available" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_unknown_command_is_one_line():
    result = CliRunner().invoke(main, ["replai"])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "No such command 'replai'")


def test_help_lists_the_commands():
    proc = numba_pool_cli("--help")
    assert proc.returncode == 0
    for command in ("bench", "replay", "snapshot"):
        assert command in proc.stdout


def test_bench_help_offers_the_host_rows_switch():
    result = CliRunner().invoke(main, ["bench", "--help"])
    text = " ".join(result.stdout.split())
    assert result.exit_code == 0 and "--host-rows / --no-host-rows" in text and "NUMBA_POOL_HOST=1" in text
    assert "seed" not in text.lower()


# -- bench on a GPU, faked: what it hands on ---------------------------------------------------------

@pytest.fixture
def fake_gpu_bench(monkeypatch):
    """``numba-pool-tools bench`` on a fake GPU, its parts replaced: yields what ``report.run`` was given
    and lets a test set what it returns or raises."""
    from numba import cuda

    from numba_pool_tools.bench import report
    from numba_pool_tools.cli import bench

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
    (tmp_path / "numba_pool").mkdir()
    (tmp_path / "numba_pool" / "__init__.py").write_text("")  # a baseline: another numba_pool
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
    from numba_pool_tools.bench.checks import Flag

    fake_gpu_bench["returns"] = ({}, [Flag("end to end", "256", "numba_pool", "rounds disagree")])
    result = CliRunner().invoke(main, ["bench"])
    assert result.exit_code == 1 and result.stdout.strip().splitlines()[-1].startswith("SELF-CHECKS: 1 FAILED")


def test_a_bench_part_that_cannot_go_on_is_one_line_and_exit_2(fake_gpu_bench):
    from numba_pool_tools.bench.report import BenchError

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
    assert proc.stdout.startswith("Usage: numba-pool-tools") and "replay" in proc.stdout


# -- bench: what the user gave, checked before the GPU (issue 36) -----------------------------------

@pytest.mark.parametrize("argv, culprit", [
    (["--core", "99999"], "--core 99999: not a CPU core this process may run on"),
    (["--json", "/nonexistent/x.json"], "--json='/nonexistent/x.json' is in folder '/nonexistent', which does not exist"),
    (["--json", "{tmp}/missing/x.json"], "--json='{tmp}/missing/x.json' is in folder '{tmp}/missing', which does not"),
    (["--baseline", "{tmp}"], "--baseline '{tmp}': no numba_pool/__init__.py in it"),
])
def test_bench_arguments_are_checked_before_the_gpu(argv, culprit, tmp_path, monkeypatch):
    """Exit status 2 naming the option, on any machine: the GPU check (3) comes after."""
    from numba_pool.cli.errors import NoGpu
    from numba_pool_tools.cli import bench

    def no_gpu():
        raise NoGpu("no CUDA GPU here (the test's)")

    monkeypatch.setattr(bench, "require_gpu", no_gpu)
    result = CliRunner().invoke(main, ["bench", *(a.format(tmp=tmp_path) for a in argv)])
    assert result.exit_code == 2, result.output
    check_one_line_error(result.stderr, result.stdout, culprit.format(tmp=tmp_path))


# -- warnings: one line naming the command, not a frame of Click's or runpy's (issue 36) --------------

def test_a_variable_typo_is_one_warning_line_naming_the_command():
    """Not ``click/core.py:911: ConfigWarning: ...`` and its source line: the frame Python found was Click's."""
    proc = numba_pool_cli("bench", "--core", "99999", env={TYPO: "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"numba-pool-tools: warning: {TYPO} is not a numba_pool variable and is ignored: did you mean "
        "NUMBA_POOL_ARENA?", "Error: --core 99999: not a CPU core this process may run on (allowed: "
        f"{', '.join(map(str, sorted(os.sched_getaffinity(0))))})"]


def test_the_simulators_import_warning_is_one_line_naming_the_command(tmp_path):
    """numba_pool warns as it is imported, before the command runs: once ``<frozen runpy>:112: SimulatorWarning``."""
    log = tmp_path / "trace.csv"
    log.write_bytes(GOOD)
    proc = numba_pool_cli("replay", str(log), env={"NUMBA_ENABLE_CUDASIM": "1", "NUMBA_CUDA_MEMORY_MANAGER": "numba_pool"})
    assert proc.returncode == 0 and "operations" in proc.stdout, proc.stderr
    assert proc.stderr.splitlines() == [
        "numba-pool-tools: warning: NUMBA_CUDA_MEMORY_MANAGER=numba_pool is ignored: the CUDA simulator is on "
        "(NUMBA_ENABLE_CUDASIM=1): it keeps device arrays in host memory and has no memory manager for numba_pool to "
        "replace"]


def test_the_commands_warning_display_is_restored_after_it():
    import warnings

    before = warnings.showwarning
    CliRunner().invoke(main, ["replay", "--help"])
    assert warnings.showwarning is before
