"""The host examples of docs/examples run, and say what they claim.

Each script runs in a fresh interpreter from the repository root; the Llama
example's numbers are checked against the formulas written out here, and its
committed picture against a fresh rendering.  Only the source tree has the
examples: an installed copy of the tests skips them."""

import pathlib
import runpy
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
HOST = ("lifetime_host.py", "fault_injection.py", "scratch_threads.py", "llama31_8b.py")

pytestmark = pytest.mark.skipif(not EXAMPLES.is_dir(), reason="no docs/examples here "
                                "(an installed copy of the tests)")


@pytest.mark.parametrize("name", HOST)
def test_host_example_runs(name):
    r = subprocess.run([sys.executable, "-W", "error::ResourceWarning", str(EXAMPLES / name)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"


def _ceil256(n):
    return -(-n // 256) * 256


def test_llama_set_against_the_formulas():
    from metrale import ModelConfig
    from reference_oracle import NAMES
    from reference_sizes import reference_sizes
    ex = runpy.run_path(str(EXAMPLES / "llama31_8b.py"), run_name="example")
    sizes, plan, ref_sizes, ref_plan = ex["main"]([])
    c = ModelConfig.preset("llama-3.1-8b")
    lim = ex["LIMITS"]
    bs, V, Hq, D = lim["max_batch_size"], c.vocab_size, c.num_attention_heads, c.head_dim
    assert sizes["sampler_probs"] == 4 * bs * V
    assert sizes["splitkv_partial"] == 4 * bs * Hq * 16 * D
    assert sizes["splitkv_lse"] == 4 * bs * Hq * 16
    # every reference buffer it keeps has the reference size (the second
    # implementation of the formulas), the dropped ones are gone
    ref = dict(zip(NAMES, reference_sizes(c, *lim.values(), env={})))
    kept = [n for n in NAMES if n not in ex["QUANTIZED"]]
    assert [n for n in sizes if n in ref] == kept
    assert all(sizes[n] == ref[n] for n in kept)
    assert not set(ex["QUANTIZED"]) & set(sizes)
    # the slab: every live buffer at a 256-byte boundary, back to back
    assert plan.slab_bytes == sum(_ceil256(v) for v in sizes.values())
    assert ref_plan.slab_bytes == sum(_ceil256(v) for v in ref.values())
    dropped = sum(ref[n] for n in ex["QUANTIZED"])
    assert dropped > 0.35 * ref_plan.slab_bytes          # the 36 %
    assert plan.slab_bytes < ref_plan.slab_bytes - dropped + 32 << 20


def test_llama_picture_is_current(tmp_path):
    out = tmp_path / "llama.svg"
    ex = runpy.run_path(str(EXAMPLES / "llama31_8b.py"), run_name="example")
    ex["main"](["--svg", str(out)])
    assert out.read_text() == (EXAMPLES / "llama31_8b.svg").read_text(), \
        "docs/examples/llama31_8b.svg is stale: python docs/examples/llama31_8b.py --svg it"
