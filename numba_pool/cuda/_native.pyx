# cython: language_level=3, binding=False
"""numba_pool's compiled module (optional; setup.py): the hot paths' driver calls, twins of cuda-python's
(Note [Compiled driver calls] in :mod:`.driver`; they take what the hot paths pass, ``CUstream`` and ``CUdeviceptr``
objects or ints), and the C callbacks PyTorch's pluggable allocator calls."""

from cpython.long cimport PyLong_AsUnsignedLongLong, PyLong_AsVoidPtr

ctypedef int (*IsCapturing)(void*, int*) noexcept nogil
ctypedef int (*FreeAsync)(unsigned long long, void*) noexcept nogil
ctypedef int (*GetId)(void*, unsigned long long*) noexcept nogil

cdef IsCapturing _is_capturing = NULL
cdef FreeAsync _free_async = NULL
cdef GetId _get_id = NULL
cdef object _result = None, _status = None  # cuda-python's CUresult and CUstreamCaptureStatus
cdef tuple _ok_none = None, _ok = None  # (CUDA_SUCCESS, CU_STREAM_CAPTURE_STATUS_NONE), (CUDA_SUCCESS,)
cdef object _malloc = None, _free = None  # PyTorch's callbacks' Python ends


def bind(size_t is_capturing, size_t free_async, size_t get_id, result, status, tuple not_capturing):
    """Take the entry points (``cuGetProcAddress``'s addresses), cuda-python's two enums and the capture query's
    answer for a stream not capturing (returned itself)."""
    global _is_capturing, _free_async, _get_id, _result, _status, _ok_none, _ok
    _result, _status, _ok_none, _ok = result, status, not_capturing, (result(0),)
    _is_capturing, _free_async = <IsCapturing><void*>is_capturing, <FreeAsync><void*>free_async
    _get_id = <GetId><void*>get_id


cdef _unbound():
    raise RuntimeError("numba_pool.cuda._native: no driver entry points bound (numba_pool.cuda.driver.hot binds them)")


def cuStreamIsCapturing(stream):
    """cuda-python's ``cuStreamIsCapturing(stream)``: ``(CUresult, CUstreamCaptureStatus or None)``."""
    if _is_capturing == NULL:
        _unbound()
    cdef void* handle = PyLong_AsVoidPtr(int(stream))
    cdef int status = 0, err
    with nogil:
        err = _is_capturing(handle, &status)
    if err:
        return (_result(err), None)
    return _ok_none if status == 0 else (_ok_none[0], _status(status))


def cuMemFreeAsync(pointer, stream):
    """cuda-python's ``cuMemFreeAsync(pointer, stream)``: ``(CUresult,)``."""
    if _free_async == NULL:
        _unbound()
    cdef unsigned long long address = PyLong_AsUnsignedLongLong(int(pointer))
    cdef void* handle = PyLong_AsVoidPtr(int(stream))
    cdef int err
    with nogil:
        err = _free_async(address, handle)
    return (_result(err),) if err else _ok


def cuStreamGetId(stream):
    """cuda-python's ``cuStreamGetId(stream)``: ``(CUresult, int or None)``."""
    if _get_id == NULL:
        _unbound()
    cdef void* handle = PyLong_AsVoidPtr(int(stream))
    cdef unsigned long long stream_id = 0
    cdef int err
    with nogil:
        err = _get_id(handle, &stream_id)
    return (_result(err), None) if err else (_ok[0], stream_id)


cdef void* _torch_malloc(size_t size, int device, void* stream) noexcept with gil:
    try:
        address = _malloc(size, device, <size_t>stream)
        return NULL if address is None else PyLong_AsVoidPtr(address)
    except BaseException:  # the Python end never raises; nothing may cross into PyTorch
        return NULL


cdef void _torch_free(void* pointer, size_t size, int device, void* stream) noexcept with gil:
    try:
        _free(<size_t>pointer, size, device, <size_t>stream)
    except BaseException:  # as above
        pass


def torch_callbacks(malloc, free):
    """The addresses of ``malloc(size, device, stream)`` and ``free(pointer, size, device, stream)`` C functions
    (``torch._C._cuda_customAllocator``'s) calling these Python functions with ints (a null pointer as 0); a None
    from ``malloc`` is a null pointer."""
    global _malloc, _free
    _malloc, _free = malloc, free
    return <size_t><void*>_torch_malloc, <size_t><void*>_torch_free
