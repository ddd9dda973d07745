"""Configuration parsing: sizes with units, fractions, switches, paths, conflicts, and the
one-line error messages that name the variable or keyword the user typed."""

from __future__ import annotations

import os
import re
import warnings
from fractions import Fraction
from pathlib import Path

import humanfriendly
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numba_pool import config
from numba_pool.config import KEEP_ALL, MAX_BYTES, OPTIONS, ConfigError, ConfigWarning, load

#: These tests parse the arena's and caches' options with those off: the warning that says so is tested on its own.
pytestmark = pytest.mark.filterwarnings("ignore:.* has no effect. .* is off:numba_pool.config.ConfigWarning")

REPO = Path(__file__).resolve().parents[2]
UNITS = {"": 1, " B": 1, " bytes": 1, " KiB": 1 << 10, " MiB": 1 << 20, " GiB": 1 << 30, " TiB": 1 << 40,
         " KB": 10**3, " MB": 10**6, " GB": 10**9, " TB": 10**12, "KiB": 1 << 10, " mib": 1 << 20}


def one_line_error(call, *args, **kwargs) -> str:
    """The message of the ConfigError that ``call`` raises; asserts it is a single line."""
    with pytest.raises(ConfigError) as err:
        call(*args, **kwargs)
    message = str(err.value)
    assert "\n" not in message and message.strip() == message, message
    return message


def exact_decimal(value: Fraction) -> str:
    """``value`` (whose denominator divides a power of 10) written out exactly."""
    for digits in range(80):
        scaled = value * 10**digits
        if scaled.denominator == 1:
            text = str(scaled.numerator).rjust(digits + 1, "0")
            return f"{text[:-digits]}.{text[-digits:]}" if digits else text
    raise AssertionError(value)


# -- good values --------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("1048576", 1 << 20), ("1 KiB", 1024), ("1KB", 1000), ("64 MiB", 64 << 20),
    ("64 MB", 64 * 10**6), ("64 mib", 64 << 20), ("2 MB", 2_000_000), ("1.5 GiB", 3 << 29),
    ("3 GB", 3 * 10**9), (" 7 ", 7), ("1 TiB", 1 << 40), (".5 KiB", 512), ("0.0009765625 KiB", 1),
    ("1 byte", 1), ("2 bytes", 2), ("1.0 B", 1), (str(MAX_BYTES), MAX_BYTES),
    ("16 EiB", None),  # 2**64: one too many
])
def test_sizes_accept_bytes_and_binary_and_decimal_units(text, expected):
    if expected is None:
        assert "above the largest size" in one_line_error(config.parse_size, text, "X")
    else:
        assert config.parse_size(text, "X") == expected


def test_python_and_numpy_ints_are_bytes():
    assert config.parse_size(np.int64(4096), "install(initial_size)") == 4096
    assert config.parse_size(MAX_BYTES, "install(initial_size)") == MAX_BYTES


def test_max_size_fraction_forms():
    assert config.parse_max_size("0.5", "V") == 0.5
    assert config.parse_max_size("25%", "V") == 0.25
    assert config.parse_max_size(" 50 % ", "V") == 0.5
    assert config.parse_max_size("1.0", "V") == 1.0
    assert config.parse_max_size(1.0, "V") == 1.0
    assert config.parse_max_size("8 GiB", "V") == 8 << 30
    assert config.parse_max_size("1 MiB", "V") == 1 << 20
    assert config.parse_max_size(str(1 << 20), "V") == 1 << 20  # a bare number of 1 MiB or more is bytes
    assert config.parse_max_size("512 KiB", "V") == 512 << 10  # a small cap with its unit is accepted
    assert config.parse_max_size("4096 B", "V") == 4096
    assert load({"NUMBA_POOL_MAX_SIZE": "50%"}).max_size_bytes(1000) == 500


@pytest.mark.parametrize("text, expected", [("1", True), ("0", False), ("true", True), ("No", False), (" on ", True),
                                            ("yes", True), ("OFF", False)])
def test_switches(text, expected):
    assert load({"NUMBA_POOL_USE_DEFAULT_POOL": text}).use_default_pool is expected


def test_defaults_keep_everything_cached_in_a_private_pool():
    c = load({})
    assert c.release_threshold == KEEP_ALL and c.max_size is None and c.initial_size == 0
    assert not c.use_default_pool and not c.arena and c.log is None
    assert c.arena_max_block == config.DEFAULT_ARENA_MAX_BLOCK and c.arena_slab_size == config.DEFAULT_ARENA_SLAB_SIZE


def test_empty_variables_mean_unset():
    assert load({variable: "" for variable, _ in OPTIONS.values()}) == load({})
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": "", "NUMBA_POOL_MAX_SIZE": "  "}) == load({})


def test_release_threshold_all_and_sizes():
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": "all"}).release_threshold == KEEP_ALL
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": "MAX"}).release_threshold == KEEP_ALL
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": "1 GiB"}).release_threshold == 1 << 30
    assert load({"NUMBA_POOL_RELEASE_THRESHOLD": str(MAX_BYTES)}).release_threshold == KEEP_ALL


def test_install_overrides_beat_environment():
    c = load({"NUMBA_POOL_INITIAL_SIZE": "1 MiB"}, initial_size="2 MiB")
    assert c.initial_size == 2 << 20


def test_arena_sizes_that_are_multiples_of_256(tmp_path):
    c = load({"NUMBA_POOL_ARENA_MAX_BLOCK": "1024", "NUMBA_POOL_ARENA_SLAB_SIZE": "1 MiB"})
    assert (c.arena_max_block, c.arena_slab_size) == (1024, 1 << 20)
    c = load({}, arena_max_block=256, arena_slab_size="256 B")
    assert (c.arena_max_block, c.arena_slab_size) == (256, 256)


ALL_SET = {
    "NUMBA_POOL_RELEASE_THRESHOLD": "1 GiB", "NUMBA_POOL_MAX_SIZE": "50%", "NUMBA_POOL_INITIAL_SIZE": "1 MiB",
    "NUMBA_POOL_USE_DEFAULT_POOL": "0", "NUMBA_POOL_ARENA": "1", "NUMBA_POOL_ARENA_MAX_BLOCK": "1 KiB",
    "NUMBA_POOL_ARENA_SLAB_SIZE": "1 MiB", "NUMBA_POOL_LOG": "numba-pool-log.csv", "NUMBA_POOL_IPC": "0",
    "NUMBA_POOL_PEER_ACCESS": "none", "NUMBA_POOL_HOST": "1", "NUMBA_POOL_HOST_MAX_SIZE": "1 GiB",
    "NUMBA_POOL_HOST_RELEASE_THRESHOLD": "64 MiB", "NUMBA_POOL_MANAGED": "0", "NUMBA_POOL_MANAGED_MAX_SIZE": "2 GiB",
    "NUMBA_POOL_MANAGED_RELEASE_THRESHOLD": "256 MiB",
    "NUMBA_POOL_MANAGED_PREFETCH": "1", "NUMBA_POOL_OOM_SNAPSHOT": "numba-pool-oom.pickle", "NUMBA_POOL_LEAK_REPORT": "1",
    "NUMBA_POOL_CUDA_CORE": "0",
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_none_means_the_default_for_every_option(option):
    defaults = load({})
    assert getattr(load({}, **{option: None}), option) == getattr(defaults, option)
    # and the environment does not apply either: install(x=None) is the same everywhere
    assert getattr(load(ALL_SET, **{option: None}), option) == getattr(defaults, option)


def test_all_options_none_is_the_default():
    assert load(ALL_SET, **dict.fromkeys(OPTIONS)) == load({})


def test_log_path(tmp_path, monkeypatch):
    assert load({"NUMBA_POOL_LOG": str(tmp_path / "a.csv")}).log == str(tmp_path / "a.csv")
    existing = tmp_path / "b.csv"
    existing.write_text("old")
    assert load({}, log=existing).log == str(existing)
    assert existing.read_text() == "old"  # checked, not touched
    assert not (tmp_path / "a.csv").exists()  # nor created
    monkeypatch.chdir(tmp_path)
    assert load({"NUMBA_POOL_LOG": "rel.csv"}).log == str(tmp_path / "rel.csv")  # absolute
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load({"NUMBA_POOL_LOG": "~/home.csv"}).log == str(tmp_path / "home.csv")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any file")
def test_log_file_not_writable(tmp_path):
    path = tmp_path / "ro.csv"
    path.write_text("")
    path.chmod(0o444)
    message = one_line_error(load, {"NUMBA_POOL_LOG": str(path)})
    assert "NUMBA_POOL_LOG=" in message and "is not writable" in message


def test_describe_is_readable():
    d = load({"NUMBA_POOL_MAX_SIZE": "50%", "NUMBA_POOL_INITIAL_SIZE": "1 GiB"}).describe()
    assert d["max size"] == "50% of device memory"
    assert d["initial size"] == "1 GiB (1073741824 bytes)"
    assert d["release threshold"].startswith("keep all")


# -- bad values: one table per source -----------------------------------------------------

#: (variable, value, fragment of the message).  ``{tmp}`` is replaced by a temporary folder, in
#: which ``file.csv`` exists.
ENV_BAD = [
    ("NUMBA_POOL_INITIAL_SIZE", str(2**64), "is above the largest size, 2**64 - 1"),
    ("NUMBA_POOL_INITIAL_SIZE", "16 EiB", "is above the largest size"),
    ("NUMBA_POOL_INITIAL_SIZE", "1.5 B", "is not a whole number of bytes (1.5 bytes)"),
    ("NUMBA_POOL_INITIAL_SIZE", "1.1KiB", "is not a whole number of bytes (1126.4 bytes)"),
    ("NUMBA_POOL_INITIAL_SIZE", "1.5", "is not a whole number of bytes"),
    ("NUMBA_POOL_INITIAL_SIZE", "-1", "is negative"),
    ("NUMBA_POOL_INITIAL_SIZE", "-5 MiB", "is negative"),
    ("NUMBA_POOL_INITIAL_SIZE", "abc", "is not a size"),
    ("NUMBA_POOL_INITIAL_SIZE", "MiB", "is not a size"),
    ("NUMBA_POOL_INITIAL_SIZE", "1e9", "is not a size"),
    ("NUMBA_POOL_INITIAL_SIZE", "1,000", "is not a size"),
    ("NUMBA_POOL_INITIAL_SIZE", "64 M", "unknown unit 'M' (did you mean MB?)"),
    ("NUMBA_POOL_INITIAL_SIZE", "64 MiBs", "unknown unit 'MiBs' (did you mean MiB?)"),
    ("NUMBA_POOL_INITIAL_SIZE", "12 parsecs", "unknown unit 'parsecs'"),
    ("NUMBA_POOL_RELEASE_THRESHOLD", str(2**64), "is above the largest size"),
    ("NUMBA_POOL_RELEASE_THRESHOLD", "everything", "or 'all' to keep every byte cached"),
    ("NUMBA_POOL_RELEASE_THRESHOLD", "-1", "is negative"),
    ("NUMBA_POOL_ARENA_MAX_BLOCK", "1000", "is not a positive multiple of 256 bytes, the arena's block alignment: expected e.g. 768 or 1024"),
    ("NUMBA_POOL_ARENA_MAX_BLOCK", "0", "expected e.g. 256"),
    ("NUMBA_POOL_ARENA_MAX_BLOCK", "1.5 KiB", None),  # 1536 = 6 * 256: accepted (see below)
    ("NUMBA_POOL_ARENA_SLAB_SIZE", "1 MB", "(1000000 bytes) is not a positive multiple of 256"),
    ("NUMBA_POOL_ARENA_SLAB_SIZE", "100", "is not a positive multiple of 256"),
    ("NUMBA_POOL_ARENA_SLAB_SIZE", "lots", "is not a size"),
    ("NUMBA_POOL_MAX_SIZE", "1", "would cap the pool at 1 bytes: did you mean '1.0' (100 %) or '1 MiB'?"),
    ("NUMBA_POOL_MAX_SIZE", "50", "did you mean '50%' or '50 MiB'?"),
    ("NUMBA_POOL_MAX_SIZE", "4096", "did you mean '4096 MiB'?"),
    ("NUMBA_POOL_MAX_SIZE", "50%%", "is not a size"),
    ("NUMBA_POOL_MAX_SIZE", "110%", "is not a fraction of device memory in (0, 1]"),
    ("NUMBA_POOL_MAX_SIZE", "0%", "is not a fraction of device memory in (0, 1]"),
    ("NUMBA_POOL_MAX_SIZE", "-50%", "is not a size"),
    ("NUMBA_POOL_MAX_SIZE", "1.5", "is not a fraction of device memory in (0, 1]"),
    ("NUMBA_POOL_MAX_SIZE", "0.0", "is not a fraction of device memory in (0, 1]"),
    ("NUMBA_POOL_MAX_SIZE", "0", "capped at 0 bytes"),
    ("NUMBA_POOL_MAX_SIZE", "lots", "or a fraction of device memory such as 0.5 or 50%"),
    ("NUMBA_POOL_MAX_SIZE", str(2**64), "is above the largest size"),
    ("NUMBA_POOL_ARENA", "maybe", "is not a switch: expected 0 or 1"),
    ("NUMBA_POOL_ARENA", "2", "is not a switch"),
    ("NUMBA_POOL_ARENA", "yes please", "is not a switch"),
    ("NUMBA_POOL_USE_DEFAULT_POOL", "enabled", "is not a switch"),
    ("NUMBA_POOL_IPC", "maybe", "is not a switch"),
    ("NUMBA_POOL_PEER_ACCESS", "some", "is not a peer access setting: expected 'all' or 'none'"),
    ("NUMBA_POOL_PEER_ACCESS", "1", "is not a peer access setting"),
    ("NUMBA_POOL_HOST", "maybe", "is not a switch"),
    ("NUMBA_POOL_HOST_MAX_SIZE", "0", "a host cache capped at 0 bytes"),
    ("NUMBA_POOL_HOST_MAX_SIZE", "lots", "or 'none' for no cap"),
    ("NUMBA_POOL_HOST_RELEASE_THRESHOLD", "-1", "is negative"),
    ("NUMBA_POOL_LOG", "{tmp}", "is a folder"),
    ("NUMBA_POOL_LOG", "{tmp}/", "is a folder"),
    ("NUMBA_POOL_LOG", "/proc/version", "is a kernel interface file"),
    ("NUMBA_POOL_LOG", "/proc/numba-pool.csv", "kernel interface folder"),
    ("NUMBA_POOL_LOG", "/dev/null", "is not a regular file"),
    ("NUMBA_POOL_LOG", "{tmp}/missing/a.csv", "which does not exist"),
    ("NUMBA_POOL_LOG", "{tmp}/file.csv/a.csv", "which is not a folder"),
]


@pytest.mark.parametrize("variable, value, fragment", ENV_BAD)
def test_bad_environment_names_variable_and_value(variable, value, fragment, tmp_path):
    (tmp_path / "file.csv").write_text("")
    value = value.replace("{tmp}", str(tmp_path))
    if fragment is None:
        load({variable: value})
        return
    message = one_line_error(load, {variable: value})
    assert message.startswith(f"{variable}={value!r}"), message
    assert fragment in message, message


#: (keyword, value, fragment of the message).
KEYWORD_BAD = [
    ("initial_size", 2**64, "is above the largest size"),
    ("initial_size", "1.5 B", "is not a whole number of bytes"),
    ("initial_size", 1.5, "is a float, not a size"),
    ("initial_size", 1e9, "is a float, not a size"),
    ("initial_size", True, "is not a size"),
    ("initial_size", "", "is not a size"),
    ("initial_size", -1, "is negative"),
    ("initial_size", "big", "is not a size"),
    ("initial_size", [1], "is not a size"),
    ("release_threshold", 2**64, "is above the largest size"),
    ("release_threshold", "nope", "or 'all'"),
    ("arena_max_block", 1000, "is not a positive multiple of 256 bytes"),
    ("arena_slab_size", 300, "expected e.g. 256 or 512"),
    ("arena_slab_size", -256, "is negative"),
    ("max_size", 1, "did you mean '1.0' (100 %) or '1 MiB'?"),
    ("max_size", 1000, "did you mean '1000 MiB'?"),
    ("max_size", 0, "capped at 0 bytes"),
    ("max_size", 1.5, "is not a fraction of device memory in (0, 1]"),
    ("max_size", 0.0, "is not a fraction"),
    ("max_size", -0.5, "is not a fraction"),
    ("max_size", float("nan"), "is not a fraction"),
    ("max_size", "110%", "is not a fraction"),
    ("max_size", "", "is not a size"),
    ("max_size", 2**64, "is above the largest size"),
    ("arena", "maybe", "is not a switch"),
    ("arena", 2, "is not a switch"),
    ("use_default_pool", "", "is not a switch"),
    ("log", 42, "is not a file path"),
    ("log", "", "is not a file path"),
    ("log", "{tmp}", "is a folder"),
    ("log", "/proc/version", "is a kernel interface file"),
    ("log", "a\0.csv", "contains a NUL character"),
    ("ipc", "sometimes", "is not a switch"),
    ("peer_access", True, "is not a peer access setting"),
    ("host", "sometimes", "is not a switch"),
    ("host_max_size", 0, "a host cache capped at 0 bytes"),
    ("host_release_threshold", "x", "is not a size"),
]


def test_host_options():
    c = load({})
    assert not c.host and c.host_max_size is None and c.host_release_threshold == KEEP_ALL
    assert c.describe()["host"].startswith("off")
    c = load({"NUMBA_POOL_HOST": "1", "NUMBA_POOL_HOST_MAX_SIZE": "256 MiB", "NUMBA_POOL_HOST_RELEASE_THRESHOLD": "0"})
    assert (c.host, c.host_max_size, c.host_release_threshold) == (True, 256 << 20, 0)
    assert "cap 256 MiB (268435456 bytes)" in c.describe()["host"]
    assert load({"NUMBA_POOL_HOST_MAX_SIZE": "none"}, host=True).host_max_size is None


@pytest.mark.parametrize("option, value, fragment", KEYWORD_BAD)
def test_bad_keyword_names_keyword_and_value(option, value, fragment, tmp_path):
    if value == "{tmp}":
        value = tmp_path
    message = one_line_error(load, {}, **{option: value})
    assert message.startswith(f"install({option})={value!r}"), message
    assert fragment in message, message


def test_unknown_keyword_suggests_the_closest():
    message = one_line_error(load, {}, max_sise=1)
    assert "unknown option(s) 'max_sise' (did you mean 'max_size'?)" in message
    assert "release_threshold" in message  # lists what is accepted


#: Options that contradict each other, from either source: the message names both as typed.
CONFLICTS = [
    ({"NUMBA_POOL_MAX_SIZE": "1 GiB", "NUMBA_POOL_USE_DEFAULT_POOL": "1"}, {},
     ["NUMBA_POOL_MAX_SIZE='1 GiB'", "NUMBA_POOL_USE_DEFAULT_POOL='1'", "cannot be capped"]),
    ({"NUMBA_POOL_INITIAL_SIZE": "2 GiB", "NUMBA_POOL_RELEASE_THRESHOLD": "1 GiB"}, {},
     ["NUMBA_POOL_INITIAL_SIZE='2 GiB' (2147483648 bytes) is above NUMBA_POOL_RELEASE_THRESHOLD='1 GiB'"]),
    ({"NUMBA_POOL_RELEASE_THRESHOLD": "1 GiB"}, {"initial_size": 2 << 30},
     ["install(initial_size)=2147483648 is above NUMBA_POOL_RELEASE_THRESHOLD='1 GiB' (1073741824 bytes)"]),
    ({"NUMBA_POOL_INITIAL_SIZE": "2 GiB", "NUMBA_POOL_MAX_SIZE": "1 GiB"}, {},
     ["is above NUMBA_POOL_MAX_SIZE='1 GiB'"]),
    ({}, {"arena_max_block": "8 MiB", "arena_slab_size": "4 MiB"},
     ["install(arena_max_block)='8 MiB' (8388608 bytes) is larger than install(arena_slab_size)='4 MiB'",
      "must fit in a slab"]),
    ({"NUMBA_POOL_ARENA_MAX_BLOCK": "8 MiB"}, {},
     ["NUMBA_POOL_ARENA_MAX_BLOCK='8 MiB'", "is larger than the default arena_slab_size of 4194304 bytes (set NUMBA_POOL_ARENA_SLAB_SIZE"]),
    ({"NUMBA_POOL_ARENA_SLAB_SIZE": "1 KiB"}, {},
     ["the default arena_max_block of 65536 bytes (set NUMBA_POOL_ARENA_MAX_BLOCK", "NUMBA_POOL_ARENA_SLAB_SIZE='1 KiB'"]),
]


@pytest.mark.parametrize("environ, overrides, fragments", CONFLICTS)
def test_conflicts_are_errors_naming_both_sources(environ, overrides, fragments):
    message = one_line_error(load, environ, **overrides)
    for fragment in fragments:
        assert fragment in message, message


def test_every_parser_error_is_one_line_naming_the_source():
    """Newlines and other odd characters in a value are escaped (repr), never printed raw."""
    for name, (variable, parser) in OPTIONS.items():
        message = one_line_error(parser, "bad\nvalue\x00", variable)
        assert message.startswith(f"{variable}='bad\\nvalue\\x00'"), message


# -- unknown variables --------------------------------------------------------------------

@pytest.mark.parametrize("name, hint", [
    ("NUMBA_POOL_ARENNA", "did you mean NUMBA_POOL_ARENA?"),
    ("NUMBA_POOL_MAXSIZE", "did you mean NUMBA_POOL_MAX_SIZE?"),
    ("NUMBA_POOL_RELEASE_THRESHHOLD", "did you mean NUMBA_POOL_RELEASE_THRESHOLD?"),
    ("numba_pool_arena", "did you mean NUMBA_POOL_ARENA?"),
    ("NUMBA_POOL_NOOP_FINALISER", "did you mean NUMBA_POOL_NOOP_FINALIZER?"),
    ("NUMBA_POOL_XYZZY", "known variables: NUMBA_POOL_ARENA, "),
    # Misspellings of the prefix itself.
    ("NUMBAPOOL_ARENA", "did you mean NUMBA_POOL_ARENA?"),
    ("NUMBA_POOLS_ARENA", "did you mean NUMBA_POOL_ARENA?"),
    ("NUMBA__POOL_MAX_SIZE", "did you mean NUMBA_POOL_MAX_SIZE?"),
    ("NumbaPool_Log", "did you mean NUMBA_POOL_LOG?"),
])
def test_unknown_variables_warn_with_the_closest_name(name, hint):
    with pytest.warns(ConfigWarning) as record:
        assert load({name: "1"}) == load({})
    (warning,) = [w for w in record if issubclass(w.category, ConfigWarning)]
    message = str(warning.message)
    assert message.startswith(f"{name} is not a numba_pool variable and is ignored") and hint in message, message
    assert "\n" not in message


def test_the_list_of_known_variables_leaves_out_the_tools_own():
    with pytest.warns(ConfigWarning) as record:
        load({"NUMBA_POOL_XYZZY": "1"})
    message = str(record[0].message)
    assert "NUMBA_POOL_MAX_SIZE" in message
    assert "BENCH" not in message and "FUZZ" not in message and "NOOP" not in message


def test_names_that_only_share_a_start_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load({"NUMBA_CUDA_MEMORY_MANAGER": "numba_pool", "NUMBA_NUM_THREADS": "4", "NUMBA_POO": "x"})


def test_the_typo_warning_points_at_the_users_line():
    with pytest.warns(ConfigWarning) as record:
        load({"NUMBA_POOL_ARENNA": "1"})  # this line
    assert record[0].filename == __file__ and record[0].lineno == _line_of("# this line")


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line_of" not in line)


def test_known_variables_do_not_warn():
    environ = {**dict.fromkeys(config.OTHER_VARIABLES, "1"), **ALL_SET}
    environ.update(NUMBA_CUDA_MEMORY_MANAGER="numba_pool", NUMBA_POOL_FRONTEND="mlir", OTHER="x",
                   NUMBA_POOL_MANAGED="1")  # ALL_SET's managed options with the managed cache off warn
    assert set(environ) >= config.KNOWN_VARIABLES
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load(environ)


@pytest.mark.parametrize("switch, name", [
    ("arena", "arena_max_block"), ("arena", "arena_slab_size"), ("host", "host_max_size"),
    ("host", "host_release_threshold"), ("managed", "managed_max_size"), ("managed", "managed_release_threshold"),
    ("managed", "managed_prefetch")])
def test_an_option_of_a_mode_or_cache_that_is_off_warns_in_one_line(switch, name):
    """An option only an enabled mode or cache reads (``NUMBA_POOL_HOST_MAX_SIZE`` with the pinned cache off) does
    nothing: one warning says so, naming the option as typed and how the switch stands; with the switch on, none."""
    variable, switch_variable = OPTIONS[name][0], OPTIONS[switch][0]
    value = ALL_SET[variable]
    with pytest.warns(ConfigWarning) as record:
        load({switch_variable: "0", variable: value})
    [message] = [str(w.message) for w in record]
    assert message == message.strip() and "\n" not in message, message
    assert message.startswith(f"numba_pool: {variable}={value!r} has no effect: ") and f"({switch_variable}='0'; " in message
    if not getattr(load({}), switch):  # off by default: as install()'s keyword too
        with pytest.warns(ConfigWarning, match=rf"is off \(by default; {switch_variable}=1 or install\({switch}=True\)"):
            load({}, **{name: getattr(load({variable: value, switch_variable: "1"}), name)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        load({switch_variable: "1", variable: value})


def test_a_retired_variable_says_it_is_no_longer_read():
    with pytest.warns(ConfigWarning) as record:
        load({"NUMBA_POOL_MANAGED_INITIAL_SIZE": "16 MiB"})
    [message] = [str(w.message) for w in record]
    assert message.startswith("NUMBA_POOL_MANAGED_INITIAL_SIZE is no longer read and is ignored: managed blocks come "
                              "from cuMemAllocManaged") and "did you mean" not in message


def test_every_numba_pool_variable_used_in_the_repository_is_known():
    """A variable that the package, its kernels or tests read must not be reported as a typo."""
    mine = {Path(__file__).name, "test_install.py"}
    used = {}
    for folder in ("numba_pool", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            if path.name in mine:
                continue
            for name in re.findall(r"\bNUMBA_POOL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
                used.setdefault(name, path.relative_to(REPO))
    assert used, "the scan found nothing: the repository layout changed"
    from numba_pool.config.variables import RETIRED
    unknown = {name: str(path) for name, path in used.items() if name not in config.KNOWN_VARIABLES | set(RETIRED)}
    assert not unknown, f"add these to numba_pool.config.OTHER_VARIABLES (or OPTIONS): {unknown}"


# -- the size parser, by property -----------------------------------------------------------

unit_names = st.sampled_from(sorted(UNITS))


@given(st.integers(min_value=0, max_value=MAX_BYTES), unit_names)
def test_exact_format_then_parse_round_trips(nbytes, unit):
    """Any byte count written exactly in any unit (``0.0009765625 KiB`` is 1 byte) parses back."""
    text = exact_decimal(Fraction(nbytes, UNITS[unit])) + unit
    assert config.parse_size(text, "X") == nbytes


@given(st.integers(min_value=0, max_value=MAX_BYTES))
def test_humanfriendly_format_then_parse(nbytes):
    """What humanfriendly prints (rounded to 2 decimals) parses to nearly the same bytes, or is
    refused as fractional: never silently truncated."""
    for binary in (True, False):
        text = humanfriendly.format_size(nbytes, binary=binary)
        try:
            parsed = config.parse_size(text, "X")
        except ConfigError as err:
            assert "is not a whole number of bytes" in str(err) or "above the largest size" in str(err), str(err)
            continue
        assert abs(parsed - nbytes) <= 0.006 * nbytes, (text, parsed, nbytes)


@given(st.integers(min_value=0, max_value=2**70), st.integers(min_value=1, max_value=12), unit_names)
def test_fractional_bytes_are_always_refused(whole, halvings, unit):
    nbytes = Fraction(2 * whole + 1, 2**halvings)  # never a whole number of bytes
    text = exact_decimal(nbytes / UNITS[unit]) + unit
    message = one_line_error(config.parse_size, text, "NUMBA_POOL_INITIAL_SIZE")
    assert message.startswith(f"NUMBA_POOL_INITIAL_SIZE={text!r} is not a whole number of bytes"), message


@given(st.integers(min_value=0, max_value=MAX_BYTES), unit_names)
def test_size_with_unit_scales_exactly(n, unit):
    if n * UNITS[unit] > MAX_BYTES:
        assert "above the largest size" in one_line_error(config.parse_size, f"{n}{unit}", "X")
    else:
        assert config.parse_size(f"{n}{unit}", "X") == n * UNITS[unit]


@given(st.integers(min_value=0, max_value=MAX_BYTES))
def test_python_ints_pass_through(n):
    assert config.parse_size(n, "install(initial_size)") == n


@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_BYTES + 1)))
def test_ints_out_of_range_are_refused(n):
    message = one_line_error(config.parse_size, n, "install(initial_size)")
    assert message.startswith(f"install(initial_size)={n}")


def test_the_default_pool_is_not_exportable():
    # IPC is on by default, off with the device's default pool; asked for with it, refused.
    assert config.load(environ={"NUMBA_POOL_USE_DEFAULT_POOL": "1"}).ipc is False
    assert config.load(environ={}).ipc is True
    with pytest.raises(config.ConfigError) as caught:
        config.load(environ={"NUMBA_POOL_USE_DEFAULT_POOL": "1", "NUMBA_POOL_IPC": "1"})
    message = str(caught.value)
    assert message.startswith("NUMBA_POOL_IPC='1' asks for an exportable pool, but NUMBA_POOL_USE_DEFAULT_POOL='1'")
    assert "\n" not in message


def test_log_path_from_the_environment_loses_surrounding_spaces(tmp_path):
    loaded = config.load(environ={"NUMBA_POOL_LOG": f" {tmp_path}/alloc.csv "})
    assert loaded.log == str(tmp_path / "alloc.csv")


def test_describe_says_small_sizes_once():
    described = config.load(environ={}).describe()
    assert described["initial size"] == "0 bytes"
    assert config.load(environ={"NUMBA_POOL_INITIAL_SIZE": "1MiB"}).describe()["initial size"] == "1 MiB (1048576 bytes)"
