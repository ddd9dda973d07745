"""Allocation log writing and offline replay: formats, errors, the command line, shipped logs."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from helpers import DATA, PACKAGE_PARENT
from numba_pool.observe import alloclog
from numba_pool.observe.alloclog import AllocationLog
from numba_pool_tools.replay import LogError, Operation, ParsedLog, parse_log, read_log, replay

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"


def replay_cli(*args):
    return subprocess.run([sys.executable, "-m", "numba_pool_tools", "replay", *args], cwd=PACKAGE_PARENT,
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
    log.allocate(0x7F0000000000, 4096, 1, "managed")  # managed memory at an address device memory had
    log.free(0x7F0000000000, 4096, 1, "managed")
    log.flush()
    text = open(path).read().splitlines()
    assert text[0] == "Thread,Time,Action,Pointer,Size,Stream,Kind"
    assert text[3].split(",")[2:] == ["allocate failure", "0x0", str(1 << 40), "0x1", "device"]
    assert text[6].split(",")[2:] == ["allocate", "0x7f0000000000", "4096", "0x1", "managed"]
    parsed = parse_log(open(path))
    assert [(op.action, op.pointer, op.size, op.stream) for op in parsed.operations] == [
        ("allocate", 0x7F0000000000, 1000, 1), ("allocate", 0x7F0000000400, 20, 0x55),
        ("free", 0x7F0000000000, 1000, 1), ("free", 0x7F0000000400, 20, 0x55)]
    assert parsed.failures == 1 and parsed.managed == 2  # managed rows: read and counted, not replayed


def test_a_log_of_managed_memory_only_has_nothing_to_replay(tmp_path):
    path = tmp_path / "managed.csv"
    path.write_text("Thread,Time,Action,Pointer,Size,Stream,Kind\n1,t,allocate,0x1000,64,0x1,managed\n"
                    "1,t,free,0x1000,64,0x1,managed\n")
    with pytest.raises(LogError, match="nothing to replay: of its lines, 2 managed memory lines"):
        replay(str(path))


def test_an_unknown_kind_is_named(tmp_path):
    path = tmp_path / "kind.csv"
    path.write_text("Thread,Time,Action,Pointer,Size,Stream,Kind\n1,t,allocate,0x1000,64,0x1,pinned\n")
    with pytest.raises(LogError, match="line 2: .*kind 'pinned' is not one of device, managed"):
        parse_log(open(path))


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
    path = write(tmp_path, "1,t,free,0x99,5,0x1\n1,t,allocate,0x10,5,0x1\n1,t,free,0x10,5,0x1\n")
    proc = replay_cli(path)
    assert proc.returncode == 2 and "line 2" in proc.stderr and "Traceback" not in proc.stderr
    proc = replay_cli(path, "--skip-bad-lines")
    assert proc.returncode == 0 and "skipped: free of a pointer never allocated  1" in proc.stdout


def test_cli_bad_options_exit_2(tmp_path):
    path = write(tmp_path, "")
    assert replay_cli(path, "--slab-size", "big").returncode == 2
    proc = replay_cli(path, "--max-block", "8 MiB", "--slab-size", "4 MiB")
    assert proc.returncode == 2 and "--max-block=8388608 bytes (8 MiB) is above --slab-size" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the Python API: read_log, replay, plot --------------------------------------------------

def generated_log(path, operations: int, streams=(0, 0x55AA10)) -> str:
    """A log of ``operations`` lines, RMM-like: pointers reused, a few sizes and streams."""
    import random

    rng = random.Random(1)
    sizes = [16, 1000, 40_000, 300_000]
    live, free, next_address, rows = [], {}, 0x7F0000000000, [HEADER]
    for i in range(operations):
        if live and (len(live) > 200 or rng.random() < 0.5):
            pointer, size, stream = live.pop(rng.randrange(len(live)))
            free.setdefault(size, []).append(pointer)
            rows.append(f"140573312345856,08:49:46.{i:06d},free,{pointer:#x},{size},{stream:#x}\n")
        else:
            size, stream = rng.choice(sizes), rng.choice(streams)
            pointer = free.get(size, []).pop() if free.get(size) else next_address
            next_address += -(-size // 512) * 512
            live.append((pointer, size, stream))
            rows.append(f"140573312345856,08:49:46.{i:06d},allocate,{pointer:#x},{size},{stream:#x}\n")
    with open(path, "w") as f:
        f.writelines(rows)
    return str(path)


def test_read_log_is_parse_log_and_reads_gzip_and_byte_order_marks(tmp_path):
    import gzip

    path = generated_log(tmp_path / "g.csv", 3000)
    text = parse_log(open(path), source=path)
    data = open(path, "rb").read()
    (tmp_path / "g.csv.gz").write_bytes(gzip.compress(data))
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + data)
    for other in (read_log(path), read_log(tmp_path / "g.csv.gz"), read_log(tmp_path / "bom.csv"),
                  parse_log(open(tmp_path / "bom.csv", encoding="utf-8-sig")), parse_log(open(path, "rb"))):
        assert list(other.operations) == list(text.operations)
        assert (other.allocations, other.failures, other.lines) == (text.allocations, 0, 3001)
    assert text.operations[5] == list(text.operations)[5] and text.operations[2:4] == list(text.operations)[2:4]


def test_read_log_reports_progress_in_bytes_up_to_the_file_size(tmp_path):
    path = generated_log(tmp_path / "g.csv", 70_000)
    seen = []
    log = read_log(path, progress=seen.append)
    assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] == os.path.getsize(path) == log.bytes_read
    done = []
    report = replay(log, progress=done.append)
    assert done[-1] == report.operations == 70_000 and done == sorted(done)
    assert report.read_seconds == log.seconds > 0
    assert report.end_to_end_ops_per_second < report.ops_per_second


def test_parsed_log_takes_less_memory_than_its_file(tmp_path):
    """Compact columns, not an object per line (which took 4x the file: 245 MiB for 62 MiB)."""
    import tracemalloc

    path = generated_log(tmp_path / "g.csv", 40_000)
    tracemalloc.start()
    try:
        log = read_log(path)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = os.path.getsize(path)
    assert log.operations.nbytes == 33 * 40_000
    assert held < size and peak < 1.5 * size, (held, peak, size)


def test_replay_takes_a_path_and_checks_options_by_name(tmp_path):
    path = write(tmp_path, "1,t,allocate,0x20,8,0x1\n1,t,free,0x20,8,0x1\n")
    report = replay(path, release_threshold=None)
    assert report.operations == 2 and report.source == path and report.slab_size == 4 << 20
    with pytest.raises(ValueError, match=r"max_block=8388608 bytes \(8 MiB\) is above slab_size"):
        replay(path, max_block=8 << 20)
    with pytest.raises(ValueError, match="slab_size=1000 bytes is not a positive multiple of 256"):
        replay(path, slab_size=1000)


def test_parsed_log_from_a_list_of_operations():
    log = ParsedLog([Operation(2, "allocate", 0x20, 8, 1), Operation(3, "free", 0x20, 8, 1)])
    assert log.allocations == 1 and replay(log).peak_requested == 256


@pytest.mark.parametrize("line, reason", [
    ("1,t,allocate,0x10," + "9" * 200_000 + ",0x1", "size '99999"),
    ('1,t,"allocate",0x10,"' + "9" * 200_000 + '",0x1', "not a CSV row (field larger than field limit"),
    ("1,t,allocate,0x1" + "0" * 16 + ",8,0x1", "pointer '0x10000000000000000' does not fit in 64 bits"),
])
def test_long_or_huge_fields_are_named_and_cut(tmp_path, line, reason):
    path = write(tmp_path, line + "\n")
    with pytest.raises(LogError) as err:
        read_log(path)
    message = str(err.value)
    assert message.startswith(f"{path}: line 2: ") and reason in message and len(message) < 600


def test_binary_file_is_named(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(LogError, match=f"^{path}: line 1: not a text file \\(byte 0x89 at offset 0"):
        read_log(path)


def test_plot_leaves_the_backend_and_pyplot_alone(tmp_path):
    pytest.importorskip("matplotlib")
    path = write(tmp_path, "1,t,allocate,0x20,8,0x1\n1,t,free,0x20,8,0x1\n", name="my-log.csv")
    code = f"""
import sys, matplotlib
matplotlib.use("svg")
from numba_pool_tools.replay import replay
from numba_pool_tools.replay.figure import figure, plot
report = replay({path!r})
written = plot(report, {str(tmp_path / "p")!r})
title = figure(report).axes[0].get_title()
print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules, written, title.splitlines()[0])
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE_PARENT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    backend, pyplot, written, *title = proc.stdout.split()
    assert (backend, pyplot, written) == ("svg", "False", str(tmp_path / "p.png"))
    assert " ".join(title) == "my-log.csv: peak reserved / peak requested = 256.000"
    assert os.path.getsize(written) > 1000


def test_plot_in_human_units(tmp_path):
    pytest.importorskip("matplotlib")
    from numba_pool_tools.replay.figure import figure

    path = write(tmp_path, "1,t,allocate,0x20,3000000,0x1\n1,t,free,0x20,3000000,0x1\n")
    axes = figure(replay(path)).axes[0]
    assert axes.get_ylabel() == "MiB" and "peak 2.86 MiB" in axes.get_legend_handles_labels()[1][1]


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


@pytest.mark.parametrize("call, culprit", [
    (lambda: parse_log([123]), "line 1 of log is a int (123), not str or bytes"),
    (lambda: parse_log("Time,Action,Pointer,Size,Stream\n"), "parse_log takes the log's lines, not one str"),
    (lambda: parse_log(b"Time,Action\n"), "parse_log takes the log's lines, not one bytes"),
    (lambda: parse_log(["Time,Action,Pointer,Size,Stream\n"], skip_bad_lines="no"),
     "skip_bad_lines must be True or False, not 'no'"),
    (lambda: read_log(DATA + "/sqrt-sizes.csv", skip_bad_lines="no"), "skip_bad_lines must be True or False, not 'no'"),
], ids=["not-a-line", "one-string", "one-bytes", "parse-skip-no", "read-skip-no"])
def test_bad_arguments_of_the_log_readers_name_the_culprit(call, culprit):
    with pytest.raises(TypeError) as caught:
        call()
    assert culprit in str(caught.value) and "\n" not in str(caught.value)
