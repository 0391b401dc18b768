# cython: language_level=3, binding=False
"""Building a BufferArena (`BufferArena.new` and `from_sizes`): the sizes for
the backend's target, the arguments checked before anything exists, then the
arena's state set and its memory made: one slab, or a reserved (or shared)
arena through its concepts (_reserve, _peer).  On failure nothing is left.
"""

from libc.stdint cimport uintptr_t

from metrale._arena._arena_state cimport ArenaState, link
from metrale._backends._backend cimport Backend
from metrale._base._common cimport limit_arg, limit_tuple, logger, reserve_limits
from metrale._base._core cimport mt_layout_base
from metrale._arena._debug cimport refill_guards
from metrale._arena._fresh cimport init_fresh
from metrale._sizing._layout cimport plan_into
from metrale._arena._peer cimport build_shared
from metrale._arena._reserve cimport build

from metrale._sizing.config import ModelConfig
from metrale._sizing.debug import DebugOptions
from metrale._base.errors import OutOfMemoryError
from metrale._sizing.sizes import BufferSizes, DecodeMetaLayout


cdef tuple new_sizes(object config, tuple limits, object gpu, object reserve, object tp_size,
                     object env, object buffers):
    """`new`'s (sizes, reserved sizes or None), for the backend's target."""
    if not isinstance(gpu, Backend):
        raise TypeError(f"gpu must be a backend (HostBackend or CudaBackend), got {type(gpu).__name__}")
    sizes = BufferSizes.from_config(config, *limits, target=gpu.target(), env=env,
                                    tp_size=tp_size, buffers=buffers)
    top = None
    if reserve is not None:
        top = BufferSizes.from_config(config, *reserve_limits(reserve, limit_tuple(sizes.limits)),
                                      target=gpu.target(), env=sizes.levers(),
                                      tp_size=sizes.limits.tp_size, buffers=sizes.buffers)
    return sizes, top


cdef tuple sizes_args(tuple args):
    """(config, sizes, max_batch_tokens, max_batch_size, gpu) of from_sizes'
    two forms, checked.  The reference's five-argument form is the contract:
    it never warns, whatever the sizes carry."""
    if len(args) == 2:
        sizes, gpu = args
        if not isinstance(sizes, BufferSizes):
            raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
        config, max_batch_tokens, max_batch_size = sizes.config, None, None
        if config is None or sizes.limits is None:
            raise TypeError("from_sizes(sizes, gpu): these sizes were built by hand and carry "
                            "no shape or limits; make them with BufferSizes.from_config (and "
                            "replace what you change), or give them: from_sizes(config, sizes, "
                            "max_batch_tokens, max_batch_size, gpu)")
    elif len(args) == 5:
        config, sizes, max_batch_tokens, max_batch_size, gpu = args
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        if not isinstance(sizes, BufferSizes):
            raise TypeError(f"sizes must be a BufferSizes, got {type(sizes).__name__}")
    else:
        raise TypeError(f"from_sizes() takes (sizes, gpu), or (config, sizes, max_batch_tokens, "
                        f"max_batch_size, gpu) for sizes built by hand; got {len(args)} "
                        "positional arguments")
    return config, sizes, max_batch_tokens, max_batch_size, gpu


cdef tuple limits_of(object sizes, object max_batch_tokens, object max_batch_size, object gpu,
                     object reserve_sizes):
    """(max_batch_tokens, max_batch_size) of an arena of `sizes`, every
    argument checked: before the arena exists."""
    if not isinstance(gpu, Backend):
        raise TypeError(f"gpu must be a backend (HostBackend or CudaBackend), got {type(gpu).__name__}")
    lim = sizes.limits
    max_batch_tokens = limit_arg(max_batch_tokens, "max_batch_tokens", 1, lim)
    max_batch_size = limit_arg(max_batch_size, "max_batch_size", 0, lim)
    if reserve_sizes is not None and lim is not None and \
            getattr(reserve_sizes, "limits", None) is not None and \
            reserve_sizes.limits.tp_size != lim.tp_size:
        raise ValueError(f"reserve_sizes are sized for tp_size={reserve_sizes.limits.tp_size}, "
                         f"sizes for tp_size={lim.tp_size}")
    if reserve_sizes is not None and (not isinstance(reserve_sizes, BufferSizes) or
                                      reserve_sizes.buffers != sizes.buffers):
        raise ValueError("reserve_sizes must be a BufferSizes of the same buffer set as sizes")
    return max_batch_tokens, max_batch_size


cdef int construct(ArenaState self, object config, object sizes, object max_batch_tokens,
                   object max_batch_size, object gpu, object reserve_sizes, object debug,
                   object group, bint exportable) except -1:
    """Set a new arena's state and make its memory (`limits_of` checked the
    arguments); on failure nothing is left."""
    cdef uintptr_t base = 0
    lim = sizes.limits
    self._gpu = <Backend>gpu
    self._buffers, self._index = sizes.buffers, sizes.buffers._index
    self._config, self._sizes = config, sizes
    self._max_tokens, self._max_seqs = max_batch_tokens, max_batch_size
    self._decode_meta = DecodeMetaLayout.for_max_batch_size(max_batch_size)
    self._debug = DebugOptions.coerce(debug)
    if lim is not None:
        self._limits, self._tp = limit_tuple(lim), lim.tp_size
    top = reserve_sizes if reserve_sizes is not None else sizes if group is not None else None
    if group is not None:           # a shared arena reserves `sizes`
        build_shared(self, sizes, top, group)
    elif reserve_sizes is not None:
        build(self, sizes, reserve_sizes, exportable)
    if self._reservation is not None:
        link(self)
        return 0
    plan_into(&self._layout, sizes, max_batch_tokens,
              self._debug.guard_bytes if self._debug is not None else 0)
    self._set_bytes(sizes.as_tuple())
    if self._layout.slab_bytes:
        try:
            self._gpu.alloc(self._layout.slab_bytes, &base)
        except OutOfMemoryError as e:
            raise OutOfMemoryError(
                f"buffer arena slab: cannot allocate {self._layout.slab_bytes} bytes for "
                f"{sum(1 for v in self._bytes if v)} buffers (max_batch_tokens="
                f"{max_batch_tokens}): {e}") from e
        self._alloc = base
        self._base = mt_layout_base(&self._layout, base)
        try:                # past this point any failure frees the slab before it propagates
            init_fresh(self)
            if self._layout.guard:
                refill_guards(self)
        except BaseException:
            self._base = self._alloc = 0
            try:
                self._gpu.free(base, self._layout.slab_bytes)
            except Exception as fe:
                logger().warning("buffer arena: free after a failed construction failed: %s", fe)
            raise
    self._set_ptrs(self._pointers(False))
    if "attn_output" in sizes and "ssm_deinterleaved" in sizes:     # the reference's line
        logger().info("buffer arena for max_batch_tokens=%d: %.1f MiB in one slab (total_bytes() "
                      "%.1f MiB; attn_output %d bytes, ssm_deinterleaved %d bytes, kv_lora_rank "
                      "%d)", max_batch_tokens, self._layout.slab_bytes / 1048576.0,
                      sizes.total_bytes() / 1048576.0, sizes["attn_output"],
                      sizes["ssm_deinterleaved"], config.kv_lora_rank)
    else:
        logger().info("buffer arena for max_batch_tokens=%d: %.1f MiB in one slab (total_bytes() "
                      "%.1f MiB; %d buffers)", max_batch_tokens,
                      self._layout.slab_bytes / 1048576.0, sizes.total_bytes() / 1048576.0,
                      len(sizes))
    link(self)
    return 0


