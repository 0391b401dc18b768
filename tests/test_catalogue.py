"""The buffer catalogue (metrale.catalogue) and the docs generated from it.

The catalogue writes every size formula again, from the contract rather than
from metrale.sizes; here those formulas are evaluated and compared with
BufferSizes.from_config over presets, limits, targets and levers, so that the
documentation and the code cannot drift apart."""

import importlib.util
import io
import math
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

from metrale import BufferSizes, ModelConfig, Target
from metrale.catalogue import (CATALOGUE, SYMBOLS, TERMS, dependencies, evaluate, explain,
                               levers_of, membership, symbols, terms_of)
from metrale.config import FIELDS
from metrale.levers import LEVER_NAMES, LEVERS
from metrale.sizes import BUFFER_NAMES

from reference_oracle import GROUPS, NAMES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEN_DOCS = os.path.join(ROOT, "tools", "gen_docs.py")
BUFFERS_MD = os.path.join(ROOT, "docs", "buffers.md")
# The CI also runs a copy of tests/ against an installed wheel, without the
# source tree: the docs checks need the repository.
needs_repo = pytest.mark.skipif(not os.path.exists(GEN_DOCS),
                                reason="tools/gen_docs.py not found: tests run outside the repository")

PRESETS = {n: ModelConfig.preset(n) for n in ModelConfig.presets()}
_Q = PRESETS["qwen3-next-80b"]
# Configs that reach the branches no preset reaches: low-rank hyper-connections,
# a QSA compression ratio, LoRA (with and without a dense FFN), LatentMoE, zero
# experts, grouped O projection, mrope, a non-128 GDN head, a mixed dense/MoE
# width and a row-wise FP8 checkpoint.
CONFIGS = dict(PRESETS, **{
    "kitchen-sink MLA": PRESETS["deepseek-v4"].replace(
        hc_lowrank=8, index_compress_ratio=4, adapter_max_rank=16, mrope_interleaved=True,
        moe_latent_size=1024, zero_expert_num=2, o_groups=8),
    "dense + LoRA": PRESETS["gemma-4-dense"].replace(
        adapter_max_rank=64, mrope_interleaved=True, attn_gated=True, o_groups=2,
        o_lora_rank=512),
    "compact GDN": _Q.replace(hidden_size=512, num_hidden_layers=4, linear_num_key_heads=4,
                              linear_key_head_dim=64, linear_num_value_heads=8,
                              linear_value_head_dim=64),
    "mixed dense/MoE": _Q.replace(intermediate_size=12288, num_experts=256,
                                  num_experts_per_tok=10, moe_intermediate_size=1024),
    "row-wise FP8": PRESETS["qwen3.8-27b"].replace(quantization="fp8-rowwise"),
})
MS = (1, 2, 17, 128, 8192)
ALL_ON = {"METRALE_GGUF_NATIVE_Q2": "1", "METRALE_GGUF_NATIVE_Q2_MMQ": "1",
          "METRALE_FP8_ROWWISE": "1"}
# (max_seq_len, kv_block_size, max_batch_size, target, env): each lever on and
# off (including near-misses of "1"), each split-K policy, B = 256 (block 0),
# R above its floor.
CASES = (
    (4096, 16, 32, None, {}),
    (4096, 16, 32, None, ALL_ON),
    (100, 0, 0, Target(132, "auto"), {"METRALE_FP8_ROWWISE": "0",
                                      "METRALE_GGUF_NATIVE_Q2": " 1"}),
    (65536, 64, 160, Target(48, "3"), {"METRALE_GGUF_NATIVE_Q2_MMQ": "1"}),
    (131072, 128, 200, None, {"METRALE_ATTN_DECODE_SPLITK": "auto"}),
    (4096, 16, 64, Target(0, "legacy"), {"METRALE_ATTN_DECODE_SPLITK": "off",
                                         "METRALE_GGUF_NATIVE_Q2": "true"}),
)
# Element sizes, written out here rather than taken from the catalogue.
ITEMSIZE = {"bfloat16": 2, "float32": 4, "int32": 4, "uint32": 4, "int64": 8, "int8": 1,
            "float8_e4m3fn": 1}


def grid():
    for cname, cfg in CONFIGS.items():
        for m in MS:
            for seq, blk, bs, target, env in CASES:
                yield cname, cfg, (m, seq, blk, bs), target, env


def test_keys_are_the_buffer_names():
    assert tuple(CATALOGUE) == NAMES
    assert all(e.name == n for n, e in CATALOGUE.items())


def test_formulas_equal_from_config():
    bad = []
    for cname, cfg, limits, target, env in grid():
        want = BufferSizes.from_config(cfg, *limits, target=target, env=env)
        values = symbols(cfg, *limits, target=target, env=env)
        for name in BUFFER_NAMES:
            got = evaluate(name, values)
            if got != getattr(want, name):
                bad.append(f"{name}: {cname} {limits} target={target} env={env}: "
                           f"documented {got:,}, from_config {getattr(want, name):,}")
    assert not bad, "\n".join(bad[:20])


def test_formulas_reproduce_the_worked_examples():
    # Worked examples of the contract, reached through the documented formulas.
    v = symbols(_Q, 1000, 4096, 16, 32, env={})
    assert (v["prefill_term"], v["decode_term"], v["q12_term"]) == (93_032, 201_088, 125_032)
    assert evaluate("scratch", v) == 201_088
    assert evaluate("gdn_fla_scratch", v) == 84_148_224
    v = symbols(_Q.replace(mrope_interleaved=True), 1000, 4096, 16, 32, env={})
    assert (v["prefill_term"], v["q12_term"]) == (101_032, 133_032)
    assert evaluate("ssd_scratch", symbols(PRESETS["nemotron-h"], 1000, 4096, 16, 32,
                                           env={})) == 2_785_280
    hc = ModelConfig(hidden_size=4096, hc_mult=4, hc_lowrank=8)
    assert evaluate("hc_lowrank_scratch", symbols(hc, 32, 4096, 16, 32, env={})) == 2_098_176
    assert evaluate("hc_lowrank_scratch", symbols(hc, 4096, 4096, 16, 32, env={})) == 134_266_880
    qsa = ModelConfig(index_n_heads=64, index_head_dim=128, index_topk=512, index_compress_ratio=4)
    assert evaluate("qsa_select_scratch", symbols(qsa, 1, 65536, 16, 32, env={})) == 236_453_888
    moe = _Q.replace(num_experts=256, num_experts_per_tok=8)
    assert evaluate("moe_fp8_scratch", symbols(moe, 8, 4096, 16, 32, env={})) == 165_636
    assert evaluate("moe_fp8_scratch", symbols(moe, 2176, 4096, 16, 32, env={})) == 9_357_828
    assert evaluate("moe_fp8_scratch", symbols(moe.replace(num_experts=128), 8, 4096, 16, 32,
                                               env={})) == 67_076
    row = {"METRALE_FP8_ROWWISE": "1"}
    assert evaluate("ssm_rowwise_w_bf16", symbols(PRESETS["qwen3.8-27b"], 64, 4096, 16, 32,
                                                  env=row)) == 11_072_962_560
    for target, bs, want in ((Target(132, "auto"), 32, 8_454_144),
                             (Target(132, "auto"), 128, 33_816_576),
                             (Target(48, "auto"), 32, 3_170_304), (Target(48, "4"), 32, 2_113_536)):
        assert evaluate("splitk_workspace", symbols(_Q, 1, 4096, 16, bs, target, {})) == want


def test_dtypes_and_exact_shapes():
    for e in CATALOGUE.values():
        if e.dtype is None:
            assert e.dtype_note, f"{e.name}: no dtype and no note saying why"
        else:
            assert e.itemsize == ITEMSIZE[e.dtype], e.name
        assert e.floor in (None, 256, 65536), e.name
        if e.shape_exact:
            assert e.itemsize, e.name
            assert e.shape.startswith("[") and e.shape.endswith("]"), e.name
    checked = set()
    for cname, cfg, limits, target, env in grid():
        values = symbols(cfg, *limits, target=target, env=env)
        ns = dict(values, cdiv=lambda a, b: -(-a // b))
        for e in CATALOGUE.values():
            if not e.shape_exact or (e.shape_when and not eval(e.shape_when, ns)):
                continue
            dims = eval(e.shape, ns)
            size = max(math.prod(dims) * e.itemsize, e.floor or 0)
            assert size == evaluate(e.name, values), (e.name, cname, limits, dims)
            checked.add(e.name)
    # Every exact shape was met with its condition true somewhere in the grid.
    assert checked == {e.name for e in CATALOGUE.values() if e.shape_exact}


def test_symbols_and_terms():
    names = [s.name for s in SYMBOLS] + [t.name for t in TERMS]
    assert len(names) == len(set(names))
    v = symbols(_Q, 8192, 4096, 16, 32, env={})
    assert list(v) == names
    fields = {f for s in SYMBOLS for f in s.fields}
    assert fields <= set(FIELDS)
    # The symbols the spec's symbol table defines (ARENA symbol table).
    spec = ("M Mp Kx R B H I V Hq Hkv D g E k Im Is Ez Lm Hin nk dk nv dv QKVZ Vd Hm Di Dx "
            "Dip KVr Qr r hc hr nh hdi topk icr rank ps Kf Kp").split()
    assert set(spec) <= set(names)
    with pytest.raises(TypeError, match="config"):
        symbols({}, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        symbols(_Q, 0, 1, 1, 1, env={})
    with pytest.raises(TypeError, match="env"):
        symbols(_Q, 1, 1, 1, 1, env=[])


def test_dependencies_list_every_field_that_changes_a_size():
    # A config field missing from a buffer's documented dependencies must not
    # change its size: perturb each field of each preset and compare.
    def changed(cfg, field):
        v = getattr(cfg, field)
        if isinstance(v, bool):
            return cfg.replace(**{field: not v})
        if isinstance(v, int):
            return cfg.replace(**{field: v + 3})
        if field == "layer_types":
            return cfg.replace(layer_types=("linear_attention",) * 3 + ("moe",))
        if field == "quantization":
            return cfg.replace(quantization="fp8-rowwise")
        return cfg.replace(**{field: v + "x"})
    deps = {n: set(dependencies(n).fields) for n in BUFFER_NAMES}
    for cfg in PRESETS.values():
        base = BufferSizes.from_config(cfg, 17, 4096, 16, 32, env={})
        for field in FIELDS:
            other = BufferSizes.from_config(changed(cfg, field), 17, 4096, 16, 32, env={})
            for n in BUFFER_NAMES:
                if field not in deps[n]:
                    assert getattr(other, n) == getattr(base, n), (n, field, cfg.model_type)
    assert dependencies("hidden_states").fields == ("hidden_size",)
    assert dependencies("hidden_states").limits == ("max_batch_tokens",)
    assert dependencies("splitk_workspace").target == ("sm_count", "splitk")


def test_levers_agree_with_the_formulas():
    assert {lv for s in SYMBOLS for lv in s.levers} == set(LEVER_NAMES)
    for name in BUFFER_NAMES:
        assert set(levers_of(name)) == set(dependencies(name).levers), name
    assert sorted(b for lv in LEVERS for b in lv.buffers) == sorted(
        n for n in BUFFER_NAMES if levers_of(n))


def test_membership_is_the_buffer_table():
    for name in NAMES:
        m = membership(name)
        assert m["zero_all"] == (name in GROUPS["zero_all"])
        assert m["zero_prefill_essentials"] == (name in GROUPS["prefill"])
        assert m["checksum"] == (name in GROUPS["checksum"])
        assert m["total"] == (name in GROUPS["total"])
        assert m["zero_all_rows"] == ("trimmed" if name in GROUPS["rows"] else
                                      "whole" if name in GROUPS["zero_all"] else None)


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", GEN_DOCS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_repo
def test_generated_docs_are_current():
    out = io.StringIO()
    with redirect_stdout(out):
        status = _gen_docs().main(["--check"])
    assert status == 0, "docs are stale; run python tools/gen_docs.py\n" + out.getvalue()[:4000]


@needs_repo
def test_check_reports_a_stale_file(tmp_path):
    gen = _gen_docs()
    docs = tmp_path / "docs"
    docs.mkdir()
    texts = gen.outputs()
    for rel, text in texts.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    assert gen.main(["--check", "--root", str(tmp_path)]) == 0
    # A hand edit: one line of the levers page changed.
    line = texts["docs/levers.md"].splitlines()[-1]
    (tmp_path / "docs/levers.md").write_text(texts["docs/levers.md"].replace(line, "edited"),
                                            encoding="utf-8")
    out = io.StringIO()
    with redirect_stdout(out):
        status = gen.main(["--check", "--root", str(tmp_path)])
    assert status == 1
    assert "-edited" in out.getvalue() and "+" + line in out.getvalue()
    assert (tmp_path / "docs/levers.md").read_text(encoding="utf-8").endswith("edited\n")


@needs_repo
def test_docs_membership_table_is_the_buffer_table():
    with open(BUFFERS_MD, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("| # | buffer |"))
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    rows = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.search(r"`(\w+)`", cells[1]).group(1)
        rows[name] = dict(zip(cols, cells))
    assert list(rows) == list(NAMES)
    for group, col in (("zero_all", "zero_all"), ("prefill", "zero_prefill_essentials"),
                       ("checksum", "checksum"), ("total", "total_bytes()")):
        assert tuple(n for n in NAMES if rows[n][col] == "yes") == GROUPS[group], col
    assert tuple(n for n in NAMES if rows[n]["zero_all_rows"] == "trimmed") == GROUPS["rows"]
    assert tuple(n for n in NAMES if rows[n]["zero_all_rows"] != "-") == GROUPS["zero_all"]
    # One anchored section per buffer, in canonical order.
    assert re.findall(r'<a id="(\w+)"></a>\n\n### \d+\. `\w+`', text) == list(NAMES)


def _flat(text):
    return " ".join(text.split())          # explain() wraps long lines


def test_explain_every_buffer():
    cfg = PRESETS["gemma-4-dense"]
    sizes = BufferSizes.from_config(cfg, 8192, 4096, 16, 32, env={})
    for name in BUFFER_NAMES:
        n = f"{getattr(sizes, name):,}"
        text = explain(name)
        assert text.startswith(name + " ") and CATALOGUE[name].formula in _flat(text)
        evaluated = _flat(explain(name, config=cfg, env={}))
        assert f"= {n} bytes from_config: {n} bytes" in evaluated
        assert f"in sizes: {n} bytes" in _flat(explain(name, sizes))
    text = _flat(explain("expert_gate_out", config=cfg, max_batch_tokens=3, env={}))
    assert "Kx = ceil16(max(3, 3)) = 16" in text
    assert "2*16*(21504 if 0 == 0 else max(1*0, 21504)) = 688,128 bytes" in text
    assert "dense FFN" in text                      # why a dense model has it
    other = BufferSizes.from_config(cfg, 16, 4096, 16, 32, env={})
    assert "differs" in explain("hidden_states", other, cfg, env={})
    assert terms_of("hidden_states") == ()


def test_explain_refuses_unknown_names():
    with pytest.raises(ValueError, match="hidden_state"):
        explain("hidden_state")
    with pytest.raises(ValueError, match="did you mean hidden_states"):
        explain("hidden_state")
    with pytest.raises(ValueError, match="'nope'"):
        explain("nope")
    with pytest.raises(TypeError):
        explain(3)
    with pytest.raises(TypeError, match="sizes"):
        explain("logits", sizes={})
    for f in (evaluate, dependencies, membership, levers_of, terms_of):
        with pytest.raises(ValueError, match="nope"):
            f("nope", {}) if f is evaluate else f("nope")


def test_import_is_cheap():
    code = ("import sys, metrale.catalogue; "
            "print(sorted(m for m in ('numpy', 'metrale.sizes', 'metrale._arena._buffer_arena') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
