"""OLDFUZZ (new file): fail fast unless the old package under /tmp/oldfuzz is the one imported."""
import os
import numba_pool

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
assert os.path.abspath(numba_pool.__file__).startswith(HERE + os.sep), numba_pool.__file__


def pytest_report_header(config):
    return f"numba_pool under test: {numba_pool.__file__}"
