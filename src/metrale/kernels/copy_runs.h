/* The parameter block of metrale_copy_runs (copy_runs.cu), passed by value:
 * declared once here for the kernel and the CUDA backend (_kernels.pyx).
 * Run r owns blocks [first[r], first[r + 1]); each of its blocks copies `per`
 * 16-byte chunks of it, its last block also the length % 16 bytes after them. */
#ifndef METRALE_COPY_RUNS_H
#define METRALE_COPY_RUNS_H

/* Runs of one launch: the block stays under the 4 KiB a kernel's parameters
 * may take on every GPU metrale supports (3,600 bytes). */
#define MT_COPY_RUNS 128

/* One copy: `length` bytes from `src` to `dst` (device addresses). */
typedef struct mt_copy_run {
    unsigned long long dst;
    unsigned long long src;
    unsigned long long length;
} mt_copy_run;

typedef struct mt_copy_args {
    unsigned long long dst[MT_COPY_RUNS];       /* each 16-byte aligned */
    unsigned long long src[MT_COPY_RUNS];       /* each 16-byte aligned */
    unsigned long long length[MT_COPY_RUNS];
    unsigned int first[MT_COPY_RUNS + 1];
    unsigned int per;
    int count;
} mt_copy_args;

#endif
