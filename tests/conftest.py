"""Shared test set-up.

GPU tests carry the ``gpu`` marker and are skipped when ``numba.cuda.is_available()`` is false.
When a GPU is there, numba_pool is installed as Numba's memory manager before any context
exists, with the options of the ``NUMBA_POOL_*`` environment (so ``NUMBA_POOL_ARENA=1 pytest``
runs the same GPU tests in arena mode).  Helpers that tests import live in ``helpers.py``.
"""

from __future__ import annotations

import pytest

import numba_pool
from helpers import GPU

if GPU:
    numba_pool.install()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (numba.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
