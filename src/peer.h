/* metrale C core, the tensor-parallel all-reduce on the host
 * (BufferArena.peer_all_reduce on HostBackend): what the kernel of
 * src/metrale/kernels/peer_reduce.cu computes, to the bit, run by the calling
 * thread over memory every rank maps (memfd pages), the barriers on the
 * signal areas' flags with C11-style atomics.  Plain C, no Python
 * (src/metrale/_base/_peer_core.pxd mirrors this header). */
#ifndef METRALE_PEER_H
#define METRALE_PEER_H

#include "metrale/kernels/peer_reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Run the reduction of `a` (a->blocks must be 1; the count is read from
 * a->count_at when it is not 0).  Returns 0, or this rank's status when it
 * failed now or before (MT_RED_TIMEOUT + the rank a barrier waited for). */
unsigned int mt_peer_reduce_host(const mt_reduce_args *a);

#ifdef __cplusplus
}
#endif
#endif
