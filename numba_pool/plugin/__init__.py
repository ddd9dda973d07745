"""The Numba EMM plugin: :mod:`.manager` (the thin ``NumbaPoolManager``), :mod:`.path` (its composed
allocation path), :mod:`.state` and :mod:`.settings` (the process's state and configuration), the host and
managed memory objects, and :mod:`.api` (the public functions, re-exported by :mod:`numba_pool`)."""
