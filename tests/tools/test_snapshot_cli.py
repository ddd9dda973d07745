"""``numba-pool-tools snapshot summarize`` and ``plot`` on real snapshots of numba_pool running on the
CUDA model (this file's lines are the allocation sites), with no GPU: the tables and their
totals, the figure and the bytes it stacks, and one-line errors for files that are no snapshot."""

from __future__ import annotations

import gc
import pickle
import re
import subprocess
import sys
from collections import OrderedDict

import pytest
from click.testing import CliRunner

import numba_pool
from cuda_model.harness import Program
from helpers import PACKAGE_PARENT, check_one_line_error
from numba_pool_tools.cli import main
from numba_pool_tools.snapshot.timeline import OTHER, timelines
from numba_pool.observe.snapshot import dump
from numba_pool.plugin.debugging import snapshot_of

PNG = b"\x89PNG\r\n\x1a\n"


def allocate_kept(prog: Program, size: int):
    return prog.mm.memalloc(size)  # site: three arena blocks, alive in the snapshot


def allocate_large(prog: Program, size: int):
    return prog.mm.memalloc(size)  # site: one mempool allocation, alive in the snapshot


def allocate_dropped(prog: Program, size: int):
    return prog.mm.memalloc(size)  # site: allocated and freed five times before the snapshot


KEPT, LARGE, DROPPED = (f"{__file__}:{f.__code__.co_firstlineno + 1}"
                        for f in (allocate_kept, allocate_large, allocate_dropped))
#: The bytes each kept site holds in the snapshot (managed and pinned sites: lines of make_dump).
HELD = {KEPT: 3 * 1000, LARGE: 200_000}
MANAGED, PINNED = 5000, 3000


def make_dump(path, history: bool = True) -> dict:
    """A snapshot of a manager on the model (arena and host cache on), written to ``path``."""
    if history:
        numba_pool.record_history()
    p = Program(arena=True, host=True)
    try:
        kept = [allocate_kept(p, 1000) for _ in range(3)]
        large = allocate_large(p, 200_000)
        for _ in range(5):
            dropped = allocate_dropped(p, 3000)
            del dropped
        gc.collect()
        managed = p.mm.memallocmanaged(MANAGED, True)
        pinned = p.mm.memhostalloc(PINNED)
        snapshot = snapshot_of([p.mm])
        dump(snapshot, path)
        del kept, large, managed, pinned
    finally:
        p.close()
        numba_pool.record_history(False)
    return snapshot


@pytest.fixture(scope="module")
def dumped(tmp_path_factory) -> tuple[str, dict]:
    path = str(tmp_path_factory.mktemp("snapshot") / "snapshot.pickle")
    return path, make_dump(path)


def numba_pool_cli(*args, prelude: str = ""):
    """``numba-pool-tools ARGS`` in a fresh interpreter, after the Python code ``prelude``."""
    code = (f"{prelude}\nimport sys, runpy\nsys.argv = ['numba-pool-tools', *sys.argv[1:]]\n"
            "runpy.run_module('numba_pool_tools', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=PACKAGE_PARENT, capture_output=True, text=True,
                          timeout=300)


def invoke(*args):
    result = CliRunner().invoke(main, ["snapshot", *args])
    assert isinstance(result.exception, (SystemExit, type(None))), repr(result.exception)  # nothing escapes
    return result


def nbytes(cell: str) -> int:
    """The exact bytes in a table cell: ``2.93 KiB (3000 bytes)`` or ``512 bytes``."""
    found = re.search(r"\((\d+) bytes\)", cell) or re.match(r"\s*(\d+) bytes", cell)
    assert found, cell
    return int(found[1])


def sections(stdout: str) -> dict[str, list[str]]:
    """The output's tables by title, each as its lines (header first)."""
    blocks = [block.splitlines() for block in stdout.strip().split("\n\n")]
    return {block[0]: block[1:] for block in blocks}


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def active(snapshot: dict, device: int | None = None) -> list[dict]:
    return [b for s in snapshot["segments"] if device is None or s["device"] == device
            for b in s["blocks"] if b["state"] == "active_allocated"]


# -- summarize -----------------------------------------------------------------------------------

def test_summarize_names_this_files_lines_and_the_totals_add_up(dumped):
    path, snapshot = dumped
    result = invoke("summarize", path)
    assert result.exit_code == 0, result.output
    tables = sections(result.stdout)
    assert set(tables) == {"top allocation sites by bytes held", "segments per kind", "reserved against allocated"}

    header, *site_rows = tables["top allocation sites by bytes held"]
    assert cells(header) == ["site", "bytes", "blocks"]
    sites = {cells(row)[0]: (nbytes(cells(row)[1]), int(cells(row)[2])) for row in site_rows}
    assert sites[KEPT] == (3000, 3) and sites[LARGE] == (200_000, 1)
    assert DROPPED not in sites  # freed before the snapshot
    own = {site for site in sites if site.startswith(f"{__file__}:")}
    assert own == set(sites) and len(sites) == 4  # the managed and pinned allocations: make_dump's lines
    assert sorted(b for b, _ in sites.values()) == sorted([3000, 200_000, MANAGED, PINNED])
    assert [b for b, _ in sites.values()] == sorted((b for b, _ in sites.values()), reverse=True)  # most first

    header, *kind_rows = tables["segments per kind"]
    assert cells(header) == ["kind", "segments", "reserved", "allocated"]
    kinds = {cells(r)[0]: (int(cells(r)[1]), nbytes(cells(r)[2]), nbytes(cells(r)[3])) for r in kind_rows}
    expected = {}
    for segment in snapshot["segments"]:
        segs, reserved, allocated = expected.get(segment["kind"], (0, 0, 0))
        expected[segment["kind"]] = (segs + 1, reserved + segment["total_size"],
                                     allocated + sum(b["requested_size"] for b in segment["blocks"]
                                                     if b["state"] == "active_allocated"))
    assert kinds == expected and {"arena slab", "mempool", "managed", "pinned"} <= set(kinds)
    assert kinds["mempool"][2] == 200_000 and kinds["managed"][2] == MANAGED and kinds["pinned"][2] == PINNED

    totals = {cells(r)[0]: nbytes(cells(r)[1]) for r in tables["reserved against allocated"]}
    reserved = totals.pop("reserved (segments)")
    assert reserved == sum(s["total_size"] for s in snapshot["segments"])  # reserved: the segments
    allocated = totals["allocated (requested)"]
    assert allocated == sum(b["requested_size"] for b in active(snapshot)) == sum(HELD.values()) + MANAGED + PINNED
    assert totals["free inside allocations (block size - requested)"] == sum(b["size"] - b["requested_size"]
                                                                             for b in active(snapshot)) > 0
    assert sum(totals.values()) == reserved  # allocated, free inside allocations, awaiting free, free
    assert sum(kinds[k][1] for k in kinds) == reserved and sum(kinds[k][2] for k in kinds) == allocated


def test_summarize_top_sums_the_other_sites_in_one_row(dumped):
    path, snapshot = dumped
    result = invoke("summarize", path, "--top", "1")
    assert result.exit_code == 0, result.output
    _, first, rest = sections(result.stdout)["top allocation sites by bytes held"]
    assert cells(first)[0] == LARGE and nbytes(cells(first)[1]) == 200_000
    assert cells(rest)[0] == "3 other sites" and cells(rest)[2] == "5"  # 3 kept, the managed and the pinned one
    assert nbytes(cells(rest)[1]) == sum(b["requested_size"] for b in active(snapshot)) - 200_000


def test_summarize_splits_by_device_when_there_are_several(dumped, tmp_path):
    _, snapshot = dumped
    two = dict(snapshot, segments=snapshot["segments"] + [dict(s, device=1) for s in snapshot["segments"]
                                                          if s["kind"] == "arena slab"])
    path = tmp_path / "two.pickle"
    dump(two, path)
    result = invoke("summarize", str(path))
    assert result.exit_code == 0, result.output
    header, *rows = sections(result.stdout)["reserved against allocated"]
    assert cells(header) == ["device 0", "device 1", "all devices"]
    row = {cells(r)[0]: [nbytes(c) for c in cells(r)[1:]] for r in rows}
    slabs = sum(s["total_size"] for s in snapshot["segments"] if s["kind"] == "arena slab")
    on_0 = sum(s["total_size"] for s in snapshot["segments"])
    assert row["reserved (segments)"] == [on_0, slabs, on_0 + slabs]
    assert row["allocated (requested)"] == [sum(b["requested_size"] for b in active(two, d)) for d in (0, 1)] + [
        sum(b["requested_size"] for b in active(two))]
    for column in range(3):
        assert sum(values[column] for name, values in row.items() if name != "reserved (segments)") == \
            row["reserved (segments)"][column]


def test_summarize_without_history_has_no_sites_but_the_same_totals(tmp_path):
    path = tmp_path / "bare.pickle"
    snapshot = make_dump(path, history=False)
    result = invoke("summarize", str(path))
    assert result.exit_code == 0, result.output
    tables = sections(result.stdout)
    (site_row,) = tables["top allocation sites by bytes held"][1:]
    assert cells(site_row)[0] == "<no stack>" and int(cells(site_row)[2]) == len(active(snapshot))
    assert snapshot["device_traces"] == [[]]


# -- plot ----------------------------------------------------------------------------------------

def test_plot_writes_a_png_of_the_history(dumped, tmp_path):
    pytest.importorskip("matplotlib")
    path, _ = dumped
    out = tmp_path / "held.png"
    result = invoke("plot", path, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"plot written to {out}"
    data = out.read_bytes()
    assert data[:8] == PNG and len(data) > 10_000


def test_plot_adds_png_and_writes_svg(dumped, tmp_path):
    pytest.importorskip("matplotlib")
    path, _ = dumped
    assert invoke("plot", path, "-o", str(tmp_path / "held")).exit_code == 0
    assert (tmp_path / "held.png").read_bytes()[:8] == PNG and not (tmp_path / "held").exists()
    assert invoke("plot", path, "-o", str(tmp_path / "held.svg"), "--top", "1").exit_code == 0
    assert b"<svg" in (tmp_path / "held.svg").read_bytes()[:1000]


def test_plot_draws_one_panel_per_device_with_events(dumped, tmp_path):
    pytest.importorskip("matplotlib")
    _, snapshot = dumped
    later = [dict(e, time_us=e["time_us"] + 500_000) for e in snapshot["device_traces"][0][:6]]
    traces = [snapshot["device_traces"][0], [], later]
    lines = timelines(traces, top=2)
    assert [line.device for line in lines] == [0, 2]  # device 1 has no events: no panel
    assert lines[1].times == pytest.approx([t + 0.5 for t in lines[0].times[:6]], abs=1e-6)  # one clock for all
    path = tmp_path / "three.pickle"
    dump(dict(snapshot, device_traces=traces), path)
    result = invoke("plot", str(path), "-o", str(tmp_path / "three.png"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "three.png").read_bytes()[:8] == PNG


def test_the_plotted_bytes_follow_the_allocations_and_frees(dumped):
    _, snapshot = dumped
    (line,) = timelines(snapshot["device_traces"], top=10)
    column = {site: k for k, site in enumerate(line.sites)}
    assert {KEPT, LARGE, DROPPED} < set(column) and len(column) == 5  # and the managed and pinned lines
    assert all(site.startswith(f"{__file__}:") for site in column)
    dropped = [row[column[DROPPED]] for row in line.held]
    assert max(dropped) == 3000 and dropped[-1] == 0 and line.peaks[column[DROPPED]] == 3000
    assert line.held[-1][column[KEPT]] == 3000 and line.held[-1][column[LARGE]] == 200_000
    assert sum(line.held[-1]) == sum(b["requested_size"] for b in active(snapshot))  # what is alive at the end
    assert line.allocations == 3 + 1 + 5 + 2 and line.times[0] == 0 and line.times == sorted(line.times)


def test_a_free_requested_holds_until_completed_and_the_rest_is_other():
    def event(action, addr, size, t, line):
        return {"action": action, "addr": addr, "size": size, "time_us": t, "frames": [{"filename": "/u.py", "line": line}]}

    traces = [[], [event("alloc", 1, 100, 10, 1), event("alloc", 2, 50, 20, 2), event("alloc", 3, 10, 30, 3),
                   event("free_requested", 1, 100, 40, 1), event("free_completed", 2, 50, 50, 2),
                   event("oom", 0, 1 << 30, 60, 4), event("free_completed", 1, 100, 70, 1)]]
    (line,) = timelines(traces, top=1)
    assert line.device == 1 and line.sites == ["/u.py:1", OTHER]
    assert line.held == [[100, 0], [100, 50], [100, 60], [100, 60], [100, 10], [100, 10], [0, 10]]
    assert line.times == [0, 1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5] and line.marks == [(5e-5, "oom")]
    assert line.peaks == [100, 60] and line.peak_total == 160


def test_plot_of_a_snapshot_without_events_is_one_line(tmp_path):
    path = tmp_path / "bare.pickle"
    make_dump(path, history=False)
    out = tmp_path / "x.png"
    result = invoke("plot", str(path), "-o", str(out))
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, f"{path}: no events recorded")
    assert not out.exists()


def test_plot_checks_the_output_before_reading(tmp_path):
    not_a_pickle = tmp_path / "notes.txt"
    not_a_pickle.write_text("hello\n")
    for out, culprit in [("/nonexistent/dir/x.png", "-o '/nonexistent/dir/x.png': folder '/nonexistent/dir' does not exist"),
                         (str(tmp_path / "x.txt"), "cannot write '.txt' files")]:
        result = invoke("plot", str(not_a_pickle), "-o", out)
        assert result.exit_code == 2
        check_one_line_error(result.stderr, result.stdout, culprit)


def test_plot_without_matplotlib_says_which_extra_to_install(dumped, tmp_path, monkeypatch):
    path, _ = dumped
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = invoke("plot", path, "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "pip install -e './tools[plot]'")
    assert not (tmp_path / "x.png").exists()


def test_plot_without_matplotlib_in_a_real_process(dumped, tmp_path):
    path, _ = dumped
    proc = numba_pool_cli("snapshot", "plot", path, "-o", str(tmp_path / "x.png"),
                          prelude="import sys; sys.modules['matplotlib'] = None")
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, "plotting needs matplotlib, which cannot be imported")
    assert "pip install -e './tools[plot]'" in proc.stderr and not (tmp_path / "x.png").exists()


# -- files that are no snapshot --------------------------------------------------------------------

# id -> (the file's bytes, None for no file, or a directory; the text the error must hold after the name)
BAD = {
    "missing": (None, "does not exist"),
    "a-folder": ("folder", "is a directory"),
    "empty": (b"", ": not a pickle (the file is empty or cut short)"),
    "text": (b"segments,device_traces\n", ": not a pickle (UnpicklingError"),
    "cut-short": (pickle.dumps({"segments": [1] * 100})[:50], ": not a pickle"),
    "a-list": (pickle.dumps([1, 2]), ": not a memory snapshot (numba_pool.dump_snapshot's or PyTorch's): "
                                      "the pickle holds a list ([1, 2]), not a dict"),
    "no-segments": (pickle.dumps({"device_traces": []}), ": not a memory snapshot (numba_pool.dump_snapshot's "
                                                         "or PyTorch's): no 'segments' key (its keys: 'device_traces')"),
    "segment-without-blocks": (pickle.dumps({"segments": [{"device": 0, "total_size": 4}]}), "segments[0] has no 'blocks' key"),
    "block-without-state": (pickle.dumps({"segments": [{"device": 0, "total_size": 4, "blocks": [
        {"size": 4, "requested_size": 4, "frames": []}]}]}), "segments[0].blocks[0] has no 'state' key"),
    "size-not-a-number": (pickle.dumps({"segments": [{"device": 0, "total_size": "4", "blocks": []}]}),
                          "segments[0].total_size is a str ('4'), not a whole number"),
    "a-class": (pickle.dumps(OrderedDict(segments=[])), ": not a snapshot: it names collections.OrderedDict"),
}


def _bad_file(tmp_path, content) -> str:
    if content == "folder":
        return str(tmp_path)
    path = tmp_path / "snap.pickle"
    if content is not None:
        path.write_bytes(content)
    return str(path)


#: What ``plot`` says instead, where it differs: it reads the events, not the segments.
PLOT_BAD = {"no-segments": ": no events recorded",
            **dict.fromkeys(("segment-without-blocks", "block-without-state", "size-not-a-number"),
                            "no 'device_traces' key")}


@pytest.mark.parametrize("command", ["summarize", "plot"])
@pytest.mark.parametrize("case", BAD)
def test_a_file_that_is_no_snapshot_is_one_line_naming_it(tmp_path, case, command):
    content, culprit = BAD[case]
    path = _bad_file(tmp_path, content)
    extra = []
    if command == "plot":
        pytest.importorskip("matplotlib")
        extra = ["-o", str(tmp_path / "out.png")]
        culprit = PLOT_BAD.get(case, culprit)
    result = invoke(command, path, *extra)
    assert result.exit_code == 2
    line = check_one_line_error(result.stderr, result.stdout, culprit)
    assert f"{path}:" in line or f"{path}'" in line  # the file is named
    assert not (tmp_path / "out.png").exists()


def test_plot_names_a_bad_event(tmp_path):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[], [{"action": "alloc", "addr": 1, "size": 8}]]}))
    result = invoke("plot", str(path), "-o", str(tmp_path / "out.png"))
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, f"{path}: not a memory snapshot")
    assert "device_traces[1][0] has no 'time_us' key" in result.stderr


def test_an_unreadable_file_is_one_line(dumped, tmp_path, monkeypatch):
    from numba_pool_tools.snapshot import load

    def refused(path, mode="r"):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(load, "open", refused, raising=False)  # the module's open: root reads any file
    result = invoke("summarize", dumped[0])
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, f"{dumped[0]}: cannot read it (Permission denied)")


def test_errors_in_a_real_process_are_one_line(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a pickle\n")
    proc = numba_pool_cli("snapshot", "summarize", str(path))
    assert proc.returncode == 2
    check_one_line_error(proc.stderr, proc.stdout, f"{path}: not a pickle")


# -- the group -------------------------------------------------------------------------------------

def test_help_lists_the_snapshot_group_and_it_alone_prints_its_help():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and re.search(r"^\s+snapshot\s", result.stdout, re.M)
    result = invoke()
    assert result.exit_code == 0
    assert re.search(r"^\s+summarize\s", result.stdout, re.M) and re.search(r"^\s+plot\s", result.stdout, re.M)
    result = invoke("sumarize")
    assert result.exit_code == 2
    check_one_line_error(result.stderr, result.stdout, "No such command 'sumarize'")
