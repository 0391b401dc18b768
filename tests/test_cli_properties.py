"""Property-based tests (hypothesis) of the command line: any sequence of
flags and values exits 0, or 2 with one line naming what was wrong.

Profiles (conftest.py): "ci" is deterministic with a bounded example count;
METRALE_HYPOTHESIS_PROFILE=long runs many more examples locally.
"""

import contextlib
import io

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, strategies as st  # noqa: E402

from metrale import ModelConfig  # noqa: E402
from metrale.cli import main  # noqa: E402



# -- CLI ------------------------------------------------------------------------------------

flag_values = {
    "--preset": st.one_of(st.sampled_from(ModelConfig.presets()), st.text(max_size=5)),
    "--max-batch-tokens": st.one_of(st.sampled_from(["1", "16", "100", "-1", "0", "x", "",
                                                     str(2**36), str(2**64)])),
    "--max-seq-len": st.sampled_from(["0", "4096", "-3", "1e3", str(2**64)]),
    "--kv-block-size": st.sampled_from(["0", "16", "-1", "z"]),
    "--max-batch-size": st.sampled_from(["0", "32", "200", "-2"]),
    "--sm-count": st.sampled_from(["0", "132", "-1", "x"]),
    "--splitk": st.sampled_from(["legacy", "auto", "1", "16", "17", "", "0"]),
    "--config": st.sampled_from(["/nonexistent/config.json", "", "{}"]),
}
switches = ["--json", "--allocate", "--bogus"]


@given(st.lists(st.one_of(st.sampled_from(sorted(flag_values)).flatmap(
                    lambda f: flag_values[f].map(lambda v: [f, v])),
                st.sampled_from(switches).map(lambda s: [s])), max_size=5),
       st.sampled_from([["plan"], [], ["nope"]]))
def test_cli(parts, head):
    argv = head + [x for p in parts for x in p]
    if "--allocate" in argv:          # keep real allocations small (the default M is 8192)
        mbt = [p[1] for p in parts if p[0] == "--max-batch-tokens"]
        assume(mbt and mbt[-1] in ("1", "16", "100", str(2**36)))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    assert status in (0, 1, 2)
    if status:
        lines = err.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("metrale: error: "), err.getvalue()
    else:
        assert out.getvalue() and not err.getvalue()
