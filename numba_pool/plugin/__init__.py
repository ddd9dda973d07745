"""The Numba EMM plugin: numba_pool as Numba's memory manager, and the public functions that
reach a device's manager.

* :mod:`.state`: the process state, one object (the managers, the configuration in effect,
  the recording, the open scopes' count, the observers, the IPC lease queue);
* :mod:`.settings`: the configuration in effect for the process (``install()`` or the
  environment);
* :mod:`.path`: the one place a device's allocation path is composed (block source, then the
  adaptors);
* :mod:`.host_memory`: the pinned and mapped host memory objects handed to Numba;
* :mod:`.manager`: :class:`~numba_pool.plugin.manager.NumbaPoolManager`, the thin EMM plugin;
* :mod:`.api`: ``install()``, ``stats()``, ``trim()``, ``scratch()`` ... (re-exported by
  :mod:`numba_pool`).
"""
