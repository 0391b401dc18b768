"""Derived values carry their inputs: BufferSizes its shape, limits and target,
SlabPlan its sizes; what is made from them takes them alone, and the older
positional forms warn, saying what to write instead."""

import pickle
import warnings

import pytest

from metrale import BufferArena, BufferSizes, HostBackend, ModelConfig, Target
from metrale._sizing._layout import plan_layout
from metrale.picture import render_svg
from metrale.sizes import BUFFER_NAMES

from helpers import NOENV, PRESET

LIMITS = (64, 512, 16, 8)


def _no_warning(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kw)


def test_sizes_record_the_shape_and_target_they_were_computed_for():
    target = Target(132, "auto")
    whole = ModelConfig.preset("llama-3.1-70b")
    sizes = BufferSizes.from_config(whole, *LIMITS, target=target, env=NOENV, tp_size=4)
    assert sizes.config == whole.shard(4) and sizes.config != whole
    assert sizes.target is target
    assert sizes.limits.tp_size == 4 and sizes.limits.max_batch_tokens == 64
    assert BufferSizes.from_config(PRESET, *LIMITS, env=NOENV).target == Target(48, "legacy")
    changed = sizes.replace(logits=256)
    assert (changed.config, changed.target, changed.limits) == (sizes.config, target, sizes.limits)
    again = pickle.loads(pickle.dumps(sizes))
    assert (again.config, again.target, again.limits) == (sizes.config, target, sizes.limits)
    by_hand = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0))
    assert by_hand.config is None and by_hand.target is None and by_hand.limits is None


def test_plan_layout_takes_the_sizes_alone():
    sizes = BufferSizes.from_config(PRESET, *LIMITS, env=NOENV)
    plan = _no_warning(plan_layout, sizes)
    assert plan.sizes is sizes and plan.max_batch_tokens == 64
    with pytest.warns(DeprecationWarning, match=r"write plan_layout\(sizes\)"):
        old = plan_layout(sizes, 64)
    assert (old.offsets, old.slab_bytes, old.rows_ranges(5)) == \
        (plan.offsets, plan.slab_bytes, plan.rows_ranges(5))
    with pytest.warns(DeprecationWarning):
        assert plan_layout(sizes, 128).max_batch_tokens == 128      # as before: the M given
    by_hand = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)).replace(logits=4096)
    with pytest.raises(TypeError, match="plan_layout: max_batch_tokens is required"):
        plan_layout(by_hand)
    assert _no_warning(plan_layout, by_hand, 16).slab_bytes == 4096     # the only way for those
    with pytest.raises(TypeError, match="sizes must be a BufferSizes"):
        plan_layout(dict(sizes))


def test_from_sizes_takes_the_sizes_and_the_backend():
    gpu = HostBackend()
    sizes = BufferSizes.from_config(ModelConfig.preset("llama-3.1-70b"), *LIMITS, env=NOENV,
                                    tp_size=4)
    with _no_warning(BufferArena.from_sizes, sizes, gpu) as a:
        assert a.sizes() is sizes and a.max_batch_tokens() == 64 and a.max_batch_size() == 8
        assert a.tp_size() == 4
        offsets = {n: a.ptr(n) - a.ptr("hidden_states") for n in BUFFER_NAMES if a.nbytes(n)}
        assert offsets == {n: o - plan_layout(sizes).offsets["hidden_states"]
                           for n, o in plan_layout(sizes).offsets.items() if o is not None}
    # the reference's form, as its port calls it: the same arena, no warning
    with _no_warning(BufferArena.from_sizes, sizes.config, sizes, 64, 8, gpu) as old:
        assert old.slab_bytes() == plan_layout(sizes).slab_bytes
    by_hand = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)).replace(logits=4096)
    with pytest.raises(TypeError, match="built by hand and carry no shape or limits"):
        BufferArena.from_sizes(by_hand, gpu)
    with _no_warning(BufferArena.from_sizes, PRESET, by_hand, 16, 0, gpu) as a:
        assert a.nbytes("logits") == 4096
    for args in ((sizes,), (sizes, gpu, 64), (PRESET, sizes, 64, 8, gpu, None)):
        with pytest.raises(TypeError, match=r"from_sizes\(\) takes \(sizes, gpu\)"):
            BufferArena.from_sizes(*args)
    with pytest.raises(TypeError, match="sizes must be a BufferSizes"):
        BufferArena.from_sizes(dict(sizes), gpu)
    with pytest.raises(TypeError, match="gpu must be a backend"):
        BufferArena.from_sizes(sizes, "gpu")
    assert gpu.live_alloc_count == 0


def test_render_svg_takes_the_plan_alone():
    sizes = BufferSizes.from_config(ModelConfig.preset("gemma-4-dense"), 8192, 4096, 16, 32,
                                    target=Target(48, "legacy"), env=NOENV)
    plan = plan_layout(sizes)
    doc = _no_warning(render_svg, plan, tokens=7, model="gemma-4-dense")
    with pytest.warns(DeprecationWarning, match=r"write render_svg\(plan_layout\(sizes\)"):
        old = render_svg(plan, sizes, target=Target(48, "legacy"), tokens=7,
                         model="gemma-4-dense", model_type="gemma4")
    assert doc == old
    by_hand = BufferSizes(**dict.fromkeys(BUFFER_NAMES, 0)).replace(logits=4096)
    with pytest.raises(ValueError, match="built by hand"):
        render_svg(plan_layout(by_hand, 16), tokens=1, model="x")
    with pytest.raises(TypeError, match="plan must be a SlabPlan"):
        render_svg(sizes, tokens=1, model="x")
