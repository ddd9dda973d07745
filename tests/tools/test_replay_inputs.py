"""What ``numba-pool-tools replay`` and the Python replay API make of inputs a newcomer gives: log
fields in other number syntaxes, a quote left open, logs with nothing to replay, plot paths that
are empty, devices, only an extension or in ``/proc``, logs read from a pipe."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from helpers import PACKAGE_PARENT, check_one_line_error
from numba_pool_tools import replay as offline_replay
from numba_pool_tools.cli import main
from numba_pool_tools.replay import figure

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"
GOOD = HEADER + "1,t,allocate,0x20,256,0x1\n1,t,free,0x20,256,0x1\n"


def cli(*args):
    result = CliRunner().invoke(main, ["replay", *args])
    return result.exit_code, result.output


def one_error(*args, culprit: str = "") -> str:
    """The CLI's single error line for ``args`` (exit status 2)."""
    result = CliRunner().invoke(main, ["replay", *args])
    assert result.exit_code == 2, result.output
    return check_one_line_error(result.stderr, result.stdout, culprit)


def log_file(tmp_path, body: str, name: str = "log.csv") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


# -- a line's fields: exactly the format's syntax ----------------------------------------------

@pytest.mark.parametrize("line, problem", [
    ("1,t,allocate,0x20,1_000,0x1", "size '1_000' is not a whole number of bytes in decimal digits"),
    ("1,t,allocate,0x20,+100,0x1", "size '+100' is not a whole number of bytes in decimal digits"),
    ("1,t,allocate,0x20,100.0,0x1", "size '100.0' is not a whole number of bytes in decimal digits"),
    ("1,t,allocate,0x10_00,100,0x1", "pointer '0x10_00' is not hexadecimal"),
    ("1,t,allocate,+0x1000,100,0x1", "pointer '+0x1000' is not hexadecimal"),
    ("1,t,allocate,0x20,100,0x_1", "stream '0x_1' is not hexadecimal"),
    ('1,"t,allocate,0x20,100,0x1', "not a CSV row (unexpected end of data)"),
    ('1,t,"allocate,0x20,100,0x1', "not a CSV row (unexpected end of data)"),
])
def test_fields_outside_the_format_are_named_with_their_line(line, problem, tmp_path):
    with pytest.raises(offline_replay.LogError) as err:
        offline_replay.parse_log([HEADER, line])
    assert str(err.value).startswith("log: line 2: ") and problem in str(err.value)
    assert problem in one_error(log_file(tmp_path, HEADER + line + "\n"))


def test_the_formats_own_spellings_still_parse():
    log = offline_replay.parse_log([HEADER, "1,t,allocate,20,256,1", '1,t,"free",0X20,256,0x1',
                                    "1,t,allocate, 0x40 , 512 ,0x0"])
    assert [(op.action, op.pointer, op.size) for op in log.operations] == [
        ("allocate", 0x20, 256), ("free", 0x20, 256), ("allocate", 0x40, 512)]


# -- a log with nothing to replay -----------------------------------------------------------

def test_a_header_only_log_is_refused_not_reported_as_perfect(tmp_path):
    path = log_file(tmp_path, HEADER)
    assert one_error(path) == f"Error: {path}: nothing to replay: the header is its only line"
    with pytest.raises(offline_replay.LogError, match="nothing to replay: the header is its only line"):
        offline_replay.replay(path)


def test_a_log_whose_lines_were_all_skipped_says_why(tmp_path):
    path = log_file(tmp_path, HEADER + "1,t,free,0x99,5,0x1\n1,t,oops\n1,t,allocate failure,0x0,5,0x1\n")
    message = one_error(path, "--skip-bad-lines")
    assert message.endswith("nothing to replay: of its lines, 1 skipped (free of a pointer never allocated), "
                            "1 skipped (unparsable), 1 allocate failure line")


# -- plot paths -------------------------------------------------------------------------------

@pytest.mark.parametrize("plot, problem", [
    ("", "--plot '': expected a file name ending in .png, .svg, .pdf"),
    (".png", "--plot '.png' has no name before its extension"),
    ("/dev/null", "--plot '/dev/null' is not a regular file"),
    ("/proc/x.png", "--plot '/proc/x.png': cannot write it (No such file or directory)"),
])
def test_bad_plot_paths_fail_before_the_replay(plot, problem, tmp_path, monkeypatch):
    def no_replay(*args, **kwargs):
        raise AssertionError("the replay ran before the plot path was checked")

    monkeypatch.setattr(offline_replay, "read_log", no_replay)
    assert problem in one_error(log_file(tmp_path, GOOD), "--plot", plot)
    assert not os.path.exists("/dev/null.png") and not os.path.exists(".png.png")


def test_plot_returns_the_file_it_wrote(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    report = offline_replay.replay(log_file(tmp_path, GOOD))
    assert offline_replay.plot(report, "out") == "out.png"
    assert sorted(os.listdir(tmp_path)) == ["log.csv", "out.png"]
    with pytest.raises(figure.PlotError, match="expected a file name"):
        offline_replay.plot(report, "")
    assert sorted(os.listdir(tmp_path)) == ["log.csv", "out.png"]


def test_the_early_check_leaves_no_file_behind(tmp_path):
    target = tmp_path / "new.png"
    assert figure.plot_path(str(target)) == str(target)
    assert not target.exists()


# -- logs from a pipe --------------------------------------------------------------------------

def test_a_fifo_log_is_read(tmp_path):
    fifo = str(tmp_path / "log.fifo")
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: open(fifo, "w").write(GOOD))
    writer.start()
    status, output = cli(fifo)
    writer.join()
    assert status == 0 and "peak reserved / peak requested" in output, output


def test_standard_input_is_read_as_a_log():
    proc = subprocess.run([sys.executable, "-m", "numba_pool_tools", "replay", "/dev/stdin"], input=GOOD, text=True,
                          capture_output=True, cwd=PACKAGE_PARENT, timeout=120)
    assert proc.returncode == 0 and "operations" in proc.stdout and "Illegal seek" not in proc.stderr, proc.stderr


# -- option suggestions ----------------------------------------------------------------------

@pytest.mark.parametrize("value, suggestion", [(-1, "expected e.g. 256"), (-300, "expected e.g. 256"),
                                               (100, "expected e.g. 256"), (300, "expected e.g. 256 or 512")])
def test_a_bad_slab_size_gets_a_positive_suggestion(value, suggestion):
    with pytest.raises(ValueError) as err:
        offline_replay.check_options(value, 256)
    assert str(err.value).endswith(suggestion)


# -- the Python API given something that is no log (issue 36) ---------------------------------

@pytest.mark.parametrize("call, argument, culprit", [
    ("read_log", 123, "read_log: path=123 (int) is not a file path"),  # not file descriptor 123
    ("read_log", None, "read_log: path=None (NoneType) is not a file path"),
    ("replay", None, "replay: log=None (NoneType) is not a file path: expected a ParsedLog (read_log's) or a file path"),
    ("replay", 3.5, "replay: log=3.5 (float) is not a file path"),
    ("parse_log", None, "parse_log: lines=None (NoneType) is not an iterable of lines"),
    ("parse_log", 123, "parse_log: lines=123 (int) is not an iterable of lines"),
])
def test_the_api_names_an_argument_that_is_no_log(call, argument, culprit):
    with pytest.raises(TypeError) as err:
        getattr(offline_replay, call)(argument)
    message = str(err.value)
    assert message.startswith(culprit) and "\n" not in message, message


# -- a free whose size is not its allocation's ------------------------------------------------

MISSIZED = HEADER + "1,t,allocate,0x20,256,0x1\n1,t,free,0x20,512,0x1\n"


def test_a_free_of_another_size_is_a_bad_line_naming_both_sizes(tmp_path):
    problem = "line 3: '1,t,free,0x20,512,0x1': free of 0x20 with size 512, but it was allocated with size 256"
    with pytest.raises(offline_replay.LogError) as err:
        offline_replay.parse_log(MISSIZED.splitlines())
    assert str(err.value) == f"log: {problem}"
    assert one_error(log_file(tmp_path, MISSIZED)).endswith(problem)


def test_a_free_of_another_size_is_skipped_and_counted_with_skip_bad_lines(tmp_path):
    log = offline_replay.parse_log((MISSIZED + "1,t,allocate,0x40,256,0x1\n").splitlines(), skip_bad_lines=True)
    assert log.skipped == {"free size differs from its allocation's": 1} and len(log.operations) == 2
    status, output = cli(log_file(tmp_path, MISSIZED + "1,t,allocate,0x40,256,0x1\n"), "--skip-bad-lines")
    assert status == 0 and "skipped: free size differs from its allocation's  1" in output, output
