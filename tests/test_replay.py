"""Allocation log writing and offline replay: formats, errors, the command line, shipped logs."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from conftest import PACKAGE_PARENT
from numba_pool import alloclog
from numba_pool.alloclog import AllocationLog
from numba_pool.replay import LogError, parse_log, replay

DATA = os.path.join(os.path.dirname(__file__), "data")
HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"


def replay_cli(*args):
    return subprocess.run([sys.executable, "-m", "numba_pool", "replay", *args], cwd=PACKAGE_PARENT,
                          capture_output=True, text=True)


def write(tmp_path, body, name="t.csv"):
    path = tmp_path / name
    path.write_text(HEADER + body)
    return str(path)


def test_log_round_trips_through_the_parser(tmp_path, monkeypatch):
    monkeypatch.setattr(alloclog, "FLUSH_EVERY", 3)  # exercise automatic flushes too
    path = str(tmp_path / "log.csv")
    log = AllocationLog(path)
    log.allocate(0x7F0000000000, 1000, 1)
    log.allocate(0x7F0000000400, 20, 0x55)
    log.failure(1 << 40, 1)
    log.free(0x7F0000000000, 1000, 1)
    log.free(0x7F0000000400, 20, 0x55)
    log.flush()
    text = open(path).read().splitlines()
    assert text[0] == "Thread,Time,Action,Pointer,Size,Stream"
    assert text[3].split(",")[2:] == ["allocate failure", "0x0", str(1 << 40), "0x1"]
    parsed = parse_log(open(path))
    assert [(op.action, op.pointer, op.size, op.stream) for op in parsed.operations] == [
        ("allocate", 0x7F0000000000, 1000, 1), ("allocate", 0x7F0000000400, 20, 0x55),
        ("free", 0x7F0000000000, 1000, 1), ("free", 0x7F0000000400, 20, 0x55)]
    assert parsed.failures == 1


def test_rmm_style_pointers_without_0x_and_stream_zero_replay(tmp_path):
    path = write(tmp_path, "140573312345856,08:49:46.416154,allocate,7f8a40000000,1024,0\n"
                           "140573312345856,08:49:46.416200,free,7f8a40000000,1024,0\n")
    parsed = parse_log(open(path))
    assert len(parsed.operations) == 2 and parsed.operations[0].stream == 1  # stream 0 is the legacy stream


@pytest.mark.parametrize("line, reason", [
    ("1,t,allocate,0x10,abc,0x1", "size 'abc' is not a whole number"),
    ("1,t,allocate,0x10,-5,0x1", "size '-5' is negative"),
    ("1,t,allocate,zz,5,0x1", "pointer 'zz' is not hexadecimal"),
    ("1,t,release,0x10,5,0x1", "action 'release' is not one of"),
    ("1,t,allocate,0x10,5", "expected 6 fields"),
    ("1,t,free,0x99,5,0x1", "free of a pointer never allocated"),
])
def test_bad_lines_name_line_number_and_content(tmp_path, line, reason):
    path = write(tmp_path, "1,t,allocate,0x20,8,0x1\n" + line + "\n")
    with pytest.raises(LogError) as err:
        parse_log(open(path), source=path)
    assert f"line 3: {line!r}" in str(err.value) and reason in str(err.value)


def test_double_free_is_named(tmp_path):
    path = write(tmp_path, "1,t,allocate,0x20,8,0x1\n1,t,free,0x20,8,0x1\n1,t,free,0x20,8,0x1\n")
    with pytest.raises(LogError, match=r"line 4: .*double free \(0x20\)"):
        parse_log(open(path))


def test_missing_header_is_an_error(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("1,t,allocate,0x20,8,0x1\n")
    with pytest.raises(LogError, match="line 1: .*expected the header"):
        parse_log(open(path))


def test_skip_bad_lines_counts_by_reason(tmp_path):
    path = write(tmp_path, "1,t,allocate,0x20,8,0x1\n1,t,free,0x30,8,0x1\nnonsense\n1,t,free,0x20,8,0x1\n")
    parsed = parse_log(open(path), skip_bad_lines=True)
    assert len(parsed.operations) == 2
    assert parsed.skipped == {"free of a pointer never allocated": 1, "unparsable": 1}


def test_replay_measures_peaks_and_fragmentation(tmp_path):
    body = "".join(f"1,t,allocate,{0x1000 * (i + 1):#x},1000,0x1\n" for i in range(64))
    body += "".join(f"1,t,free,{0x1000 * (i + 1):#x},1000,0x1\n" for i in range(0, 64, 2))
    body += "1,t,allocate,0x999000,5000000,0x1\n"  # above the largest block: the mempool's
    report = replay(parse_log(open(write(tmp_path, body))), slab_size=1 << 20, max_block=256 << 10)
    assert report.operations == 97 and report.allocations == 65
    assert report.peak_requested == 32 * 1024 + 5000192  # 1000 -> 1024; 5000000 -> 5000192
    assert report.peak_reserved >= report.peak_requested and report.max_slabs == 1
    assert report.fragmentation == report.peak_reserved / report.peak_requested


def test_cli_replay_prints_report_and_plot(tmp_path):
    path = write(tmp_path, "1,t,allocate,0x20,8,0x1\n1,t,free,0x20,8,0x1\n")
    png = tmp_path / "plot.png"
    proc = replay_cli(path, "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "peak reserved / peak requested" in proc.stdout and png.stat().st_size > 1000


def test_cli_bad_line_is_one_error_and_exit_2(tmp_path):
    path = write(tmp_path, "1,t,free,0x99,5,0x1\n")
    proc = replay_cli(path)
    assert proc.returncode == 2 and "line 2" in proc.stderr and "Traceback" not in proc.stderr
    proc = replay_cli(path, "--skip-bad-lines")
    assert proc.returncode == 0 and "skipped: free of a pointer never allocated  1" in proc.stdout


def test_cli_bad_options_exit_2(tmp_path):
    path = write(tmp_path, "")
    assert replay_cli(path, "--slab-size", "big").returncode == 2
    proc = replay_cli(path, "--max-block", "8 MiB", "--slab-size", "4 MiB")
    assert proc.returncode == 2 and "largest block (8388608)" in proc.stderr and "Traceback" not in proc.stderr


SHIPPED = sorted(glob.glob(os.path.join(DATA, "*.csv")))


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_shipped_gpu_logs_replay_within_ten_percent(path):
    from numba_pool.config import DEFAULT_ARENA_MAX_BLOCK, DEFAULT_ARENA_SLAB_SIZE

    report = replay(parse_log(open(path), source=path), slab_size=DEFAULT_ARENA_SLAB_SIZE,
                    max_block=DEFAULT_ARENA_MAX_BLOCK)
    assert report.operations > 100 and not report.skipped
    assert report.fragmentation <= 1.10, f"{path}: {report.fragmentation:.3f}"


def test_logs_are_shipped():
    assert len(SHIPPED) >= 2
