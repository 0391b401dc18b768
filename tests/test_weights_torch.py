"""metrale.torch.bind and metrale.weights with torch modules, on the host
(CPU tensors over a host weight arena): a module's parameters as the set
(a tied one once), the module bound to the arena without a copy (its every
parameter at the set's offset, its output the one it gave before, computed
by torch on its own memory), a module built on the meta device bound and
then loaded, refusals that leave the module as it was, and the bound module
across a sleep of its weights.  On the GPU, with transformers' Qwen3:
tests/test_weights_cuda.py."""

import pytest

from metrale import HostBackend, MetraleError
from metrale.weights import load, weight_arena, weight_set

torch = pytest.importorskip("torch", reason="metrale.torch needs torch (the extra metrale[torch])")
mt = pytest.importorskip("metrale.torch")


class Tiny(torch.nn.Module):
    """An embedding, a norm, two projections and a head tied to the embedding."""

    def __init__(self, vocab=11, hidden=6, inner=10, dtype=torch.float32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden, dtype=dtype)
        self.norm = torch.nn.LayerNorm(hidden, dtype=dtype)
        self.up = torch.nn.Linear(hidden, inner, dtype=dtype)
        self.down = torch.nn.Linear(inner, hidden, bias=False, dtype=dtype)
        self.head = torch.nn.Linear(hidden, vocab, bias=False, dtype=dtype)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.norm(self.embed(ids))
        return self.head(x + self.down(torch.relu(self.up(x))))


# Tiny's parameters, as named_parameters gives them: the head's weight is the
# embedding's, so it appears once, under the embedding's name.
NAMES = ["embed.weight", "norm.weight", "norm.bias", "up.weight", "up.bias", "down.weight"]
SHAPES = [(11, 6), (6,), (6,), (10, 6), (10,), (6, 10)]
IDS = torch.tensor([[1, 4, 9, 0, 10]])


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return Tiny(**kw).eval()


def _in_buffer(arena, ws, module):
    base = arena.ptr(ws.buffer)
    return {n: p.data_ptr() - base for n, p in module.named_parameters()}


def test_a_modules_parameters_are_its_weight_set_a_tied_one_once():
    ws = weight_set(_model())
    assert list(ws.names) == NAMES
    assert [p.shape for p in ws] == SHAPES and {p.dtype for p in ws} == {"float32"}
    # 264 bytes -> 512; 24 -> 256; 24 -> 256; 240 -> 256; 40 -> 256
    assert [p.offset for p in ws] == [0, 512, 768, 1024, 1280, 1536]
    assert ws == weight_set({n: ("float32", s) for n, s in zip(NAMES, SHAPES)})


def test_a_bound_module_runs_on_the_arenas_memory_with_its_own_values():
    model = _model(seed=1)
    with torch.no_grad():
        want = model(IDS)
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    ws = weight_set(model)
    with weight_arena(ws, HostBackend()) as arena:
        assert mt.bind(model, arena, ws, copy=True) is model
        assert _in_buffer(arena, ws, model) == {p.name: p.offset for p in ws}
        assert model.head.weight is model.embed.weight          # still tied
        for n, p in model.named_parameters():
            assert torch.equal(p, values[n])
        with torch.no_grad():
            assert torch.equal(model(IDS), want)
        # the module computes with what the buffer holds: write it, see it
        whole = mt.tensor(arena, ws.buffer, "uint8")
        p = ws["down.weight"]
        whole[p.offset:p.offset + p.nbytes] = 0
        del whole
        assert torch.count_nonzero(model.down.weight) == 0
        with pytest.raises(BufferError):       # the parameters pin the buffer
            arena.release()
        del model


def test_a_module_built_on_the_meta_device_is_bound_then_loaded():
    ref = _model(seed=2)
    with torch.no_grad():
        want = ref(IDS)
    with torch.device("meta"):
        model = _model(seed=3)
    ws = weight_set(model)
    with weight_arena(ws, HostBackend()) as arena:
        with pytest.raises(ValueError, match="meta device"):
            mt.bind(model, arena, ws, copy=True)
        assert model.embed.weight.is_meta          # refused: unchanged
        mt.bind(model, arena, ws)
        st = load(arena, ws, {n: p.detach().numpy() for n, p in ref.named_parameters()})
        assert st.params == len(NAMES)
        with torch.no_grad():
            assert torch.equal(model(IDS), want)
        del model


def test_bind_refuses_another_modules_parameters_and_leaves_it_as_it_was():
    ws = weight_set(_model())
    with weight_arena(ws, HostBackend()) as arena:
        wider = _model(hidden=8)
        before = [p for _n, p in wider.named_parameters()]
        with pytest.raises(ValueError, match=r"'embed.weight' is float32 \[11, 8\]"):
            mt.bind(wider, arena, ws, copy=True)
        assert [p for _n, p in wider.named_parameters()] == before
        halfs = _model(dtype=torch.float16)
        with pytest.raises(ValueError, match=r"'embed.weight' is float16"):
            mt.bind(halfs, arena, ws)
        extra = _model()
        extra.extra = torch.nn.Linear(2, 2)
        with pytest.raises(ValueError, match="not in the weight set 2: 'extra.weight'"):
            mt.bind(extra, arena, ws)
        fewer = _model()
        fewer.up.bias = None
        with pytest.raises(ValueError, match="missing 1: 'up.bias'"):
            mt.bind(fewer, arena, ws)
        with pytest.raises(TypeError, match="module must be"):
            mt.bind({"embed.weight": None}, arena, ws)
        with pytest.raises(TypeError, match="copy must be a bool"):
            mt.bind(_model(), arena, ws, copy=1)
        with pytest.raises(TypeError, match="ws must be a WeightSet"):
            mt.bind(_model(), arena, None)


def test_a_bound_module_sleeps_with_its_weights_and_wakes_with_them():
    model = _model(seed=5)
    with torch.no_grad():
        want = model(IDS)
    ws = weight_set(model)
    with weight_arena(ws, HostBackend()) as arena:
        mt.bind(model, arena, ws, copy=True)
        arena.sleep()                        # offload: allowed with the module alive
        assert arena.committed_bytes() == 0
        with torch.no_grad():                # host memory at the same addresses
            assert torch.equal(model(IDS), want)
        with pytest.raises(MetraleError, match="sleeps"):
            mt.bind(_model(seed=5), arena, ws)
        arena.wake()
        with torch.no_grad():
            assert torch.equal(model(IDS), want)
        with pytest.raises(BufferError, match="alive"):
            arena.sleep(discard=["weights"])     # would unmap the module's memory
        del model
