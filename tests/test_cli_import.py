import json
import subprocess
import sys

import metrale
from metrale.cli import main


def test_plan_text(capsys):
    assert main(["plan", "--preset", "qwen3-next-80b", "--max-batch-tokens", "128"]) == 0
    out = capsys.readouterr().out
    assert "hidden_states" in out and "NULL" in out and "total_bytes()" in out
    expected = metrale.BufferSizes.from_config(metrale.ModelConfig.preset("qwen3-next-80b"),
                                               128, 4096, 16, 32).total_bytes()
    assert f"{expected:,}" in out


def test_plan_json_and_allocate(capsys, tmp_path):
    assert main(["plan", "--preset", "gemma-4-dense", "--max-batch-tokens", "64", "--json",
                 "--allocate"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["buffers"]) == 46 and r["null_buffers"]
    assert "moe_fp8_scratch" in r["null_buffers"]
    assert r["allocated"]["allocations"] == 1 and r["allocated"]["zero_all_operations"] == 1
    offs = [b["offset"] for b in r["buffers"] if not b["null"]]
    assert all(o % 256 == 0 for o in offs)


def test_plan_hf_config_and_errors(capsys, tmp_path):
    from pathlib import Path
    cfg = Path(__file__).parent / "data" / "hf" / "llama-3.1-8b.json"
    assert main(["plan", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model_type"] == "llama"
    assert main(["plan", "--preset", "qwen3-next-80b", "--max-batch-tokens", "0"]) == 2
    assert "max_batch_tokens" in capsys.readouterr().err


def test_python_m_metrale():
    r = subprocess.run([sys.executable, "-m", "metrale", "plan", "--preset", "nemotron-h", "--json"],
                       capture_output=True, text=True, check=True)
    assert json.loads(r.stdout)["model_type"] == "nemotron_h"


def test_import_is_light():
    code = ("import sys, metrale; "
            "bad = [m for m in sys.modules if m == 'numpy' or m.startswith(('numpy.', 'cuda'))]; "
            "print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_public_names():
    for name in ("ModelConfig", "BufferSizes", "BufferArena", "DecodeMetaLayout", "MoeFp8Scratch",
                 "Target", "HostBackend", "CudaBackend", "ScratchSpaceManager", "ScratchSpace",
                 "ScratchStats", "MetraleError", "OutOfMemoryError"):
        assert hasattr(metrale, name), name
    assert issubclass(metrale.OutOfMemoryError, metrale.MetraleError)
    assert issubclass(metrale.OutOfMemoryError, MemoryError)
