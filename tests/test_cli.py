"""`metrale plan`: the ledger, JSON, --allocate, Hugging Face configs, and
every user error as one line with a status."""

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


def _one_line_error(capsys, argv, status, *words):
    assert main(argv) == status
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("metrale: error: "), cap.err
    for w in words:
        assert w in lines[0], lines[0]


def test_cli_user_errors_are_one_line(capsys, tmp_path):
    bad_json = tmp_path / "config.json"
    bad_json.write_text("{")
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    plan = ["plan", "--preset", "qwen3-next-80b"]
    _one_line_error(capsys, plan + ["--splitk", ""], 2, "--splitk", "invalid choice")
    _one_line_error(capsys, plan + ["--splitk", "17"], 2, "--splitk")
    _one_line_error(capsys, [], 2, "command")
    _one_line_error(capsys, ["plan"], 2, "--preset", "--config")
    _one_line_error(capsys, plan + ["--nope"], 2, "--nope")
    _one_line_error(capsys, plan + ["--max-batch-tokens", "abc"], 2, "--max-batch-tokens")
    _one_line_error(capsys, plan + ["--max-batch-tokens", "-1"], 2, "max_batch_tokens")
    _one_line_error(capsys, plan + ["--max-seq-len", str(2**64)], 2, "max_seq_len")
    _one_line_error(capsys, plan + ["--sm-count", "-3"], 2, "sm_count")
    _one_line_error(capsys, ["plan", "--preset", "nope"], 2, "--preset")
    _one_line_error(capsys, ["plan", "--config", str(tmp_path / "absent.json")], 2, "absent.json")
    _one_line_error(capsys, ["plan", "--config", str(bad_json)], 2, "malformed JSON")
    _one_line_error(capsys, ["plan", "--config", str(empty)], 2, "hidden_size")
    # a refused allocation is a runtime failure: status 1
    _one_line_error(capsys, plan + ["--max-batch-tokens", str(2**36), "--allocate"], 1,
                    "cannot allocate")


def test_cli_help_is_status_0(capsys):
    assert main(["plan", "--help"]) == 0
    assert "--splitk" in capsys.readouterr().out


def test_cli_closed_pipe_ends_quietly():
    for extra in ([], ["--json"]):
        p = subprocess.Popen([sys.executable, "-m", "metrale", "plan", "--preset", "qwen3-next-80b",
                              *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()                 # the reader is gone before the first write
        err = p.stderr.read().decode()
        p.wait(timeout=60)
        assert err == "" and p.returncode == 1, err
