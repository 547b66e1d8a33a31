"""The shared array helpers give what NumPy's own calls give."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from choreo.arrays import concat_ranges, unique_inverse, unique_sorted


@given(hnp.arrays(np.int64, st.integers(0, 200), elements=st.integers(-50, 50)))
def test_unique_sorted_of_integers_is_numpys_unique(values: np.ndarray) -> None:
    got = unique_sorted(values)
    assert got.dtype == values.dtype
    assert np.array_equal(got, np.unique(values))


@given(hnp.arrays(np.float64, st.integers(0, 200),
                  elements=st.floats(allow_nan=True, allow_infinity=True)))
def test_unique_sorted_of_floats_is_numpys_unique(values: np.ndarray) -> None:
    assert np.array_equal(unique_sorted(values), np.unique(values), equal_nan=True)


def test_a_two_dimensional_array_is_flattened_as_numpy_does() -> None:
    assert unique_sorted(np.array([[3, 1], [1, 2]])).tolist() == [1, 2, 3]


@given(hnp.arrays(st.sampled_from([np.int64, np.int32, np.uint16]), st.integers(0, 200),
                  elements=st.integers(0, 60)))
def test_unique_inverse_is_numpys_unique_with_inverse(values: np.ndarray) -> None:
    distinct, inverse = unique_inverse(values)
    want, want_inverse = np.unique(values, return_inverse=True)
    assert np.array_equal(distinct, want)
    assert np.array_equal(inverse, want_inverse)
    assert np.array_equal(distinct[inverse], values)


def test_unique_inverse_refuses_floats() -> None:
    with pytest.raises(TypeError, match="integer values only"):
        unique_inverse(np.array([0.5, 1.5]))


@given(hnp.arrays(np.int64, st.integers(0, 300),
                  elements=st.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max)))
def test_unique_inverse_over_the_whole_int64_range(values: np.ndarray) -> None:
    """The compiled radix sort: negative values, keys wider than one digit, long ties."""
    values = np.concatenate([values, values[: len(values) // 2]])
    distinct, inverse = unique_inverse(values)
    want, want_inverse = np.unique(values, return_inverse=True)
    assert np.array_equal(distinct, want)
    assert np.array_equal(inverse, want_inverse)


@given(st.lists(st.tuples(st.integers(-1000, 1000), st.integers(0, 20)), max_size=50))
def test_concat_ranges_is_each_range_in_turn(runs: list[tuple[int, int]]) -> None:
    starts = np.array([s for s, _ in runs], dtype=np.int64)
    lengths = np.array([n for _, n in runs], dtype=np.int64)
    want = [v for s, n in runs for v in range(s, s + n)]
    assert concat_ranges(starts, lengths).tolist() == want
