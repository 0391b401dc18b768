"""Value strategies shared by the property-based tests (hypothesis): integers
of every width and numpy integer type, junk of other types, and what an
argument error must say.  Imported by the test_*_properties.py modules and
test_arena_machine.py, after they skip without hypothesis."""

import pytest

np = pytest.importorskip("numpy")
from hypothesis import strategies as st  # noqa: E402

ARG_ERRORS = (TypeError, ValueError)

# -- value strategies -------------------------------------------------------------------------

wide_ints = st.one_of(
    st.integers(0, 5000), st.integers(-2**70, 2**70),
    st.sampled_from([0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -1]))
int_like = st.one_of(wide_ints, wide_ints.filter(lambda v: -2**63 <= v < 2**63).map(np.int64),
                     st.integers(0, 2**64 - 1).map(np.uint64))
junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=8),
                 st.binary(max_size=4), st.lists(st.integers(), max_size=2), st.just(np.float32(1)),
                 st.just(np.True_))
anything = st.one_of(int_like, junk)


def _names_argument(e, *names):
    msg = str(e)
    return any(n in msg for n in names)
