"""metrale.weights on the lent GPU: a checkpoint loaded into a CUDA weight arena
(the device's bytes read back against the file's), kept across a sleep."""

import pytest

from metrale.weights import load, weight_arena, weight_set

from helpers import write_safetensors
from test_weights import NBYTES, _tensors

pytestmark = pytest.mark.gpu


def test_a_checkpoint_loads_onto_the_device_and_sleeps_with_its_bytes(gpu, tmp_path, monkeypatch):
    path = write_safetensors(tmp_path / "m.safetensors", _tensors(seed=5))
    ws = weight_set(path)
    with weight_arena(ws, gpu) as arena:
        st = load(arena, ws, path)
        assert (st.params, st.nbytes, st.copies) == (6, sum(NBYTES), 3)
        got = gpu.download(arena.ptr("weights"), ws.nbytes)
        for (name, _d, _s, data), p in zip(_tensors(seed=5), ws):
            assert got[p.offset:p.offset + p.nbytes] == data, name
        arena.sleep()
        assert arena.committed_bytes() == 0
        arena.wake()
        assert gpu.download(arena.ptr("weights"), ws.nbytes) == got
        # through the reused buffer in pieces (1,000 bytes: none a run's length)
        import metrale._integrations._weight_copies as copies
        monkeypatch.setattr(copies, "CHUNK", 1000)
        gpu.upload(arena.ptr("weights"), bytes(ws.nbytes))
        load(arena, ws, path)
        assert gpu.download(arena.ptr("weights"), ws.nbytes) == got


def test_a_transformers_qwen3_bound_to_its_weight_arena_gives_the_same_logits(gpu):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import metrale.torch as mt
    cfg = transformers.Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3ForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 512, (2, 9), device="cuda", generator=torch.Generator(
        "cuda").manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
    with torch.device("meta"):
        meta = transformers.Qwen3ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    ws = weight_set(model)
    assert weight_set(meta) == ws and len(ws) == 3 + 2 * 11
    with weight_arena(ws, gpu) as arena:
        mt.bind(model, arena, ws, copy=True)
        base = arena.ptr("weights")
        assert {n: p.data_ptr() - base for n, p in model.named_parameters()} == \
            {p.name: p.offset for p in ws}
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids, use_cache=False).logits, want)
        arena.sleep()                       # offloaded: the module stays valid
        assert arena.committed_bytes() == 0
        arena.wake()
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids, use_cache=False).logits, want)
        del model
