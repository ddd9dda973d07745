"""The README, checked where it can go wrong: its length, that every measured figure names
its device and date, that its configuration table lists every option, that its links lead
somewhere, and that its install and test commands are the ones that work from a checkout
(the GPU half, running its commands, is ``tests/gpu/test_gpu_readme.py``)."""

from __future__ import annotations

import os
import re

import pytest

from helpers import REPO
from numba_pool import config
from readme_text import blocks, code_blocks, section, text

#: A measured figure: microseconds, a ratio ("3.1×"), or a table cell "run 1 / run 2".
FIGURE = re.compile(r"\d(?:\.\d+)? ?µs|\d(?:\.\d+)?×|\d\.\d+ / \d")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
DEVICE = re.compile(r"\b[HA]\d00\b")


def test_the_readme_is_short():
    assert len(text().splitlines()) < 300


def test_every_figure_names_its_device_and_date():
    """A block with a figure names a device and a date, or the block just before it does (a
    table and the sentence that introduces it)."""
    parts = blocks()
    for i, block in enumerate(parts):
        if not FIGURE.search(block):
            continue
        context = block + "\n" + (parts[i - 1] if i else "")
        assert DATE.search(context) and DEVICE.search(context), f"a figure without device and date:\n{block}"


def test_the_configuration_table_lists_every_option_with_its_default():
    table = section("Configuration")
    for name, (variable, _parser) in config.OPTIONS.items():
        row = next((line for line in table.splitlines() if line.startswith(f"| `{variable}` |")), None)
        assert row, f"{variable} is missing from the README's configuration table"
    for variable, default in [("NUMBA_POOL_ARENA_MAX_BLOCK", config.DEFAULT_ARENA_MAX_BLOCK),
                              ("NUMBA_POOL_ARENA_SLAB_SIZE", config.DEFAULT_ARENA_SLAB_SIZE)]:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{variable}` |"))
        written = row.split("|")[2].strip().strip("`")
        assert config.parse_size(written, variable) == default, row


def test_the_sizes_the_readme_shows_parse_as_it_says():
    sizes = next(line for line in section("Configuration").split("\n- ") if line.startswith("**Sizes**"))
    accepted = sizes[sizes.index("(`1048576`"):sizes.index("Not accepted")]
    refused = sizes[sizes.index("Not accepted"):sizes.index("A cap given")]
    for example in re.findall(r"`([^`]+)`", accepted):
        if example not in ("Mb", "Gb"):
            assert config.parse_size(example, "README") >= 0, example
    for example in re.findall(r"`([^`]+)`", refused):
        with pytest.raises(config.ConfigError):
            config.parse_size(example, "README")
    for bits in ("64 Mb", "1 Gb"):
        with pytest.raises(config.ConfigError, match="reads as bits"):
            config.parse_size(bits, "README")


def test_install_and_test_commands_work_from_a_checkout():
    install = "\n".join(code_blocks("Install", "bash"))
    assert "pip install numba-pool" not in text()  # not on PyPI
    for extra in ("numba-cuda", "mlir"):  # one line per frontend (tests/package/test_distribution.py)
        assert re.search(rf'^pip install "\.\[{extra}\]"\s', install, re.M), extra
    assert "plain `pip install .`" in text()
    (tests,) = [block for block in code_blocks("Two commands", "bash") if "pytest" in block]
    assert tests.strip() == 'pip install ".[test]" && pytest'
    with open(os.path.join(REPO, ".ci", "run")) as f:
        ci = f.read()
    assert '".[test]"' in ci and re.search(r"^pytest\b", ci, re.M)  # CI runs the same command


@pytest.mark.parametrize("document", ["README.md", "CONTRIBUTING.md", "docs/guide.md", "docs/benchmarks.md",
                                      "docs/architecture.md", "docs/perf-notes.md"])
def test_links_lead_to_files_and_headings(document):
    with open(os.path.join(REPO, document), encoding="utf-8") as f:
        prose = re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)
    folder = os.path.dirname(os.path.join(REPO, document))
    for target in re.findall(r"\]\(((?!https?:)[^)]+)\)", prose):
        path, _, anchor = target.partition("#")
        full = os.path.join(folder, path) if path else os.path.join(REPO, document)
        assert os.path.exists(full), f"{document}: {target}"
        if anchor:
            with open(full, encoding="utf-8") as f:
                headings = [re.sub(r"[^\w\- ]", "", line.lstrip("#").strip()).lower().replace(" ", "-")
                            for line in f if line.startswith("#")]
            assert anchor in headings, f"{document}: {target}"
