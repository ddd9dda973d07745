"""numba-pool's tools, beside the library (the ``numba-pool-tools`` distribution in ``tools/``):
the benchmark (:mod:`~numba_pool_tools.bench`), the offline replay of an allocation log
(:mod:`~numba_pool_tools.replay`), the snapshot readers (:mod:`~numba_pool_tools.snapshot`) and
their command line, ``numba-pool-tools`` (:mod:`~numba_pool_tools.cli`; also ``python -m
numba_pool_tools``).

They use the library, ``numba_pool``, and the library never imports them (setup.cfg's import
contracts).  From a checkout: ``pip install -e ./tools``.
"""

__version__ = "0.1.0"
