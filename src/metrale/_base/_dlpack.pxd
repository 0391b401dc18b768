# The DLPack structs (dlpack.h): the unversioned ABI of v0.8 and the versioned
# one of v1.x, declared once, for the modules that export memory through
# __dlpack__.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void *data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void (*deleter)(DLManagedTensor *) noexcept nogil

cdef struct DLPackVersion:
    uint32_t major
    uint32_t minor

# v1.x: the capsule is named "dltensor_versioned"; flags bit 0 = read-only,
# bit 1 = a copy made by the producer.
cdef struct DLManagedTensorVersioned:
    DLPackVersion version
    void *manager_ctx
    void (*deleter)(DLManagedTensorVersioned *) noexcept nogil
    uint64_t flags
    DLTensor dl_tensor
