"""PoolStatistics under RMM's names; memory_summary() and the byte readouts, on the CUDA model.
(The usage events behind them: ``tests/allocator/test_usage.py``.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import numba_pool
from numba_pool.observe.statistics import RMM_KEYS, PoolStatistics
from numba_pool.observe.summary import format_summary
from numba_pool.plugin import api

from cuda_model.harness import Program
from helpers import GPU


# -- PoolStatistics under RMM's names -----------------------------------------------------

def snapshot(**overrides) -> PoolStatistics:
    figures = {f.name: i + 1 for i, f in enumerate(dataclasses.fields(PoolStatistics)) if f.type != "bool"}
    figures["arena_on"] = True
    return PoolStatistics(**{**figures, **overrides})


def test_rmm_names_read_the_same_figures():
    s = snapshot()
    assert (s.current_bytes, s.current_count, s.peak_bytes, s.peak_count, s.total_count) == (
        s.bytes_in_use, s.blocks_in_use, s.peak_bytes_in_use, s.peak_blocks_in_use, s.total_allocations)
    d = s.to_dict()
    assert list(d)[:6] == list(RMM_KEYS)
    assert {k: d[k] for k in RMM_KEYS} == {k: getattr(s, k) for k in RMM_KEYS}
    legacy = {"bytes_in_use", "blocks_in_use", "peak_bytes_in_use", "peak_blocks_in_use", "total_allocations"}
    assert not legacy & set(d)  # given once, under RMM's names
    rest = {f.name for f in dataclasses.fields(PoolStatistics)} - legacy - {"total_bytes"}
    assert rest <= set(d) and {"pool_used_high", "oom_errors", "arena_slabs", "total_frees"} <= rest
    assert all(d[k] == getattr(s, k) for k in rest)


def test_old_constructor_and_field_names_still_work():
    s = PoolStatistics(bytes_in_use=1, peak_bytes_in_use=2, blocks_in_use=3, peak_blocks_in_use=4,
                       total_allocations=5, total_frees=6, pool_reserved_bytes=7, pool_reserved_high=8,
                       pool_used_bytes=9, pool_used_high=10, oom_retries=11, oom_errors=12)
    assert s.to_dict()["current_bytes"] == 1 and not s.arena_on and s.arena_slabs == 0
    assert not s.managed_on and (s.managed_reserved_bytes, s.managed_in_use_bytes, s.managed_cached_bytes,
                                 s.managed_blocks) == (0, 0, 0, 0)


def test_to_dict_carries_the_managed_figures():
    """What Dask's worker metrics and ``npd.stats`` publish (``numba_pool.integrations.dask``)."""
    managed = {"managed_on": True, "managed_reserved_bytes": 4 << 20, "managed_in_use_bytes": 1 << 20,
               "managed_cached_bytes": 3 << 20, "managed_blocks": 6}
    d = snapshot(**managed).to_dict()
    assert {k: d[k] for k in managed} == managed
    assert snapshot().to_dict()["managed_on"] is False  # present, and false, when off or not supported


# -- memory_summary on the model ----------------------------------------------------------

@pytest.fixture(params=[False, True], ids=["mempool", "arena"])
def program(request, monkeypatch):
    p = Program(arena=request.param)
    # The model has no Numba context: the current context's manager is the program's.
    monkeypatch.setattr(api, "manager_of", lambda device=None, **_: p.mm)
    yield p
    p.close()


def row(summary: str, name: str) -> list[str]:
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == name:
            return cells[1:]
    raise AssertionError(f"no row {name!r} in\n{summary}")


def test_memory_summary_shows_the_managers_figures(program):
    mm = program.mm
    kept = [mm.memalloc(1000), mm.memalloc(3 << 20)]
    mm.memalloc(5000).free()
    summary = numba_pool.memory_summary()
    print(summary)
    s = mm.statistics()
    assert s.total_bytes == 1000 + (3 << 20) + 5000 and s.total_allocations == 3
    live = 1000 + (3 << 20)
    assert row(summary, "allocated bytes") == [_human(live), _human(live + 5000), _human(live + 5000)]
    assert row(summary, "allocations") == ["2", "3", "3"]
    assert row(summary, "frees") == ["", "", "1"]
    assert row(summary, "pool reserved") == [_human(s.pool_reserved_bytes), _human(s.pool_reserved_high), ""]
    assert row(summary, "pool used") == [_human(s.pool_used_bytes), _human(s.pool_used_high), ""]
    assert row(summary, "out-of-memory errors") == ["", "", "0"]
    if s.arena_on:
        assert "arena on" in summary.splitlines()[0]
        assert row(summary, "arena reserved (slabs)")[0] == _human(s.arena_reserved_bytes) != _human(0)
        assert row(summary, "arena slabs")[0] == str(s.arena_slabs) != "0"
        for name in ("arena in use", "arena cached", "arena quarantined", "arena free"):
            row(summary, name)
    else:
        assert "arena off" in summary.splitlines()[0] and "| arena slabs" not in summary
    assert numba_pool.used_bytes() == 1000 + (3 << 20)
    assert numba_pool.reserved_bytes() == s.pool_reserved_bytes >= numba_pool.used_bytes()
    del kept


def test_memory_summary_counts_out_of_memory(program):
    mm = program.mm
    with pytest.raises(Exception, match="out of memory"):
        mm.memalloc(1 << 40)
    summary = numba_pool.memory_summary()
    assert row(summary, "out-of-memory retries") == ["", "", "1"]
    assert row(summary, "out-of-memory errors") == ["", "", "1"]


def test_memory_summary_shows_this_threads_scratch_block(program):
    mm = program.mm
    assert "scratch" not in numba_pool.memory_summary()
    with numba_pool.scratch(1 << 16, manager=mm):
        a, b = mm.memalloc(1000), mm.memalloc(300)
        summary = numba_pool.memory_summary()
        assert row(summary, "scratch block (this thread)")[0] == _human(1 << 16)
        assert row(summary, "scratch carved")[0] == _human(1024 + 512)
        assert row(summary, "scratch live arrays")[0] == "2"
        del a, b


def test_format_summary_needs_no_manager():
    text = format_summary(snapshot(arena_on=False, bytes_in_use=1 << 20), device=3)
    assert text.splitlines()[0] == "numba_pool memory summary: device 3, arena off"
    assert row(text, "allocated bytes")[0] == "1 MiB (1048576 bytes)"
    assert "| arena" not in text and "| scratch" not in text
    assert row(text, "frees")[2] == str(snapshot().total_frees)
    assert row(format_summary(snapshot()), "arena cached") == [_human(snapshot().arena_cached_bytes), "", ""]
    assert format_summary(snapshot(bytes_in_use=0)).count("| 0 bytes ") == 1  # exact bytes not repeated below 1 KiB


def _human(nbytes: int) -> str:
    from numba_pool.observe.summary import _size

    return _size(nbytes)


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("call", [
    lambda: numba_pool.stats(), lambda: numba_pool.memory_summary(), lambda: numba_pool.used_bytes(),
    lambda: numba_pool.reserved_bytes(), lambda: numba_pool.reset_peak(), lambda: numba_pool.trim(),
    lambda: numba_pool.record_stream(np.zeros(4), 0), lambda: numba_pool.scratch(1024).__enter__(),
], ids=["stats", "memory_summary", "used_bytes", "reserved_bytes", "reset_peak", "trim", "record_stream", "scratch"])
def test_api_calls_without_a_gpu_raise_one_line_runtime_error(call, frontend_name, monkeypatch):
    # Numba's CudaSupportError spans several lines; the README promises RuntimeError.  This
    # process imports both frontends: the variable says which one is meant.
    monkeypatch.setenv("NUMBA_POOL_FRONTEND", frontend_name)
    with pytest.raises(RuntimeError) as caught:
        call()
    message = str(caught.value)
    assert message.startswith("numba_pool: no CUDA GPU is available here (") and "\n" not in message, message
