/* metrale C core: the lent buffer, torch's allocator over one declared
 * buffer (metrale.torch.install_workspaces).  See arena_core.h for the
 * contract.  Process-wide state: compiled into metrale._arena._lend alone. */
#include "arena_core.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* metrale.torch.install_workspaces makes torch's cuBLAS workspace in a
 * MemPool whose allocator is this pair: it hands out the buffer set by
 * mt_lend_set once (a request no larger than it), and takes it back.
 * Torch calls them with its allocator's mutex held, from any thread: plain
 * C, no GIL, no lock beyond the atomics.  One per process. */
static _Atomic uint64_t lend_ptr, lend_size, lend_refused;
static atomic_int lend_out;

void mt_lend_set(uint64_t ptr, uint64_t size)
{
    atomic_store(&lend_out, 0);
    atomic_store(&lend_refused, 0);
    atomic_store(&lend_size, size);
    atomic_store(&lend_ptr, ptr);
}

static void *lend_alloc(size_t size, int device, void *stream)
{
    int no = 0;
    uint64_t ptr = atomic_load(&lend_ptr);
    (void)device;
    (void)stream;
    if (ptr == 0 || size > atomic_load(&lend_size)
            || !atomic_compare_exchange_strong(&lend_out, &no, 1)) {
        uint64_t seen = atomic_load(&lend_refused);
        while (size > seen && !atomic_compare_exchange_weak(&lend_refused, &seen, size))
            ;
        return NULL;
    }
    return (void *)(uintptr_t)ptr;
}

static void lend_free(void *ptr, size_t size, int device, void *stream)
{
    (void)size;
    (void)device;
    (void)stream;
    if ((uint64_t)(uintptr_t)ptr == atomic_load(&lend_ptr))   /* else not ours: nothing */
        atomic_store(&lend_out, 0);
}

int mt_lend_out(void) { return atomic_load(&lend_out); }
uint64_t mt_lend_refused(void) { return atomic_load(&lend_refused); }
uint64_t mt_lend_alloc_fn(void) { return (uint64_t)(uintptr_t)&lend_alloc; }
uint64_t mt_lend_free_fn(void) { return (uint64_t)(uintptr_t)&lend_free; }
