"""Arenas and every extension class of metrale in reference cycles: the
cyclic collector gives back everything they owned (memory, reservations,
handles, descriptors), whatever order it clears them in."""

import os

from helpers import Cycle, _reserved, new


# -- the cyclic collector ------------------------------------------------------------------
#
# Every extension class is put in a reference cycle (helpers.Cycle) and
# collected; what it owned must be given back.  Classes that own nothing the
# collector could clear first are listed with the reason.

def _walk_extension_classes():
    from helpers import package_modules
    found = {}
    for mod in package_modules():
        if not (getattr(mod, "__file__", "") or "").endswith(".so"):
            continue
        for obj in vars(mod).values():
            # cdef classes are static types; Python classes in a .pyx are heap types
            if isinstance(obj, type) and obj.__module__ == mod.__name__ \
                    and not obj.__flags__ & (1 << 9):
                found[obj.__name__] = obj
    return found


def _collect(**held):
    import gc
    Cycle(**held)
    del held
    gc.collect()


# Every kind of arena, each holding something else a collector could clear
# first: reserved chunks, kept host copies, host memory of an offload (asleep:
# mapped at the buffers' addresses too), a peer's memfds, guard bands, step
# inputs' staging.
GC_KINDS = ("plain", "reserved", "keep", "offload", "offload_awake", "shared", "debug", "step")


def _gc_arena(kind):
    """Build an arena of `kind`, leave it unreleased in a reference cycle, and
    collect it: what the backend and the process still hold afterwards."""
    import gc
    import warnings
    from metrale import BufferArena, HostBackend
    from helpers import COMPACT, OneRank, process_resources, vm_counts
    gpu = HostBackend()
    gc.collect()            # what earlier tests left in cycles goes first, not in the count
    before = process_resources()[0], process_resources()[2]
    if kind == "plain":
        arena = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu)
    elif kind == "shared":
        arena = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, group=OneRank())
    elif kind == "debug":
        arena = BufferArena.new(COMPACT, 64, 512, 16, 8, gpu, debug=True)
    else:
        arena = _reserved(gpu)
    if kind == "keep":
        arena.sleep(keep=("hidden_states", "logits"))
    elif kind.startswith("offload"):
        arena.sleep(offload=("hidden_states", "logits"), keep=("residual",))
        if kind == "offload_awake":
            arena.wake()
    step = arena.step_inputs(16) if kind == "step" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)      # unreleased, on purpose
        Cycle(arena=arena, gpu=gpu, step=step)
        del arena, step             # the cycle holds the only references now
        gc.collect()
    after = process_resources()[0], process_resources()[2]
    return (gpu.live_alloc_count, vm_counts(gpu), gpu.live_host_alloc_count,
            gpu.host_handle_count, gpu.host_mapped_bytes, after == before)


GIVEN_BACK = (0, (0, 0, 0), 0, 0, 0, True)


def test_every_kind_of_arena_collected_in_cycles_gives_everything_back():
    """Six rounds of every kind in one process: the collector clears what
    it finds in a different order from one collection to the next (the
    first of a fresh process happened to be clean while later ones leaked)."""
    got = {(r, kind): _gc_arena(kind) for r in range(6) for kind in GC_KINDS}
    assert {k: v for k, v in got.items() if v != GIVEN_BACK} == {}


def test_step_inputs_collected_in_a_cycle():
    import gc
    import warnings
    import weakref
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    ref = weakref.ref(arena)
    st = arena.step_inputs(257)
    ids = st.token_ids                     # a view: the staging lives while it does
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        _collect(st=st, arena=arena, gpu=gpu)
        del st, arena
        gc.collect()
    ids[:] = 3                             # still valid memory
    assert gpu.live_host_alloc_count == 1
    del ids
    gc.collect()
    assert ref() is None and gpu.live_host_alloc_count == 0 and gpu.live_alloc_count == 0


def test_step_inputs_dropped_unreleased_free_everything():
    """Views read, then dropped without release: freed by reference counting
    alone (no cycle runs through the views), and the arena with them."""
    import weakref
    from metrale import HostBackend
    gpu = HostBackend()
    arena = new(gpu, m=16)
    ref = weakref.ref(arena)
    for _ in range(200):
        st = arena.step_inputs(257)
        st.fill([1, 2, 3], positions=[4, 5, 6])
        del st
    assert gpu.live_host_alloc_count == 0 and gpu.host_alloc_count == 200
    arena.release()
    del arena
    assert ref() is None


def _cycle_cases():
    """Class name -> a function that builds instances in a cycle, collects
    them and returns what must hold afterwards (a bool), or the reason the
    class owns nothing the collector could clear before its finalizer."""
    from metrale import HostBackend, ScratchSpaceManager
    from metrale.testing import FaultyBackend as Faulty

    def arena_case():
        return all(_gc_arena(kind) == GIVEN_BACK for kind in GC_KINDS)

    def view_case():
        gpu = HostBackend()
        arena = new(gpu, m=16)
        _collect(v=arena.view("logits", "uint8"), arena=arena)
        arena.release()                    # the view is gone: release succeeds
        return gpu.live_alloc_count == 0

    def step_case():
        gpu = HostBackend()
        arena = new(gpu, m=16)
        st = arena.step_inputs(257)
        _collect(st=st, ids=st.token_ids, gpu=gpu)
        del st
        import gc
        gc.collect()
        arena.release()
        return gpu.live_host_alloc_count == 0

    def backend_case(cls):
        def case():
            gpu = cls()
            arena = _reserved(gpu)
            _collect(gpu=gpu, arena=arena)
            return True                    # no crash; the arena case checks the counts
        return case

    def peer_case():
        return _gc_arena("shared") == GIVEN_BACK

    def pool_case():
        # An idle pool goes with its arena; one whose segments torch may still
        # use keeps its memory mapped (never unmapped under a graph), no crash.
        import gc
        from helpers import vm_counts
        left = []
        for held in (False, True):
            gpu = HostBackend()
            arena = _reserved(gpu)
            pool = arena.open_pool(1 << 20)
            seg = pool.alloc(5000)
            if not held:
                pool.free(seg)
            _collect(pool=pool, arena=arena)
            del pool, arena
            gc.collect()
            left.append(vm_counts(gpu))
        return left == [(0, 0, 0), (1 << 20, 8192, 1)]

    def guard_case():
        # A guard holds its arena (and nothing of it back): in a cycle with it,
        # both go and the arena's memory with them.
        import gc
        from helpers import vm_counts
        gpu = HostBackend()
        arena = _reserved(gpu)
        g = arena.guard()
        _collect(g=g, arena=arena)
        del g, arena
        gc.collect()
        return vm_counts(gpu) == (0, 0, 0)

    def guarded_case():
        # A graph's guarded replay: the graph holds it and it holds the graph
        # (its bound replay); the cycle goes, the arena's memory with it.
        import gc
        from helpers import vm_counts
        gpu = HostBackend()
        arena = _reserved(gpu)

        class Graph:
            def replay(self):
                pass
        graph = Graph()
        graph.replay = arena.guard().wrap(graph.replay)
        _collect(graph=graph, arena=arena)
        del graph, arena
        gc.collect()
        return vm_counts(gpu) == (0, 0, 0)

    def export_case():
        # An open export in a cycle with its arena: the export ends (the hold
        # let go, its descriptors closed), then the arena goes and its memory.
        import gc
        from helpers import vm_counts
        from metrale.weights import weight_arena, weight_set
        gpu = HostBackend()
        ws = weight_set({"w": ("float32", (1000,))})
        arena = weight_arena(ws, gpu)
        ex = arena.export_memory("weights")
        fds = ex.fds()
        _collect(ex=ex, arena=arena)
        del ex, arena
        gc.collect()
        closed = []
        for fd in fds:
            try:
                os.fstat(fd)
            except OSError:
                closed.append(fd)
        return vm_counts(gpu) == (0, 0, 0) and closed == fds

    def scratch_case():
        m = ScratchSpaceManager(4096, 2)
        s = m.get_scratch()
        a = s.get(16, "uint8")
        _collect(m=m, s=s, a=a)
        return True

    return {
        "BufferArena": arena_case, "ArenaView": view_case, "StepInputs": step_case,
        "_Staging": step_case, "PeerSlabs": peer_case,
        "HostBackend": backend_case(HostBackend), "FaultyBackend": backend_case(Faulty),
        "Backend": "abstract: no instance can hold memory",
        "CudaBackend": "frees through C fields only (no Python field in its finalizer); "
                       "the GPU run of this test covers it through the arena case",
        "CudaDevice": "CudaBackend's base (no instance of its own): the CudaBackend case",
        "FaultyCudaBackend": "a CudaBackend with a Faults: test_offload_cuda.py collects "
                             "arenas on it in cycles",
        "Faults": "owns nothing: the armed failures and calls of a testing backend",
        "SlabPlan": "owns nothing but C fields",
        "Held": "holds no Python object and is not tracked by the collector: nothing can clear it",
        "ArenaState": "BufferArena's base (no instance of its own): the arena case",
        "Reservation": "not tracked by the collector (its backend and Held rows); the arena's "
                       "finalizer frees it: the arena case collects reserved arenas",
        "SleepState": "not tracked by the collector (its backend, C records, a tuple of "
                      "Offload); the "
                      "arena's finalizer frees it: the arena case collects sleeping arenas",
        "Offload": "not tracked by the collector (its backend and Held rows); the arena's or "
                   "the pool's finalizer frees it: the arena and pool cases collect offloads",
        "Owner": "abstract: the protocol Reservation and Pool implement",
        "Lane": "lives for one sleep or wake call only, holding what the arena holds",
        "Part": "lives for one sleep or wake call only (a Lane's owner), owning nothing",
        "Peers": "not tracked by the collector (its PeerSlabs, cells and socket); the arena's "
                 "finalizer closes it: the arena case collects shared arenas",
        "_Plan": "owns nothing: a parameter block of addresses and a list of tuples",
        "ArenaBuffers": "owns nothing; holds its arena, which holds nothing of it back",
        "Pool": pool_case, "Guard": guard_case, "Guarded": guarded_case,
        "MemoryExport": export_case,
        "ScratchSpaceManager": scratch_case, "ScratchSpace": scratch_case,
        "_TableRef": scratch_case, "_Region": scratch_case, "_Lease": scratch_case,
    }


def test_every_extension_class_survives_the_cyclic_collector():
    cases = _cycle_cases()
    found = _walk_extension_classes()
    assert set(found) == set(cases), f"classes without a case: {set(found) - set(cases)}"
    for name, case in cases.items():
        if callable(case):
            assert case(), name
