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
        import metrale._integrations.weights as w
        monkeypatch.setattr(w, "_CHUNK", 1000)
        gpu.upload(arena.ptr("weights"), bytes(ws.nbytes))
        load(arena, ws, path)
        assert gpu.download(arena.ptr("weights"), ws.nbytes) == got
