"""Per-thread host scratch (docs/lifetime.md): one ScratchSpace per thread,
reset_all() at the start of each step, arrays that outlive the manager."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from metrale import MetraleError, ScratchSpaceManager

scratch = ScratchSpaceManager.for_model(hidden_dim=2048, max_threads=4)   # 32 KiB per thread


def work(i):
    space = scratch.get_scratch()          # this thread's; the same object on every call
    a = space.get(512, "float32")          # zero-filled, 64-byte aligned, or None when full
    assert a is not None and not a.any() and a.ctypes.data % 64 == 0
    a[:] = i
    return float(a.sum())


with ThreadPoolExecutor(max_workers=4) as pool:
    for step in range(3):
        scratch.reset_all()                # each thread starts over at its next access
        print(step, sorted(pool.map(work, range(8))))
    print(scratch.stats())

# A ScratchSpace belongs to the thread that got it.
mine = scratch.get_scratch()
with ThreadPoolExecutor(max_workers=1) as other:
    try:
        other.submit(mine.get, 4).result()
    except MetraleError as e:
        print("refused:", e)

# Arrays stay valid after the manager is gone.
kept = mine.get(4, np.int32)
del scratch, mine
kept[:] = 5
assert (kept == 5).all()
print("ok")
