"""Integrations of numba_pool with other frameworks: :mod:`.dask` (a Dask worker plugin)."""
