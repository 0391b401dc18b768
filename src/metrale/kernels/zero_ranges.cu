// One launch that zeroes up to 18 byte ranges of the arena slab (zero_all_rows).
// The ranges travel by value in the kernel parameters, so a captured CUDA graph
// replays exactly the ranges of the call that was captured.
// Build the shipped PTX with:  nvcc -ptx -arch=compute_75 zero_ranges.cu -o zero_ranges.ptx
#define MT_MAX_RANGES 18

struct mt_zero_args {
    unsigned long long base;
    unsigned long long offset[MT_MAX_RANGES];
    unsigned long long length[MT_MAX_RANGES];
    int count;
};

extern "C" __global__ void metrale_zero_ranges(const mt_zero_args a)
{
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (int r = 0; r < a.count; r++) {
        // Every range starts at a 256-byte aligned buffer offset: 16-byte stores,
        // then the tail of at most 15 bytes one byte at a time.
        unsigned char *p = (unsigned char *)(a.base + a.offset[r]);
        const unsigned long long n = a.length[r];
        const unsigned long long vec = n / 16;
        uint4 *q = (uint4 *)p;
        for (unsigned long long i = tid; i < vec; i += stride)
            q[i] = make_uint4(0, 0, 0, 0);
        const unsigned long long tail = n - vec * 16;
        if (tid < tail)
            p[vec * 16 + tid] = 0;
    }
}
