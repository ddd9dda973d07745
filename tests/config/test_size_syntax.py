"""One size syntax in every entry point (:mod:`numba_pool.config.sizes` states it): the
environment, ``install()`` keywords, the ``numba-pool-tools replay`` options and the Python
``replay()`` API accept and refuse the same spellings, with one line naming the culprit.

Also the pool cap's rule for small caps (:func:`numba_pool.config.parse_max_size`): below 1 MiB as
a bare number, or below 1 % as a fraction, whatever the spelling."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from numba_pool_tools import replay as offline_replay
from numba_pool_tools.cli import main
from numba_pool.config import ConfigError, load

#: These tests parse the arena's and caches' options with those off: the warning that says so is tested on its own.
pytestmark = pytest.mark.filterwarnings("ignore:.* has no effect. .* is off:numba_pool.config.ConfigWarning")

#: (spelling, bytes) accepted everywhere; every value is a multiple of 256 bytes, so that the
#: arena's options take it too.
ACCEPTED = [
    ("1048576", 1 << 20), ("1 MiB", 1 << 20), ("1MiB", 1 << 20), (" 1 mib ", 1 << 20), ("1 MIB", 1 << 20),
    ("1.5 MiB", 3 << 19), ("4 MB", 4_000_000), ("4 mb", 4_000_000), ("512 kB", 512_000), ("512 KB", 512_000),
    ("0.25 MiB", 1 << 18), ("1048576 B", 1 << 20), ("1048576 bytes", 1 << 20),
]
#: (spelling, what the one-line error must say) refused everywhere.
REFUSED = [
    ("1_048_576", "is not a size"), ("1,048,576", "is not a size"), ("+1048576", "is not a size"),
    ("1e6", "is not a size"), ("0x100000", "is not a size"), ("1 Mb", "reads as bits: write MB or MiB"),
    ("8 Gb", "reads as bits: write GB or GiB"), ("1 MiBs", "unknown unit"), ("-1 MiB", "is negative"),
    ("1.1 KiB", "is not a whole number of bytes"), ("lots", "is not a size"),
]


def env_size(text: str) -> int:
    return load({"NUMBA_POOL_ARENA_SLAB_SIZE": text}).arena_slab_size


def install_size(text: str) -> int:
    return load({}, arena_slab_size=text).arena_slab_size


def replay_api_size(text: str) -> int:
    log = offline_replay.parse_log(["Thread,Time,Action,Pointer,Size,Stream", "1,t,allocate,0x10,256,0x0",
                                    "1,t,free,0x10,256,0x0"])
    return offline_replay.replay(log, slab_size=text, max_block=256).slab_size


def cli_size(text: str, tmp_path) -> int:
    """The slab size ``numba-pool-tools replay --slab-size TEXT`` replays with (its plot's title),
    or the CLI's one-line error as a ConfigError."""
    log = tmp_path / "log.csv"
    log.write_text("Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,256,0x0\n1,t,free,0x10,256,0x0\n")
    seen = {}
    real = offline_replay.replay

    def spy(log, **options):
        seen.update(options)
        return real(log, **options)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(offline_replay, "replay", spy)
        result = CliRunner().invoke(main, ["replay", str(log), "--slab-size", text, "--max-block", "256"])
    if result.exit_code:
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
        raise ConfigError(result.output.strip())
    return seen["slab_size"]


ENTRY_POINTS = {"environment": lambda text, tmp: env_size(text), "install()": lambda text, tmp: install_size(text),
                "replay()": lambda text, tmp: replay_api_size(text), "numba-pool-tools replay": cli_size}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("text, nbytes", ACCEPTED)
def test_every_entry_point_accepts_the_same_sizes(entry, text, nbytes, tmp_path):
    assert ENTRY_POINTS[entry](text, tmp_path) == nbytes


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("text, problem", REFUSED)
def test_every_entry_point_refuses_the_same_sizes_in_one_line(entry, text, problem, tmp_path):
    with pytest.raises(ConfigError) as err:
        ENTRY_POINTS[entry](text, tmp_path)
    message = str(err.value)
    assert problem in message and repr(text) in message and "\n" not in message


def test_the_replay_api_takes_all_as_keep_every_slab():
    log = offline_replay.parse_log(["Thread,Time,Action,Pointer,Size,Stream", "1,t,allocate,0x10,256,0x0"])
    assert offline_replay.replay(log, release_threshold="all").release_threshold is None
    assert offline_replay.replay(log, release_threshold="4 MiB").release_threshold == 4 << 20


def test_the_replay_api_names_its_parameter():
    log = offline_replay.parse_log(["Thread,Time,Action,Pointer,Size,Stream", "1,t,allocate,0x10,256,0x0"])
    with pytest.raises(ValueError, match=r"^max_block='64 Kb' has the unit 'Kb', which reads as bits"):
        offline_replay.replay(log, max_block="64 Kb")


# -- small pool caps: one rule, whatever the spelling -------------------------------------------

@pytest.mark.parametrize("text, problem", [
    ("0.0000000000001", "under 1 %"), ("0.001%", "under 1 %"), ("0.009", "under 1 %"), ("0.5%", "under 1 %"),
    ("0", "capped at 0 bytes"), ("0%", "not a fraction of device memory in (0, 1]"),
    ("1", "did you mean '1.0' (100 %) or '1 MiB'"), ("4096", "a cap below 1 MiB needs its unit"),
])
def test_small_caps_are_refused_whatever_the_spelling(text, problem):
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("%", "%")):
        load({"NUMBA_POOL_MAX_SIZE": text})


@pytest.mark.parametrize("value, expected", [("1%", 0.01), ("0.01", 0.01), ("512 KiB", 512 << 10), ("4096 B", 4096),
                                             (np.float32(0.5), 0.5), (np.float64(0.25), 0.25), (0.5, 0.5)])
def test_caps_at_or_above_the_rule_and_numpy_fractions_are_taken(value, expected):
    assert load({}, max_size=value).max_size == expected


def test_a_numpy_fraction_out_of_range_is_named_as_a_fraction():
    with pytest.raises(ConfigError, match=r"install\(max_size\)=np.float32\(1.5\) is not a fraction"):
        load({}, max_size=np.float32(1.5))
