"""The Numba EMM plugin: :mod:`.manager` (``NumbaPoolManager``), :mod:`.path` (its allocation path), :mod:`.state`,
:mod:`.settings` (process state, configuration), host/managed memory objects, :mod:`.api` (public functions)."""
