"""Observing a device's memory: what numba_pool counts and reports, off the hot path unless asked for.

* :mod:`.statistics`: :class:`~numba_pool.observe.statistics.PoolStatistics` and its collection;
* :mod:`.summary`: the printable table of :func:`numba_pool.memory_summary`;
* :mod:`.scopes`: ``numba_pool.statistics()`` scopes and their counting adaptor;
* :mod:`.alloclog`: the allocation log (RMM's CSV format) and its logging adaptor."""
