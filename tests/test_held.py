"""metrale._base._held.Held: rows of integers in C storage, against a Python list
of the same operations; a change that fails keeps the rows held (they stand
for memory)."""

import gc

import pytest

from metrale._base._held import Held


def test_rows_behave_as_a_list_of_tuples():
    h, want = Held(3), []
    for row in [(5, 1, 2), (0, 7, 2**64 - 1), (3, 3, 3)]:
        h.append(row)
        want.append(row)
    h.extend([(9, 9, 9), (1, 0, 0)])
    want.extend([(9, 9, 9), (1, 0, 0)])
    h.remove((3, 3, 3))
    want.remove((3, 3, 3))
    assert list(h) == want and len(h) == len(want) and h[1] == want[1] and h[-1] == want[-1]
    assert (0, 7, 2**64 - 1) in h and (0, 7) not in h and [0, 7, 2**64 - 1] not in h
    h.sort()
    assert list(h) == sorted(want)
    h.replace([(1, 2, 3)] * 100)                    # grows past its first storage
    assert list(h) == [(1, 2, 3)] * 100
    h.clear()
    assert list(h) == [] and not h
    with pytest.raises(ValueError, match="not held"):
        h.remove((1, 2, 3))
    with pytest.raises(IndexError):
        h[0]


@pytest.mark.parametrize("bad,exc", [([(1, 2), (-1, 0)], OverflowError),
                                     ([(1, 2), (2**64, 0)], OverflowError),
                                     ([(1, 2), (1, 2, 3)], ValueError),
                                     ([(1, 2), (1, "x")], TypeError)])
def test_a_change_that_fails_keeps_the_rows(bad, exc):
    h = Held(2, [(7, 8), (9, 10)])
    for change in (h.replace, h.extend):
        with pytest.raises(exc):
            change(bad)
        assert list(h) == [(7, 8), (9, 10)]
    with pytest.raises(exc):
        h.append(bad[1])
    assert list(h) == [(7, 8), (9, 10)]


def test_the_collector_never_sees_it():
    h = Held(2, [(1, 2)])
    assert not gc.is_tracked(h)
    with pytest.raises(ValueError, match="width"):
        Held(0)
