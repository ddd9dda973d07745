"""The package's one compiled module, optional (``numba_pool/cuda/_native.pyx``: the hot paths' driver calls, Note
[Compiled driver calls] in ``numba_pool/cuda/driver.py``, and PyTorch's allocator callbacks).  Without Cython or a C
compiler the install goes on without it, and numba_pool calls cuda-python's functions and ``ctypes`` callbacks.
Everything else is in setup.cfg."""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # a build without isolation and without Cython
    extensions = []
else:
    extensions = cythonize([Extension("numba_pool.cuda._native", ["numba_pool/cuda/_native.pyx"], optional=True)],
                           compiler_directives={"language_level": 3}, quiet=True)
setup(ext_modules=extensions)
