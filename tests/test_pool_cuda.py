"""An arena's pool on a GPU (docs/torch.md), without torch: segments mapped on
demand, their device memory given back by a sleep (cuMemGetInfo says so),
their bytes at the same addresses after an offloading sleep (read and written
while asleep, from host memory mapped there) and after wake.  Sentinel bytes
written and read with the backend's own copies."""

import pytest

from metrale import BufferArena

from helpers import COMPACT

pytestmark = pytest.mark.gpu

LIMITS = (256, 1024, 16, 16)
MIB = 1 << 20


def test_the_pool_offloads_and_discards_on_the_device(gpu):
    with BufferArena.new(COMPACT, *LIMITS, gpu, reserve=LIMITS) as a:
        pool = a.open_pool(64 * MIB)
        g = pool.granularity
        segs = [pool.alloc(2 * MIB), pool.alloc(6 * MIB), pool.alloc(4 * MIB + 1)]
        pool.free(segs[1])
        sizes = {segs[0]: 2 * MIB, segs[2]: -(-(4 * MIB + 1) // g) * g}    # whole pages
        want = {}
        for i, (p, n) in enumerate(sizes.items()):
            want[p] = bytes([0x30 + i, 0xA5]) * (n // 2)
            gpu.upload(p, want[p])
        committed = pool.stats()["committed"]
        assert committed == 2 * MIB + 6 * MIB + sizes[segs[2]]    # the freed middle stays mapped
        for round_ in range(3):                      # host memory made once, reused
            gpu.synchronize()
            free0 = gpu.mem_info()[0]
            a.sleep(offload=["torch"])
            assert gpu.mem_info()[0] - free0 >= committed - 2 * MIB
            s = pool.stats()
            assert s["committed"] == 0 and s["offloaded"] == s["host_bytes"] == sum(sizes.values())
            for p, n in sizes.items():               # read at their addresses while asleep
                assert gpu.download(p, n) == want[p], (round_, hex(p))
            want[segs[0]] = bytes([0x50 + round_]) * MIB + want[segs[0]][MIB:]
            gpu.upload(segs[0], want[segs[0]][:MIB])  # written while asleep
            a.wake()
            assert [p for p, _ in pool.segments()] == list(sizes)
            for p, n in sizes.items():
                assert gpu.download(p, n) == want[p], (round_, hex(p))
            committed = pool.stats()["committed"]
            assert committed == sum(sizes.values())   # the freed middle not mapped again
        a.sleep()                                    # discarded: the same addresses, mapped
        a.wake()
        assert pool.stats()["committed"] == sum(sizes.values())
        for p in sizes:
            gpu.upload(p, b"\x01" * 4096)
            assert gpu.download(p, 4096) == b"\x01" * 4096
            pool.free(p)
