# The failures a testing backend is armed with (testing.pyx), for the CUDA one
# (_faulty_cuda.pyx) to share.

cdef class Faults:
    cdef dict _faults             # kind -> which next operation fails
    cdef dict _calls              # kind -> [which next operation, the callable]

    # Arm (TypeError / ValueError naming `op`, `fn` or `nth`), disarm.
    cdef int arm(self, object op, object nth) except -1
    cdef int arm_call(self, object op, object fn, object nth) except -1
    cdef int clear(self) except -1
    # Whether this operation of kind `op` fails (an armed call made first).
    cdef bint fails(self, str op) except -1
    # Raise as a backend would when it fails: OutOfMemoryError for what
    # allocates or maps, MetraleError otherwise; `what` says what failed.
    cdef int check(self, str op, str what) except -1
