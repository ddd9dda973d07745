"""Source-checkout shim for ``numba_pool.kernels`` (never installed: setup.cfg maps that package
to the top-level ``kernels/`` folder, so this folder is not part of a wheel).

From inside a checkout, ``python -m numba_pool.kernels.sqrt`` imports ``numba_pool`` from the
checkout (the current directory comes first on ``sys.path``), and the checkout's ``numba_pool/``
had no ``kernels``: the import failed unless an editable install's finder stepped in.  This
module makes the package's path the checkout's ``kernels/`` folder and runs its ``__init__``.
"""

import os as _os

__path__ = [_os.path.join(_os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))), "kernels")]
_init = _os.path.join(__path__[0], "__init__.py")
with open(_init) as _f:
    exec(compile(_f.read(), _init, "exec"))
del _f, _init
