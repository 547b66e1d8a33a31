"""Array helpers the hot paths share."""

from __future__ import annotations

import numpy as np


def unique_sorted(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``: the distinct values in ascending order, by one sort. NumPy 2's
    own path for this call hashes first; on millions of distinct integers that took 50x as
    long here (12 M int64: 11.6 s against 0.21 s)."""
    flat = np.sort(np.ravel(values))
    if not len(flat):
        return flat
    keep = np.empty(len(flat), dtype=bool)
    keep[0] = True
    np.not_equal(flat[1:], flat[:-1], out=keep[1:])
    if flat.dtype.kind in "fc":  # NaNs sort last and count once, as np.unique's do
        nan = np.isnan(flat)
        keep[1:] &= ~(nan[1:] & nan[:-1])
    return flat[keep]
