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
    assert "`numba-pool-tools snapshot summarize snap.pickle`" in readme.replace("\n", " ")
    assert "made on a GPU: `docs/sample-snapshot.pickle`" in readme.replace("\n", " ")


def test_a_snapshot_made_without_a_gpu_is_summarized_as_the_readme_says(tmp_path):
    import subprocess
    import sys
    demo = Path(PACKAGE_PARENT) / "tests" / "cuda_model" / "snapshot_demo.py"
    made = subprocess.run([sys.executable, str(demo), str(tmp_path / "snap.pickle")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert made.returncode == 0 and "wrote" in made.stdout, made.stderr[-2000:]
    result = CliRunner().invoke(main, ["snapshot", "summarize", str(tmp_path / "snap.pickle")])
    assert result.exit_code == 0, result.output
    assert "snapshot_demo.py:27" in result.output and "4194304 bytes" in result.output, result.output
    assert "python tests/cuda_model/snapshot_demo.py" in (Path(PACKAGE_PARENT) / "README.md").read_text()
