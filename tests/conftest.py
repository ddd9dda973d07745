"""Shared test set-up.

GPU tests carry the ``gpu`` marker and are skipped when the frontend under test
(``helpers.FRONTEND``: ``NUMBA_POOL_FRONTEND``, else numba-cuda when installed) sees no GPU.
When a GPU is there, numba_pool is installed as that frontend's memory manager before any
context exists, with the options of the ``NUMBA_POOL_*`` environment (so ``NUMBA_POOL_ARENA=1
pytest`` runs the same GPU tests in arena mode, ``NUMBA_POOL_FRONTEND=mlir pytest`` under
Numba-CUDA-MLIR).  Helpers that tests import live in ``helpers.py``.

The ``frontend_name`` fixture runs a test once per frontend (``"numba-cuda"``, ``"mlir"``); a
frontend that is not installed is skipped with the reason, never left out silently.
"""

from __future__ import annotations

import pytest

import numba_pool
from helpers import FRONTEND, FRONTENDS, GPU, MISSING_FRONTENDS
from numba_pool.cuda import frontend as frontends

if GPU:
    numba_pool.install(frontend=FRONTEND.name)


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.skipif(name not in FRONTENDS,
                                                                     reason=MISSING_FRONTENDS.get(name, "")))
                        for name in frontends.NAMES])
def frontend_name(request) -> str:
    """Each frontend's name in turn (skipped, with the reason, where it is not installed)."""
    return request.param


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU ({frontends.PACKAGES[FRONTEND.name]}.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
