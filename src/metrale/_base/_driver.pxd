# The one error path of CUDA driver calls (_cuda.pyx, _vmm.pyx): every call is
#     with nogil: check(cydriver.cuXxx(...), "cuXxx")
# as cuda.core's HANDLE_RETURN; a failure raises MetraleError (OutOfMemoryError
# for CUDA_ERROR_OUT_OF_MEMORY) naming the call and the driver's error.
from cuda.bindings cimport cydriver


cdef inline str error_name(cydriver.CUresult err):
    """The driver's name of `err` ("CUDA_ERROR_OUT_OF_MEMORY")."""
    cdef const char *name = NULL
    if cydriver.cuGetErrorName(err, &name) == cydriver.CUDA_SUCCESS and name != NULL:
        return name.decode()
    return f"CUresult {<int>err}"


cdef inline int raise_error(cydriver.CUresult err, const char *call, const char *what,
                            long long nbytes, bint oom) except -1 with gil:
    """Raise for `err` of `call`: "call(nbytes bytes, what): NAME"; OutOfMemoryError
    for an out-of-memory error or when `oom`, else MetraleError."""
    from metrale._base.errors import MetraleError, OutOfMemoryError
    args = [f"{nbytes} bytes"] if nbytes >= 0 else []
    if what != NULL:
        args.append(what.decode())
    msg = call.decode() + (f"({', '.join(args)})" if args else "") + ": " + error_name(err)
    if oom or err == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
        raise OutOfMemoryError(msg)
    raise MetraleError(msg)


cdef inline int check(cydriver.CUresult err, const char *call, const char *what=NULL,
                      long long nbytes=-1) except -1 nogil:
    """0 when `err` is CUDA_SUCCESS, else raise (taking the GIL) naming `call`,
    the detail `what` and the byte count `nbytes` (when >= 0)."""
    if err == cydriver.CUDA_SUCCESS:
        return 0
    return raise_error(err, call, what, nbytes, False)
