# Declarations of src/peer.h and kernels/peer_reduce.h (the tensor-parallel
# all-reduce of BufferArena.peer_all_reduce).
cdef extern from "peer.h" nogil:
    enum:
        MT_RED_MAX_RANKS
        MT_RED_MAX_ITEMS
        MT_RED_BLOCKS
        MT_RED_THREADS
        MT_RED_TIMEOUT
    size_t MT_RED_STATUS_OFFSET

    ctypedef struct mt_signal:
        unsigned int status

    ctypedef struct mt_reduce_args:
        unsigned long long base[MT_RED_MAX_RANKS]
        unsigned long long signal[MT_RED_MAX_RANKS]
        unsigned long long in_off[MT_RED_MAX_ITEMS]
        unsigned long long out_off[MT_RED_MAX_ITEMS]
        unsigned long long row_bytes[MT_RED_MAX_ITEMS]
        unsigned long long rows[MT_RED_MAX_ITEMS]
        unsigned long long count_at
        unsigned long long timeout_ns
        long long count
        unsigned char elem[MT_RED_MAX_ITEMS]
        int ranks
        int me
        int items
        int blocks

    unsigned int mt_peer_reduce_host(const mt_reduce_args *a)
