"""The shipped CUDA kernels (src/metrale/kernels) against their sources, no GPU
needed: each PTX takes the parameter blocks its C headers declare today (the
check of tools/kernels.py, which the release runs on every wheel too), and,
where the nvcc release that built it is here, is what its .cu compiles to."""

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import metrale

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "kernels.py"
SOURCE = ROOT / "src" / "metrale" / "kernels"
INSTALLED = Path(metrale.__file__).parent / "kernels"


@pytest.fixture(scope="module")
def tool():
    if not TOOL.exists():
        pytest.skip(f"{TOOL} is not here (tests run from a copy, outside the source tree)")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to lay the headers' structs out")
    spec = importlib.util.spec_from_file_location("kernels_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dirs():
    """The kernel folders here: the source tree's, and the installed package's
    when this metrale ships kernels (a build with its CUDA backend)."""
    return [d for d in (SOURCE, INSTALLED) if (d / "zero_ranges.cu").is_file()]


@pytest.mark.parametrize("where", ["source", "installed"])
def test_each_ptx_takes_the_parameter_blocks_of_its_headers(tool, where):
    kdir = SOURCE if where == "source" else INSTALLED
    if not (kdir / "zero_ranges.cu").is_file():
        pytest.skip(f"no kernels in {kdir}")
    assert tool.check(kdir) == []


def test_the_parser_reads_every_entry_point(tool):
    """Golden: the entry points the CUDA backend looks up (_kernels.pyx), one
    by-value parameter each, the same in the PTX and the .cu."""
    want = {"zero_ranges": ["metrale_zero_ranges", "metrale_zero_rows_at"],
            "debug_ops": ["metrale_debug_fill", "metrale_debug_check", "metrale_debug_nonfinite",
                          "metrale_debug_fingerprint"],
            "copy_runs": ["metrale_copy_runs"]}
    for stem, names in want.items():
        ptx = tool.ptx_entries((SOURCE / f"{stem}.ptx").read_text())
        cu = tool.cu_kernels((SOURCE / f"{stem}.cu").read_text())
        assert sorted(ptx) == sorted(cu) == sorted(names)
        assert all(len(p) == 1 and p[0] > 0 for p in ptx.values())
    assert tool.ptx_entries(".entry k(\n\t.param .u64 .ptr .global .align 4 k_param_0,\n"
                            "\t.param .u32 k_param_1,\n\t.param .align 8 .b8 k_param_2[24]\n)") \
        == {"k": [8, 4, 24]}


def _copy_tree(tmp_path):
    """src/ as the kernels see it (headers and kernels), to change in a test."""
    src = tmp_path / "src"
    shutil.copytree(SOURCE, src / "metrale" / "kernels")
    shutil.copy(ROOT / "src" / "arena_core.h", src / "arena_core.h")
    return src


def test_a_field_added_to_a_header_makes_the_ptx_stale(tool, tmp_path):
    src = _copy_tree(tmp_path)
    h = src / "metrale" / "kernels" / "debug_ops.h"
    text = h.read_text()
    assert "    unsigned int per;" in text
    h.write_text(text.replace("    unsigned int per;", "    unsigned long long added;\n"
                              "    unsigned int per;", 1))
    problems = tool.check(src / "metrale" / "kernels")
    assert len(problems) == 4, problems
    for name in ("fill", "check", "nonfinite", "fingerprint"):
        assert any(f"metrale_debug_{name} takes parameters of" in p and "stale" in p
                   for p in problems), problems


def test_the_parameter_blocks_do_not_depend_on_the_buffer_table(tool, tmp_path):
    """The case of issues 22 and 23: the buffer table is data given at run
    time, so no buffer set, and no buffer added to REFERENCE, changes a
    kernel's parameter block.  Their sizes are literal constants of the
    kernel headers, and a buffer set's limits fit them."""
    from metrale.buffers import MAX_ZERO_ALL
    for h, name in (("zero_ranges.h", "MT_MAX_RANGES"), ("zero_ranges.h", "MT_MAX_ROWS_ENTRIES"),
                    ("debug_ops.h", "MT_DBG_MAX_ITEMS")):
        m = re.search(rf"^#define {name} (\d+)$", (SOURCE / h).read_text(), re.M)
        assert m, (h, name)
        if name == "MT_MAX_ROWS_ENTRIES":
            assert int(m.group(1)) == MAX_ZERO_ALL + 1 < 32     # one warp evaluates the table
        if name == "MT_MAX_RANGES":
            assert int(m.group(1)) > MAX_ZERO_ALL
    src = _copy_tree(tmp_path)
    core = src / "arena_core.h"
    core.write_text(core.read_text().replace("#define MT_MAX_BUFFERS 256", "#define MT_MAX_BUFFERS 512"))
    assert tool.check(src / "metrale" / "kernels") == []


def test_the_copy_kernels_block_fits_the_parameter_limit(tool):
    """metrale_copy_runs takes its MT_COPY_RUNS runs by value: three 8-byte
    fields and a 4-byte block start each, the count and the chunks a block
    (4 bytes each) and the sentinel start, under the 4,096 bytes of a
    kernel's parameters every driver takes (more needs CUDA 12.1 and a Volta)."""
    m = re.search(r"^#define MT_COPY_RUNS (\d+)$", (SOURCE / "copy_runs.h").read_text(), re.M)
    runs = int(m.group(1))
    size, = tool.c_sizes(["mt_copy_args"], ["copy_runs.h"], [SOURCE])
    assert size == -(-(runs * 28 + 4 + 8) // 8) * 8 <= 4096
    ptx = tool.ptx_entries((SOURCE / "copy_runs.ptx").read_text())
    assert ptx == {"metrale_copy_runs": [size]}


def test_a_missing_ptx_or_entry_point_is_reported(tool, tmp_path):
    src = _copy_tree(tmp_path)
    kdir = src / "metrale" / "kernels"
    (kdir / "zero_ranges.ptx").unlink()
    ptx = kdir / "debug_ops.ptx"
    ptx.write_text(ptx.read_text().replace("metrale_debug_fingerprint", "metrale_debug_old"))
    problems = tool.check(kdir)
    assert any(p.startswith("zero_ranges.ptx: missing") for p in problems), problems
    assert any("entry points" in p and "metrale_debug_old" in p for p in problems), problems


def test_the_release_checks_the_kernels_a_wheel_ships(tool, tmp_path):
    """check_files (tools/release.py's check of each wheel and sdist) on a
    wheel-like zip, folder entries included: clean as built, stale once a
    header grows."""
    import zipfile
    names = {f"metrale/kernels/{p.name}": p for p in SOURCE.iterdir() if p.is_file()}
    names |= {"metrale/arena_core.h": ROOT / "src" / "arena_core.h"}
    for grow in (False, True):
        whl = tmp_path / f"w{grow:d}.zip"
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr("metrale/kernels/", b"")
            for n, p in names.items():
                data = p.read_bytes()
                if grow and p.name == "zero_ranges.h":
                    data = data.replace(b"    int count;\n} mt_zero_args;",
                                        b"    int count;\n    int added[3];\n} mt_zero_args;")
                z.writestr(n, data)
        with zipfile.ZipFile(whl) as z:
            files = {n[len("metrale/"):]: n for n in z.namelist()}
            problems = tool.check_files(files, z.read, tmp_path / f"scratch{grow:d}")
        if grow:        # both zeroing kernels take the block (mt_rows_launch holds one)
            assert len(problems) == 2 and "metrale_zero_ranges takes" in problems[0] \
                and "metrale_zero_rows_at takes" in problems[1], problems
        else:
            assert problems == []


def test_shipped_ptx_matches_its_source(tool, tmp_path):
    """Each PTX is what its .cu (with the parameter blocks of its headers)
    compiles to; skipped without the nvcc release that built it."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    m = re.search(r"V\d+\.\d+\.\d+", subprocess.run([nvcc, "--version"], capture_output=True,
                                                    text=True, env=tool._env()).stdout)
    for kdir in _dirs():
        for cu in sorted(kdir.glob("*.cu")):
            shipped = cu.with_suffix(".ptx").read_text()
            if m is None or m.group(0) not in shipped:
                pytest.skip(f"nvcc here is {m and m.group(0)}, not the release that built {cu.name}'s PTX")
            out = tmp_path / f"{kdir.parent.name}-{cu.stem}.ptx"
            tool.build(nvcc, cu, out, includes=tool.include_dirs(kdir)[1:])

            def code(text):
                return [line for line in text.splitlines() if not line.startswith("//")]
            assert code(out.read_text()) == code(shipped), f"{cu} is not what its PTX was built from"
