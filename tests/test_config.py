"""Configuration parsing: sizes with units, fractions, switches, conflicts, error messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_pool import config
from numba_pool.config import ConfigError, KEEP_ALL, load


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("1048576", 1 << 20), ("1 KiB", 1024), ("1KB", 1000), ("64 MiB", 64 << 20),
    ("2 MB", 2_000_000), ("1.5 GiB", 3 << 29), ("3 GB", 3 * 10**9), (" 7 ", 7), ("1 TiB", 1 << 40),
])
def test_sizes_accept_bytes_and_binary_and_decimal_units(text, expected):
    assert config.parse_size(text, "X") == expected


@pytest.mark.parametrize("text", ["abc", "-1", "1.5", "12 parsecs", "", "1e3", "MiB"])
def test_bad_sizes_name_the_source_and_value(text):
    with pytest.raises(ConfigError) as err:
        config.parse_size(text, "NUMBA_POOL_INITIAL_SIZE")
    assert "NUMBA_POOL_INITIAL_SIZE" in str(err.value) and repr(text) in str(err.value)
    assert "KiB" in str(err.value)  # says what is accepted


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["", " B", " KiB", " MiB", " GiB", " KB", " MB", " GB"]))
def test_size_with_unit_scales_exactly(n, unit):
    factor = {"": 1, " B": 1, " KiB": 1 << 10, " MiB": 1 << 20, " GiB": 1 << 30,
              " KB": 10**3, " MB": 10**6, " GB": 10**9}[unit]
    assert config.parse_size(f"{n}{unit}", "X") == n * factor


@given(st.integers(min_value=0, max_value=2**62))
def test_python_ints_pass_through(n):
    assert config.parse_size(n, "install(initial_size)") == n


def test_max_size_fraction_forms():
    assert config.parse_max_size("0.5", "V") == 0.5
    assert config.parse_max_size("25%", "V") == 0.25
    assert config.parse_max_size(1.0, "V") == 1.0
    assert config.parse_max_size("8 GiB", "V") == 8 << 30
    assert load({"NUMBA_POOL_MAX_SIZE": "50%"}).max_size_bytes(1000) == 500


@pytest.mark.parametrize("text", ["1.5", "0.0", "150%", "0", "lots"])
def test_bad_max_size(text):
    with pytest.raises(ConfigError, match="NUMBA_POOL_MAX_SIZE"):
        load({"NUMBA_POOL_MAX_SIZE": text})


@pytest.mark.parametrize("text, expected", [("1", True), ("0", False), ("true", True), ("No", False), (" on ", True)])
def test_switches(text, expected):
    assert load({"NUMBA_POOL_USE_DEFAULT_POOL": text}).use_default_pool is expected


@pytest.mark.parametrize("text", ["2", "maybe", "yes please"])
def test_bad_switch_names_variable_and_value(text):
    with pytest.raises(ConfigError, match=f"NUMBA_POOL_ARENA='{text}' is not a switch: expected 0 or 1"):
        load({"NUMBA_POOL_ARENA": text})


def test_defaults_keep_everything_cached_in_a_private_pool():
    c = load({})
    assert c.release_threshold == KEEP_ALL and c.max_size is None and c.initial_size == 0
    assert not c.use_default_pool and not c.arena and c.log is None


def test_empty_variables_mean_unset():
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": "", "NUMBA_POOL_MAX_SIZE": "  "}) == load({})


def test_release_threshold_all_and_sizes():
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": "all"}).release_threshold == KEEP_ALL
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": "1 GiB"}).release_threshold == 1 << 30
    with pytest.raises(ConfigError, match="'all'"):
        load({"NUMBA_POOL_RELEASE_THRESHOLD": "everything"})


def test_install_overrides_beat_environment():
    c = load({"NUMBA_POOL_INITIAL_SIZE": "1 MiB"}, initial_size="2 MiB")
    assert c.initial_size == 2 << 20


def test_install_errors_name_the_keyword():
    with pytest.raises(ConfigError, match=r"install\(initial_size\)='big'"):
        load({}, initial_size="big")
    with pytest.raises(ConfigError, match="unknown option.*max_sise"):
        load({}, max_sise=1)


def test_conflicts_are_errors_not_silent_choices():
    with pytest.raises(ConfigError, match="NUMBA_POOL_MAX_SIZE.*NUMBA_POOL_USE_DEFAULT_POOL"):
        load({"NUMBA_POOL_MAX_SIZE": "1 GiB", "NUMBA_POOL_USE_DEFAULT_POOL": "1"})
    with pytest.raises(ConfigError, match="NUMBA_POOL_INITIAL_SIZE.*NUMBA_POOL_RELEASE_THRESHOLD"):
        load({"NUMBA_POOL_INITIAL_SIZE": "2 GiB", "NUMBA_POOL_RELEASE_THRESHOLD": "1 GiB"})
    with pytest.raises(ConfigError, match="above NUMBA_POOL_MAX_SIZE"):
        load({"NUMBA_POOL_INITIAL_SIZE": "2 GiB", "NUMBA_POOL_MAX_SIZE": "1 GiB"})
    with pytest.raises(ConfigError, match="must fit in a slab"):
        load({}, arena_max_block="8 MiB", arena_slab_size="4 MiB")


def test_log_path_folder_must_exist(tmp_path):
    assert load({"NUMBA_POOL_LOG": str(tmp_path / "a.csv")}).log == str(tmp_path / "a.csv")
    with pytest.raises(ConfigError, match="NUMBA_POOL_LOG.*does not exist"):
        load({"NUMBA_POOL_LOG": str(tmp_path / "missing" / "a.csv")})


def test_describe_is_readable():
    d = load({"NUMBA_POOL_MAX_SIZE": "50%", "NUMBA_POOL_INITIAL_SIZE": "1 GiB"}).describe()
    assert d["max size"] == "50% of device memory"
    assert d["initial size"] == "1 GiB (1073741824 bytes)"
    assert d["release threshold"].startswith("keep all")
