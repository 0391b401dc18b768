# Argument checks shared by every module: one rule for integers, streams,
# element types, buffer names and serving limits.
from libc.stdint cimport uint64_t, uintptr_t

cdef enum:
    # ndim limit of views: numpy 1.x's NPY_MAXDIMS, within DLPack's int32 and numpy 2's 64
    MT_MAX_NDIM = 32

cdef object index_arg(object value, str name, uint64_t minimum=*, uint64_t maximum=*)
cdef uint64_t u64_arg(object value, str name, uint64_t minimum=*, uint64_t maximum=*) except? 0
cdef uintptr_t as_stream(object stream) except? 0
# (name, array-interface typestr, DLPack type code, bits) of a dtype argument.
cdef tuple dtype_info(object dtype)
# The ids in the BufferSet `buffers` of `names` (a name or an iterable of
# names), each once, in the order given; TypeError / ValueError naming the
# argument `arg` otherwise.
cdef list buffer_ids(object names, str arg, object buffers)
# The four serving limits of a SizingLimits, in the order of
# BufferSizes.from_config.
cdef tuple limit_tuple(object lim)
# A limit given with sizes: None takes the one `lim` records (required when
# `lim` is None); given, it must equal it (ValueError naming both).
cdef object limit_arg(object value, str name, uint64_t minimum, object lim, str where=*)
# The limits `reserve` (a 4-tuple, or a dict where a missing key means the
# current limit) asks for, each converted and >= its entry in `limits`.
cdef tuple reserve_limits(object reserve, tuple limits)
# The "metrale" logger.
cdef object logger()

cdef extern from *:
    """
    static int mt_py_finalizing(void) {
    #if PY_VERSION_HEX >= 0x030D0000
        return Py_IsFinalizing();
    #else
        return _Py_IsFinalizing();
    #endif
    }
    """
    # True once the interpreter is shutting down: finalizers then import
    # nothing and skip what needs the runtime (a driver, the warnings module).
    bint mt_py_finalizing()
