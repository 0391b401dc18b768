"""`metrale plan`: the ledger, JSON, --allocate, Hugging Face configs, and
every user error as one line with a status."""

import json
import pathlib
import subprocess
import sys

import pytest

import metrale
from metrale.cli import main

from reference_oracle import COUNT, NAMES, PREFILL, ROWS, ZERO_ALL


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
    assert len(r["buffers"]) == COUNT and r["null_buffers"]
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
        p.stderr.close()
        p.wait(timeout=60)
        assert err == "" and p.returncode == 0, err


def test_cli_closed_pipe_status_is_always_0():
    # `metrale plan ... | head -1`: head takes one line and leaves before, during or
    # after the rest is written (a race, which gave 0 or 1 at random); the status
    # must not depend on which.  pipefail makes the shell report metrale's status.
    import shlex
    import shutil
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash for the pipeline")
    cmd = f"{shlex.quote(sys.executable)} -m metrale plan --preset nemotron-h"
    statuses = set()
    for i in range(12):
        extra = " --json" if i % 2 else ""
        r = subprocess.run([bash, "-c", f"set -o pipefail; {cmd}{extra} | head -1"],
                           capture_output=True, text=True, timeout=120)
        assert r.stderr == "" and len(r.stdout.splitlines()) == 1, r.stderr
        statuses.add(r.returncode)
    assert statuses == {0}


# -- what a newcomer asks the CLI ----------------------------------------------------

def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"metrale {metrale.__version__}"


def test_help_shows_defaults_and_levers(capsys):
    from metrale.levers import LEVERS
    assert main(["plan", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--max-batch-tokens", 8192), ("--max-seq-len", 4096),
                          ("--kv-block-size", 16), ("--max-batch-size", 32)):
        assert flag in out and f"(default: {default})" in out, flag
    for lv in LEVERS:
        assert lv.name in out and " ".join(lv.effect.split()) in out


def test_plan_reports_levers_and_what_they_changed(capsys, monkeypatch):
    cfg = metrale.ModelConfig.preset("qwen3-next-80b")
    monkeypatch.delenv("METRALE_FP8_ROWWISE", raising=False)
    assert main(["plan", "--preset", "qwen3-next-80b", "--max-batch-tokens", "64"]) == 0
    assert "levers: none in effect" in capsys.readouterr().out
    monkeypatch.setenv("METRALE_FP8_ROWWISE", "1")
    assert main(["plan", "--preset", "qwen3-next-80b", "--max-batch-tokens", "64"]) == 0
    out = capsys.readouterr().out
    slab = cfg.num_ssm_layers() * (2 * cfg.ssm_qkvz_size() * 2048 + 2 * 2048 * 32 * 128)
    assert f"lever: METRALE_FP8_ROWWISE=1: ssm_rowwise_w_bf16 0 -> {slab:,} bytes" in out
    assert main(["plan", "--preset", "qwen3-next-80b", "--max-batch-tokens", "64", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["levers"] == [{"lever": "METRALE_FP8_ROWWISE", "value": "1", "source": "environment",
                            "changed": {"ssm_rowwise_w_bf16": [0, slab]}}]
    monkeypatch.setenv("METRALE_FP8_ROWWISE", "0")
    monkeypatch.setenv("METRALE_ATTN_DECODE_SPLITK", "4")
    assert main(["plan", "--preset", "qwen3-next-80b", "--json"]) == 0
    (lv,) = json.loads(capsys.readouterr().out)["levers"]
    # pinned 4 splits: R = 32 rows x 16 heads x 4 splits slots of (D + 2) floats
    assert lv["lever"] == "METRALE_ATTN_DECODE_SPLITK" and lv["value"] == "4"
    assert lv["changed"] == {"splitk_workspace": [4 * (256 + 2) * 48, 4 * (256 + 2) * 32 * 16 * 4]}


def test_plan_reports_quantization_config(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("METRALE_FP8_ROWWISE", raising=False)
    base = {"model_type": "x", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 100, "intermediate_size": 128, "full_attention_interval": 2,
            "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_num_value_heads": 2,
            "linear_value_head_dim": 16}
    for qc, line in [({"quant_method": "fbgemm_fp8"},
                      "quantization_config: fp8-rowwise: turns on METRALE_FP8_ROWWISE"),
                     ({"quant_method": "gptq", "bits": 4},
                      "quantization_config: gptq: ignored")]:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(dict(base, quantization_config=qc)))
        assert main(["plan", "--config", str(path)]) == 0
        out = capsys.readouterr().out
        assert line in out
        rowwise = qc["quant_method"] == "fbgemm_fp8"
        # one GDN layer of 2: 2*QKVZ*H + 2*H*Vd, QKVZ = 2*2*16 + 2*2*16
        assert ("ssm_rowwise_w_bf16 0 -> 20,480 bytes" in out) == rowwise
        assert ("METRALE_FP8_ROWWISE on (from quantization_config)" in out) == rowwise


def test_sm_count_switch_is_said(capsys):
    assert main(["plan", "--preset", "qwen3-next-80b", "--sm-count", "132"]) == 0
    assert "--sm-count switched the split-K policy" in capsys.readouterr().out
    assert main(["plan", "--preset", "qwen3-next-80b", "--sm-count", "132", "--splitk", "auto"]) == 0
    assert "switched" not in capsys.readouterr().out
    assert main(["plan", "--preset", "qwen3-next-80b"]) == 0
    assert "switched" not in capsys.readouterr().out


def test_explain(capsys):
    assert main(["plan", "--preset", "gemma-4-dense", "--max-batch-tokens", "8",
                 "--explain", "expert_gate_out"]) == 0
    out = capsys.readouterr().out
    size = metrale.BufferSizes.from_config(metrale.ModelConfig.preset("gemma-4-dense"),
                                           8, 4096, 16, 32).expert_gate_out
    assert out.startswith("expert_gate_out") and f"{size:,} bytes" in out and "dense" in out
    _one_line_error(capsys, ["plan", "--preset", "gemma-4-dense", "--explain", "nope"], 2, "nope")


def test_svg_option(tmp_path, capsys):
    import xml.etree.ElementTree as ET
    out = tmp_path / "slab.svg"
    assert main(["plan", "--preset", "nemotron-h", "--max-batch-tokens", "64",
                 "--svg", str(out)]) == 0
    assert "hidden_states" in capsys.readouterr().out
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    _one_line_error(capsys, ["plan", "--preset", "nemotron-h", "--svg",
                             str(tmp_path / "no" / "dir" / "x.svg")], 2, "x.svg")


def test_svg_dash_is_stdout(tmp_path, capsys, monkeypatch):
    # `--svg -` writes the picture to stdout (and only it), not a file named '-'.
    import xml.etree.ElementTree as ET
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--preset", "nemotron-h", "--max-batch-tokens", "64",
                 "--svg", "-"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "-").exists()
    root = ET.fromstring(out)                     # the whole of stdout is one SVG
    assert root.tag.endswith("svg") and "hidden_states" in out
    # the same picture as --svg FILE draws
    assert main(["plan", "--preset", "nemotron-h", "--max-batch-tokens", "64",
                 "--svg", "slab.svg"]) == 0
    capsys.readouterr()
    assert (tmp_path / "slab.svg").read_text(encoding="utf-8") == out
    for other in (["--json"], ["--explain", "hidden_states"]):   # both want stdout
        _one_line_error(capsys, ["plan", "--preset", "nemotron-h", "--svg", "-", *other], 2,
                        "--svg -", other[0])
    assert not (tmp_path / "-").exists()


def test_fit_svg_option(tmp_path, capsys, monkeypatch):
    # `metrale fit --svg FILE` draws the answer it prints (the parts of --json's
    # figures, to scale); `--svg -` writes the same picture, alone, to stdout.
    import xml.etree.ElementTree as ET
    monkeypatch.chdir(tmp_path)
    argv = ["fit", "--preset", "llama-3.1-8b", "--gpu-mem", "80GiB", "--weights", "16GB",
            "--max-batch-tokens", "8192", "--kv-bytes-per-token", "131072"]
    assert main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["fit"]
    assert main([*argv, "--svg", "budget.svg"]) == 0
    assert "KV cache:" in capsys.readouterr().out       # the answer, printed as ever
    svg = (tmp_path / "budget.svg").read_text(encoding="utf-8")
    ns = "{http://www.w3.org/2000/svg}"
    parts = {e.get("data-part"): e for e in ET.fromstring(svg).iter(ns + "rect")
             if e.get("data-part")}
    want = {"weights": 16 * 10**9, "arena": r["arena_bytes"], "kv": r["kv_bytes"],
            "headroom": r["headroom_bytes"]}
    total = 80 * 2**30
    assert int(parts.pop("total").get("data-bytes")) == total == sum(want.values())
    assert {k: int(e.get("data-bytes")) for k, e in parts.items()} == want
    for k, e in parts.items():
        assert abs(float(e.get("width")) - 860 * want[k] / total) <= 1e-4
    assert main([*argv, "--svg", "-"]) == 0
    assert capsys.readouterr().out == svg
    assert not (tmp_path / "-").exists()
    for other in (["--json"], ["--explain"]):            # both want stdout
        _one_line_error(capsys, [*argv, "--svg", "-", *other], 2, "--svg -", other[0])
    _one_line_error(capsys, [*argv, "--svg", str(tmp_path / "no" / "dir" / "x.svg")], 2,
                    "x.svg")


def test_plan_tp_sizes_one_rank(capsys):
    assert main(["plan", "--preset", "llama-3.1-70b", "--max-batch-tokens", "64", "--tp", "2",
                 "--json", "--allocate"]) == 0
    r = json.loads(capsys.readouterr().out)
    want = metrale.BufferSizes.from_config(metrale.ModelConfig.preset("llama-3.1-70b"), 64,
                                           4096, 16, 32, tp_size=2)
    assert r["tp_size"] == 2 and r["total_bytes"] == want.total_bytes()
    assert {b["buffer"]: b["bytes"] for b in r["buffers"]} == dict(want)
    assert main(["plan", "--preset", "llama-3.1-70b", "--tp", "2"]) == 0
    assert "tp_size=2 (per rank)" in capsys.readouterr().out
    assert main(["plan", "--preset", "llama-3.1-70b", "--tp", "2", "--max-batch-tokens", "8",
                 "--explain", "qkv_output"]) == 0
    # Mp = 16 rows, (32 + 2 * 4) heads of 128 per rank
    assert f"{2 * 16 * 40 * 128:,} bytes" in capsys.readouterr().out
    _one_line_error(capsys, ["plan", "--preset", "llama-3.1-70b", "--tp", "3"], 2,
                    "num_attention_heads", "tp_size = 3")
    _one_line_error(capsys, ["plan", "--preset", "llama-3.1-70b", "--tp", "0"], 2, "tp_size")


def test_plan_lists_config_keys_not_understood(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                "num_hidden_layers": 2, "num_attention_heads": 4,
                                "vocab_size": 100, "intermediate_size": 128,
                                "mamba_d_state": 16}))
    assert main(["plan", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "config: not understood:" in out and "'mamba_d_state' = 16" in out
    assert main(["plan", "--config", str(path), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["config_warnings"]
    assert [n["key"] for n in notes] == ["mamba_d_state"]
    _one_line_error(capsys, ["plan", "--config", str(path), "--strict"], 2, "mamba_d_state",
                    "strict")
    cfg = pathlib.Path(__file__).parent / "data" / "hf" / "mixtral-8x7b.json"
    assert main(["plan", "--config", str(cfg), "--strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config_warnings"] == []


def test_plan_groups_say_what_zero_all_rows_clears(capsys):
    assert main(["plan", "--preset", "qwen3-next-80b", "--json"]) == 0
    groups = {b["buffer"]: b["groups"] for b in json.loads(capsys.readouterr().out)["buffers"]}
    for name in ZERO_ALL:           # zero_all_rows covers every zero_all buffer
        rows = [g for g in groups[name] if g.startswith("rows")]
        assert rows == (["rows"] if name in ROWS else ["rows:whole"]), name
    assert groups["scratch"][:2] == ["zero_all", "rows:whole"]
    for name in ("logits", "splitk_workspace"):
        assert "rows:whole" in groups[name]
    assert main(["plan", "--preset", "qwen3-next-80b"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("logits "))
    assert line.endswith("zero_all,rows:whole")


# -- buffer sets: --buffers FILE and --drop NAME (issue 23) ---------------------------------

# An engine's set as a file: the expectations below are its formulas written out
# for Llama-3.1-8B (H 4096, V 128256) at M = 64, max_batch_size 32.
ENGINE_TOML = """\
base = "reference"
drop = ["ffn_act_q8", "ffn_act_a", "fp8_act"]

[replace.logits]
dtype = "float32"
size = "4*Lr*V"

[[buffer]]
name = "sampler_probs"
dtype = "float32"
shape = ["max_batch_size", "vocab_size"]
total = false

[[buffer]]
name = "staging"
dtype = "bfloat16"
shape = ["max_batch_tokens", "hidden_size"]
zero_all = true
rows = "M"
align = 1048576
"""
ENGINE_JSON = {"base": "reference", "drop": ["ffn_act_q8", "ffn_act_a", "fp8_act"],
               "replace": {"logits": {"dtype": "float32", "size": "4*Lr*V"}},
               "buffer": [{"name": "sampler_probs", "dtype": "float32",
                           "shape": ["max_batch_size", "vocab_size"], "total": False},
                          {"name": "staging", "dtype": "bfloat16",
                           "shape": ["max_batch_tokens", "hidden_size"], "zero_all": True,
                           "rows": "M", "align": 1048576}]}
H, V = 4096, 128256
DROPPED = ("ffn_act_q8", "ffn_act_a", "fp8_act")
LLAMA64 = ["plan", "--preset", "llama-3.1-8b", "--max-batch-tokens", "64"]


def _ceil(x, g=256):
    return -(-x // g) * g


@pytest.fixture
def engine(tmp_path):
    toml = tmp_path / "engine.toml"
    toml.write_text(ENGINE_TOML)
    js = tmp_path / "engine.json"
    js.write_text(json.dumps(ENGINE_JSON))
    return toml, js


def _plan_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_buffers_file_sizes_by_hand(capsys, engine, monkeypatch):
    monkeypatch.delenv("METRALE_FP8_ROWWISE", raising=False)
    toml, js = engine
    r = _plan_json(capsys, *LLAMA64, "--buffers", str(toml))
    got = {b["buffer"]: b for b in r["buffers"]}
    names = [n for n in NAMES if n not in DROPPED] + ["sampler_probs", "staging"]
    assert r["buffer_set"]["names"] == names and set(got) == set(names)
    assert r["buffer_set"]["reference"] is False and r["buffer_set"]["count"] == len(names)
    assert got["sampler_probs"]["bytes"] == 4 * 32 * V
    assert got["staging"]["bytes"] == 2 * 64 * H
    assert got["logits"]["bytes"] == 4 * 64 * V          # Lr = min(64, max(160, 33))
    assert got["staging"]["offset"] % 2**20 == 0
    assert got["staging"]["groups"] == ["zero_all", "rows"]
    assert got["sampler_probs"]["groups"] == []
    assert r["not_in_total"] == ["o_latent", "norm_unit_w", "sampler_probs"]
    assert r["total_bytes"] == sum(b["bytes"] for n, b in got.items() if n not in r["not_in_total"])
    # The slab: every live buffer rounded up to 256 bytes, plus the gap before
    # staging, which follows token_ids, scratch, the prefill and the row-trimmed
    # reference buffers and starts on a MiB, plus the room to move a 256-byte
    # aligned allocation's base up to a MiB (the largest alignment).
    before = sum(_ceil(got[n]["bytes"]) for n in {"token_ids", "scratch", *PREFILL, *ROWS})
    assert r["slab_bytes"] == sum(_ceil(b["bytes"]) for b in got.values()) \
        + _ceil(before, 2**20) - before + 2**20 - 256
    # the same set as JSON plans the same
    j = _plan_json(capsys, *LLAMA64, "--buffers", str(js))
    assert j["buffer_set"].pop("file") == str(js) and r["buffer_set"].pop("file") == str(toml)
    assert j == r


def test_plan_buffers_plain_layout_is_the_ceil256_sum(capsys, tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"base": "empty", "buffer": [
        {"name": "token_ids", "dtype": "int32", "shape": ["M"]},
        {"name": "scratch", "size": 40000, "zero_all": True},
        {"name": "hidden", "dtype": "bfloat16", "shape": ["M", "H"], "zero_all": True,
         "prefill": True, "rows": "M"},
        {"name": "probs", "dtype": "float32", "shape": ["max_batch_size", "V"]},
        {"name": "odd", "size": "3*M + 1"},
        {"name": "nothing", "size": 0}]}))
    for m in (1, 7, 300):
        r = _plan_json(capsys, "plan", "--preset", "llama-3.1-8b", "--max-batch-tokens", str(m),
                       "--buffers", str(path))
        sizes = {"token_ids": 4 * m, "scratch": 40000, "hidden": 2 * m * H, "probs": 4 * 32 * V,
                 "odd": 3 * m + 1, "nothing": 0}
        assert {b["buffer"]: b["bytes"] for b in r["buffers"]} == sizes
        assert r["slab_bytes"] == sum(_ceil(n) for n in sizes.values())
        assert r["null_buffers"] == ["nothing"]
        # zero_all: scratch and hidden, back to back after token_ids
        assert r["zero_all"] == {"offset": _ceil(4 * m),
                                 "length": _ceil(40000) + 2 * m * H}
        assert r["zero_prefill"] == {"offset": _ceil(4 * m) + _ceil(40000), "length": 2 * m * H}


@pytest.mark.parametrize("size", ["3*M  # rows", "M \\\n # x"])
def test_plan_a_buffer_file_with_a_comment_is_one_error_line(capsys, tmp_path, size):
    """A comment in a formula used to pass the spec check and fail at sizing
    with a traceback (SyntaxError, or IndexError after a continuation)."""
    path = tmp_path / "set.json"
    path.write_text(json.dumps({"base": "empty", "buffer": [
        {"name": "token_ids", "dtype": "int32", "shape": ["M"]},
        {"name": "odd", "size": size}, {"name": "after", "size": "M \\\n + 1"}]}))
    _one_line_error(capsys, [*LLAMA64, "--buffers", str(path)], 2, "'odd'", "comment (#)")


def test_plan_drop_from_the_reference(capsys):
    r = _plan_json(capsys, *LLAMA64, "--drop", "ffn_act_q8", "--drop", "fp8_act")
    assert r["buffer_set"] == {
        "reference": False, "file": None, "dropped": ["ffn_act_q8", "fp8_act"],
        "fingerprint": metrale.REFERENCE.without(["ffn_act_q8", "fp8_act"]).fingerprint(),
        "count": COUNT - 2, "names": [n for n in NAMES if n not in ("ffn_act_q8", "fp8_act")]}
    full = _plan_json(capsys, *LLAMA64)
    assert full["buffer_set"]["reference"] is True and full["buffer_set"]["dropped"] == []
    assert full["buffer_set"]["fingerprint"] == metrale.REFERENCE.fingerprint()
    kept = {b["buffer"]: b["bytes"] for b in full["buffers"]}
    del kept["ffn_act_q8"], kept["fp8_act"]
    assert {b["buffer"]: b["bytes"] for b in r["buffers"]} == kept
    assert full["slab_bytes"] - r["slab_bytes"] == sum(
        _ceil(b["bytes"]) for b in full["buffers"] if b["buffer"] in ("ffn_act_q8", "fp8_act"))
    assert main([*LLAMA64, "--drop", "ffn_act_q8", "--drop", "fp8_act"]) == 0
    out = capsys.readouterr().out
    assert f"buffers: {COUNT - 2} (REFERENCE without ffn_act_q8, fp8_act), fingerprint " \
        f"{r['buffer_set']['fingerprint']}\n" in out
    assert "\nffn_act_q8 " not in out


def test_plan_text_names_the_set(capsys, engine, tmp_path):
    toml, _ = engine
    assert main([*LLAMA64, "--buffers", str(toml), "--drop", "lora_xa"]) == 0
    out = capsys.readouterr().out
    n = COUNT - len(DROPPED) + 2 - 1
    assert f"\nbuffers: {n} (from {toml} without lora_xa), fingerprint " in out
    line = next(ln for ln in out.splitlines() if ln.startswith("staging "))
    assert f"{2 * 64 * H:,}" in line and line.endswith("zero_all,rows")
    assert "all but o_latent, norm_unit_w and sampler_probs)" in out
    same = tmp_path / "same.toml"
    same.write_text('base = "reference"\n')
    assert main([*LLAMA64, "--buffers", str(same)]) == 0
    assert ": the same as REFERENCE), fingerprint " + metrale.REFERENCE.fingerprint() in \
        capsys.readouterr().out
    assert main(LLAMA64) == 0
    out = capsys.readouterr().out
    assert "buffers:" not in out and "all but o_latent and norm_unit_w)" in out


def test_plan_buffers_explain_allocate_tp(capsys, engine):
    toml, _ = engine
    assert main([*LLAMA64, "--buffers", str(toml), "--explain", "staging"]) == 0
    out = capsys.readouterr().out
    n = COUNT - len(DROPPED) + 2              # staging is the last of the engine's set
    assert out.startswith(f"staging  (buffer {n} of {n}; an engine's own set)")
    assert "alignment:    1048576 bytes" in out and f"= {2 * 64 * H:,} bytes" in out
    _one_line_error(capsys, [*LLAMA64, "--buffers", str(toml), "--explain", "ffn_act_q8"], 2,
                    "--explain", "'ffn_act_q8'", "did you mean")
    r = _plan_json(capsys, *LLAMA64, "--buffers", str(toml), "--allocate")
    assert r["allocated"]["slab_bytes"] == r["slab_bytes"]
    assert r["allocated"]["fingerprint"] == r["buffer_set"]["fingerprint"]
    assert (r["allocated"]["allocations"], r["allocated"]["zero_all_operations"]) == (1, 1)
    r = _plan_json(capsys, *LLAMA64, "--buffers", str(toml), "--tp", "2")
    got = {b["buffer"]: b["bytes"] for b in r["buffers"]}
    # one rank of 2: the vocabulary is split, the model width is not
    assert (got["sampler_probs"], got["logits"], got["staging"]) == \
        (4 * 32 * V // 2, 4 * 64 * V // 2, 2 * 64 * H)


def test_plan_buffers_lever_report(capsys, tmp_path, monkeypatch):
    path = tmp_path / "rowwise.toml"
    path.write_text('drop = ["ssm_rowwise_w_bf16"]\n[[buffer]]\nname = "rowwise_extra"\n'
                    'size = "4096*M if fp8_rowwise else 0"\n')
    monkeypatch.setenv("METRALE_FP8_ROWWISE", "1")
    argv = ["plan", "--preset", "qwen3-next-80b", "--max-batch-tokens", "64",
            "--buffers", str(path)]
    r = _plan_json(capsys, *argv)
    assert r["levers"] == [{"lever": "METRALE_FP8_ROWWISE", "value": "1",
                            "source": "environment",
                            "changed": {"rowwise_extra": [0, 4096 * 64]}}]
    assert main(argv) == 0
    assert f"lever: METRALE_FP8_ROWWISE=1: rowwise_extra 0 -> {4096 * 64:,} bytes" in \
        capsys.readouterr().out


def test_plan_buffers_svg(capsys, engine, tmp_path):
    import xml.etree.ElementTree as ET
    toml, _ = engine
    out = tmp_path / "engine.svg"
    r = _plan_json(capsys, *LLAMA64, "--buffers", str(toml), "--svg", str(out))
    root = ET.parse(out).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    drawn = {e.get("data-buffer"): (int(e.get("data-offset")), int(e.get("data-bytes")))
             for e in root.iter(ns + "rect") if e.get("data-buffer")}
    assert drawn == {b["buffer"]: (b["offset"], b["bytes"]) for b in r["buffers"] if not b["null"]}
    assert drawn["staging"][0] % 2**20 == 0 and not set(DROPPED) & set(drawn)
    text = " ".join(e.text or "" for e in root.iter(ns + "text"))
    assert "1 at their spec's, up to 1 MiB" in text


def test_plan_buffers_errors_are_one_line(capsys, tmp_path):
    def file(name, text):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    cases = [
        (str(tmp_path / "absent.toml"), ("--buffers", "absent.toml", "cannot read")),
        (str(tmp_path), ("--buffers", "cannot read")),
        (file("a.toml", 'drop = ['), ("--buffers", "a.toml", "not TOML")),
        (file("b.json", '{"drop": ["x"'), ("--buffers", "b.json", "not JSON")),
        (file("c.json", "[1, 2]"), ("c.json", "table")),
        (file("d.toml", '[[buffer]]\nname = "x"\nshape = ["M", 0]\n'),
         ("d.toml", "buffer spec 'x'", "shape[1]")),
        (file("e.toml", '[[buffer]]\nname = "x"\nsise = "M"\n'), ("e.toml", "'x'", "sise")),
        (file("f.toml", '[[buffer]]\nname = "x"\nsize = "M"\nalign = "big"\n'),
         ("f.toml", "'x'", "align")),
        (file("g.toml", '[[buffer]]\nname = "x"\nsize = "M"\nalign = 3000\n'),
         ("g.toml", "'x'", "align", "power of two")),
        (file("h.toml", '[replace.nope]\nsize = "M"\n'), ("h.toml", "'nope'")),
        (file("i.toml", '[[buffer]]\nname = "x"\nsize = "M - 100"\n'),
         ("i.toml", "buffer spec 'x'", "M - 100", "max_batch_tokens=64")),
        (file("j.toml", '[[buffer]]\nname = "x"\nsize = "M * 18446744073709551615"\n'),
         ("j.toml", "size of x", "2^64 - 1")),
        (file("k.toml", 'base = "mine"\n'), ("k.toml", "base")),
        (file("l.toml", '[[buffer]]\nname = "logits"\nsize = 4\n'), ("l.toml", "'logits'")),
    ]
    for path, words in cases:
        _one_line_error(capsys, [*LLAMA64, "--buffers", path], 2, *words)
    _one_line_error(capsys, [*LLAMA64, "--drop", "fp8_ac"], 2, "--drop", "'fp8_ac'",
                    "did you mean fp8_act")
    ok = file("ok.toml", 'drop = ["lora_xa"]\n')
    _one_line_error(capsys, [*LLAMA64, "--buffers", ok, "--drop", "lora_xa"], 2, "--drop",
                    "'lora_xa'", "ok.toml")
    empty = file("empty.toml", 'base = "empty"\n')
    assert main([*LLAMA64, "--buffers", empty]) == 0          # a set may be empty ...
    assert "slab:          0 " in capsys.readouterr().out
    _one_line_error(capsys, [*LLAMA64, "--buffers", empty, "--svg", str(tmp_path / "e.svg")], 2,
                    "--svg", "nothing to draw")               # ... but has no picture


def test_a_set_written_by_to_dict_plans_as_itself(capsys, tmp_path):
    mine = metrale.REFERENCE.replace("hidden_states", zero_all=False, prefill=False,
                                     rows="whole", checksum=False)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(mine.to_dict()))
    r = _plan_json(capsys, *LLAMA64, "--buffers", str(path))
    assert r["buffer_set"]["fingerprint"] == mine.fingerprint()
