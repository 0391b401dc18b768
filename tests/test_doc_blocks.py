"""Docs are code: every Python block of the README and of docs/ runs.

The blocks of a page run in order, in one namespace, in a fresh interpreter
whose working directory is the repository root, on the host backend (a block
that defines ``test_*`` functions has them called, as pytest would).  A block
preceded by the line ``<!-- doc-block: gpu -->`` needs a CUDA device: it runs
on its own (its own namespace) where a CudaBackend can be made, and is skipped
elsewhere (marker gpu); ``<!-- doc-block: two-gpus -->`` marks a torchrun script
for two GPUs, run with ``torch.distributed.run`` where two are present (marker
two_gpus).  Only the
source tree has the pages: an installed copy of the tests skips them."""

import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = ([ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))) \
    if (ROOT / "docs" / "index.md").exists() else []
_BLOCK = re.compile(r"(?:<!-- doc-block: ([\w-]+) -->\n)?```python\n(.*?)```", re.S)
_KINDS = (None, "gpu", "two-gpus")


def blocks(page):
    """(kind, first line number, source) of each Python block of `page`."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in _BLOCK.finditer(text):
        if m.group(1) not in _KINDS:
            raise ValueError(f"{page.name}: unknown doc-block kind {m.group(1)!r}")
        line = text.count("\n", 0, m.start(2)) + 1
        out.append((m.group(1), line, m.group(2)))
    return out


# Runs the blocks given as (label, source) pairs in one namespace, then each
# block's test_* functions.
_RUNNER = textwrap.dedent("""
    import sys, json
    ns = {"__name__": "__doc_block__"}
    for label, source in json.loads(sys.stdin.read()):
        before = set(ns)
        exec(compile(source, label, "exec"), ns)
        for name in sorted(set(ns) - before):
            if name.startswith("test_") and callable(ns[name]):
                ns[name]()
""")


def _run(parts, timeout=600):
    import json
    r = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(parts), cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{parts[0][0]}...: exit {r.returncode}\n{r.stdout}\n{r.stderr}"


def _label(page, line):
    return f"{page.relative_to(ROOT)}:{line}"


HOST = [(p, [(_label(p, ln), src) for kind, ln, src in blocks(p) if kind is None])
        for p in PAGES]
GPU = [(_label(p, ln), src) for p in PAGES for kind, ln, src in blocks(p) if kind == "gpu"]
TWO = [(_label(p, ln), src) for p in PAGES for kind, ln, src in blocks(p) if kind == "two-gpus"]


@pytest.mark.skipif(not PAGES, reason="the pages are in the source tree only")
def test_the_pages_have_blocks_and_only_known_kinds():
    assert sum(len(parts) for _, parts in HOST) >= 15 and GPU and TWO


@pytest.mark.parametrize("page,parts", [h for h in HOST if h[1]],
                         ids=[h[0].name for h in HOST if h[1]])
def test_host_blocks_run_in_order(page, parts):
    _run(parts)


@pytest.mark.gpu
@pytest.mark.parametrize("label,source", GPU, ids=[g[0] for g in GPU])
def test_gpu_blocks_run(label, source):
    _run([(label, source)])


@pytest.mark.two_gpus
@pytest.mark.parametrize("label,source", TWO, ids=[t[0] for t in TWO])
def test_two_gpu_blocks_run_under_torchrun(label, source, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("torch sees fewer than two CUDA devices")
    script = tmp_path / "block.py"
    script.write_text(source, encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{label}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
