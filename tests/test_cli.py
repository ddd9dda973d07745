"""The command line on a machine without a GPU and with bad configuration: one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import GPU, PACKAGE_PARENT


def numba_pool_cli(*args, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "numba_pool", *args], env=full_env, cwd=PACKAGE_PARENT,
                          capture_output=True, text=True)


@pytest.mark.parametrize("command", ["info", "bench"])
def test_bad_configuration_is_one_clear_line_and_exit_2(command):
    proc = numba_pool_cli(command, env={"NUMBA_POOL_INITIAL_SIZE": "a lot"})
    assert proc.returncode == 2
    assert "NUMBA_POOL_INITIAL_SIZE='a lot' is not a size" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(GPU, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("command", ["info", "bench"])
def test_without_gpu_one_line_and_exit_2(command):
    proc = numba_pool_cli(command)
    assert proc.returncode == 2
    assert "no CUDA GPU is available" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_help_lists_the_commands():
    proc = numba_pool_cli("--help")
    assert proc.returncode == 0
    for command in ("bench", "info"):
        assert command in proc.stdout
