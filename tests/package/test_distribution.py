"""What the installed distribution requires: no Numba CUDA frontend by itself, one per extra
(``numba-pool[numba-cuda]``, ``numba-pool[mlir]``), so that a Numba-CUDA-MLIR user installs
numba-pool without numba.  Read from the installed metadata (``importlib.metadata``), which is
what pip resolved: CI installs the checkout with its test extra first."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
from packaging.requirements import Requirement

import numba_pool

FRONTEND_DISTRIBUTIONS = {"numba", "numba-cuda", "numba-cuda-mlir"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def requirements() -> dict[str | None, list[Requirement]]:
    """The installed numba-pool's requirements by extra (None: always)."""
    dist = importlib.metadata.distribution("numba-pool")
    assert dist.version == numba_pool.__version__
    by_extra: dict = {None: []}
    for line in dist.requires or []:
        req = Requirement(line)
        extra = None
        if req.marker is not None:
            found = re.search(r'extra\s*==\s*"([^"]+)"', str(req.marker))
            extra = _canonical(found[1]) if found else None
        by_extra.setdefault(extra, []).append(req)
    by_extra["provided"] = [_canonical(e) for e in dist.metadata.get_all("Provides-Extra") or []]
    return by_extra


def names(reqs) -> set[str]:
    return {_canonical(r.name) for r in reqs}


def test_the_core_requires_no_frontend(requirements):
    assert names(requirements[None]) & FRONTEND_DISTRIBUTIONS == set()
    assert {"numpy", "cuda-bindings"} <= names(requirements[None])


def test_each_frontend_has_its_extra(requirements):
    assert {"numba-cuda", "mlir"} <= set(requirements["provided"])
    numba_cuda = {_canonical(r.name): r for r in requirements["numba-cuda"]}
    assert {"numba", "numba-cuda"} <= set(numba_cuda) and "cu13" in numba_cuda["numba-cuda"].extras
    assert not numba_cuda["numpy"].specifier.contains("2.5.0")  # numba-cuda 0.30 breaks on numpy 2.5
    mlir = {_canonical(r.name): r for r in requirements["mlir"]}
    assert set(mlir) == {"numba-cuda-mlir"} and "cu13" in mlir["numba-cuda-mlir"].extras
    assert names(requirements["mlir"]) & {"numba", "numba-cuda"} == set()


def test_the_test_extra_has_both_frontends(requirements):
    # CI runs the CPU tests, the model and the fuzzer on both frontends' classes.
    assert {"numba-cuda", "numba-cuda-mlir"} <= names(requirements["test"])
