"""The shared array helpers give what NumPy's own calls give."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from choreo.arrays import unique_sorted


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
