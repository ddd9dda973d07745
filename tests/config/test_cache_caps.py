"""Issue 34, defect 6: the pinned and managed caches' caps refuse a cap that cannot serve a block.

Before the fix, ``NUMBA_POOL_HOST_MAX_SIZE=1`` and ``NUMBA_POOL_MANAGED_MAX_SIZE=100`` were
accepted, and every pinned or managed allocation then failed with ``CUDA_ERROR_OUT_OF_MEMORY``.
Now they follow ``NUMBA_POOL_MAX_SIZE``'s rule (a bare number below 1 MiB is refused with a
suggestion; a small cap stays possible with its unit), and a cap below the caches' smallest
block is refused whatever its spelling, in one line, from the environment and from
``install()`` alike."""

from __future__ import annotations

import pytest

import numba_pool
from numba_pool.allocator import host_blocks
from numba_pool.config import ConfigError, load, sizes

MIN_BLOCK = host_blocks.MIN_BLOCK  # what the caches round every request up to, at least

CAPS = [("NUMBA_POOL_HOST_MAX_SIZE", "host_max_size", {"host": True}),
        ("NUMBA_POOL_MANAGED_MAX_SIZE", "managed_max_size", {})]


def _one_line(call, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as err:
        call(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message and message.strip() == message, message
    return message


def test_the_smallest_block_is_the_caches():
    assert sizes.MIN_CACHE_BLOCK == MIN_BLOCK == host_blocks.block_size(1)


@pytest.mark.parametrize("variable, keyword, extra", CAPS)
@pytest.mark.parametrize("value", ["1", "100", "1048575", 100])
def test_a_bare_number_below_1_mib_is_refused_with_a_suggestion(variable, keyword, extra, value):
    nbytes = int(value)
    if isinstance(value, str):
        message = _one_line(load, {variable: value}, **extra)
        assert message.startswith(f"{variable}={value!r} would cap "), message
    else:
        message = _one_line(load, {}, **extra, **{keyword: value})
        assert message.startswith(f"install({keyword})={value!r} would cap "), message
    assert f"at {nbytes} bytes: did you mean '{nbytes} MiB'?" in message, message
    assert "needs its unit" in message, message


@pytest.mark.parametrize("variable, keyword, extra", CAPS)
@pytest.mark.parametrize("value", ["1 B", "100 B", "511 B", "0.25 KiB"])
def test_a_cap_below_the_smallest_block_is_refused(variable, keyword, extra, value):
    env = _one_line(load, {variable: value}, **extra)
    assert env.startswith(f"{variable}={value!r} would cap "), env
    assert f"below its smallest block ({MIN_BLOCK} bytes)" in env, env
    keyword_line = _one_line(numba_pool.install, **extra, **{keyword: value})  # install() gives the same line
    assert keyword_line == env.replace(variable, f"install({keyword})"), keyword_line


@pytest.mark.parametrize("variable, keyword, extra", CAPS)
def test_small_caps_with_a_unit_and_large_bare_ones_are_accepted(variable, keyword, extra):
    def cap(value):
        return getattr(load({variable: value}, **extra), keyword)

    assert cap("512 B") == cap("0.5 KiB") == 512
    assert cap("64 KiB") == 64 << 10
    assert cap(str(1 << 20)) == 1 << 20
    assert cap("none") is None
    assert getattr(load({}, **extra, **{keyword: 1 << 20}), keyword) == 1 << 20
