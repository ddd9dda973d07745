"""``numba-pool bench``: the benchmark (placeholder docstring, rewritten when the package is split)."""
