"""The bench's host side: taking turns, rendering, and the choice of no-op floor."""

from __future__ import annotations

import pytest

from numba_pool import bench, noop
from numba_pool.config import ConfigError


def test_sizes_take_turns_inside_each_repeat():
    order = []
    bodies = {key: (lambda key=key: order.append(key)) for key in ("a", "b", "c")}
    medians = bench._median_times_taking_turns(bodies, repeats=3)
    assert order == ["a", "b", "c"] * 3
    assert set(medians) == {"a", "b", "c"} and all(t >= 0 for t in medians.values())


def result(seed_ms, *us):
    return {"seed_loop_ms": seed_ms, "alloc_free_us": {str(s): t for s, t in zip(bench.SIZES, us)}}


def test_table_gives_signed_differences_from_both_floors():
    table = bench.render({
        bench.DEFAULT.label: result(12.0, 25.0, 25.0, 85.0, 127.0),
        bench.ARENA.label: result(4.0, 9.25, 9.5, 11.0, 11.0),
        bench.FLOOR.label: result(4.0, 9.75, 9.75, 9.75, 9.75),
        bench.BARE_FLOOR.label: result(4.0, 8.25, 8.25, 8.25, 8.25),
    })
    header, _, default, arena, floor, bare = table.splitlines()
    assert "(no-op floor, Numba alone)" in header
    assert "1.00" in default and "25.00 (+15.25, +16.75)" in default
    assert "3.00" in arena
    assert "9.25 (-0.50, +1.00)" in arena and "11.00 (+1.25, +2.75)" in arena
    assert "9.75 (+0.00, +1.50)" in floor and "8.25 (-1.50, +0.00)" in bare


def test_table_without_floors_has_plain_times():
    table = bench.render({bench.DEFAULT.label: result(12.0, 25.0, 25.0, 85.0, 127.0)})
    assert "(" not in table.splitlines()[2] and "25.00" in table


@pytest.mark.parametrize("value, chosen", [("", noop.NoopManager), ("1", noop.NoopManager),
                                           ("0", noop.BareNoopManager), ("off", noop.BareNoopManager)])
def test_floor_is_chosen_by_its_variable(value, chosen):
    assert noop._chosen_manager({"NUMBA_POOL_NOOP_FINALIZER": value}) is chosen


def test_bad_floor_variable_is_named():
    with pytest.raises(ConfigError, match="NUMBA_POOL_NOOP_FINALIZER='maybe'"):
        noop._chosen_manager({"NUMBA_POOL_NOOP_FINALIZER": "maybe"})
