"""The snapshot the docs ship for a newcomer without a GPU (``docs/sample-snapshot.pickle``, README "Two
commands", issue 36): the snapshot commands read it as documented."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from helpers import PACKAGE_PARENT
from numba_pool_tools.cli import main

SAMPLE = Path(PACKAGE_PARENT) / "docs" / "sample-snapshot.pickle"


def test_the_shipped_sample_snapshot_is_summarized():
    result = CliRunner().invoke(main, ["snapshot", "summarize", str(SAMPLE)])
    assert result.exit_code == 0, result.output
    assert "kernels/sqrt.py:41" in result.output and "12582912 bytes" in result.output, result.output


def test_the_readme_names_the_sample_snapshot():
    readme = (Path(PACKAGE_PARENT) / "README.md").read_text()
    assert "numba-pool-tools snapshot summarize\ndocs/sample-snapshot.pickle" in readme or \
        "snapshot summarize docs/sample-snapshot.pickle" in readme.replace("\n", " ")
