"""The robust alpha-beta fit: accuracy under noise, outlier rejection, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from choreo_agents.fit import FitError, fit_alpha_beta
from choreo_agents.probes import DEFAULT_REPEATS, DEFAULT_SIZES

ALPHA = 0.7e-6
BETA = 1 / 450e9


def _samples(noise: float, seed: int, outliers: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = np.repeat(np.array(DEFAULT_SIZES), DEFAULT_REPEATS)
    times = (ALPHA + BETA * sizes) * (1 + noise * rng.standard_normal(len(sizes)))
    slow = rng.random(len(sizes)) < outliers
    times[slow] *= rng.uniform(3, 8, int(slow.sum()))
    return sizes, times


def test_alpha_and_beta_within_5_percent_at_10_percent_noise() -> None:
    sizes, times = _samples(0.10, seed=7)
    fit = fit_alpha_beta(sizes, times)
    assert fit.alpha == pytest.approx(ALPHA, rel=0.05)
    assert fit.beta == pytest.approx(BETA, rel=0.05)
    assert fit.samples + fit.rejected == len(sizes)


@pytest.mark.parametrize("seed", range(10))
def test_accuracy_holds_across_seeds(seed: int) -> None:
    fit = fit_alpha_beta(*_samples(0.10, seed))
    assert abs(fit.alpha / ALPHA - 1) < 0.05
    assert abs(fit.beta / BETA - 1) < 0.05


def test_exact_samples_give_exact_parameters() -> None:
    sizes = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    fit = fit_alpha_beta(sizes, 2e-6 + sizes / 1e10)
    assert fit.alpha == pytest.approx(2e-6, rel=1e-9)
    assert fit.bandwidth == pytest.approx(1e10, rel=1e-9)
    assert fit.residual_seconds < 1e-15
    assert fit.rejected == 0


def test_outliers_are_rejected_and_do_not_drag_the_fit() -> None:
    sizes, times = _samples(0.02, seed=3, outliers=0.1)
    robust = fit_alpha_beta(sizes, times)
    assert robust.rejected >= 3
    assert robust.beta == pytest.approx(BETA, rel=0.03)
    assert robust.alpha == pytest.approx(ALPHA, rel=0.05)
    plain_beta = np.polyfit(sizes, times, 1)[0]
    assert abs(plain_beta / BETA - 1) > abs(robust.beta / BETA - 1)


def test_confidence_grows_with_noise() -> None:
    quiet = fit_alpha_beta(*_samples(0.01, seed=1))
    loud = fit_alpha_beta(*_samples(0.20, seed=1))
    assert loud.relative_error > 5 * quiet.relative_error
    assert loud.residual_seconds > quiet.residual_seconds


def test_negative_alpha_is_clamped_to_zero() -> None:
    sizes = np.array([1e6, 2e6, 4e6, 8e6])
    fit = fit_alpha_beta(sizes, sizes / 1e10 - 1e-6)
    assert fit.alpha == 0.0
    assert fit.beta > 0


def test_non_finite_and_non_positive_samples_are_dropped() -> None:
    sizes = [1e3, 1e4, 1e5, 1e6, 1e6, 1e7]
    times = [1e-6 + s / 1e10 for s in sizes]
    times[1], times[3] = float("nan"), -1.0
    fit = fit_alpha_beta(sizes, times)
    assert fit.samples + fit.rejected == 4
    assert fit.bandwidth == pytest.approx(1e10, rel=1e-6)


@pytest.mark.parametrize(
    ("sizes", "times"),
    [
        ([1e3, 1e4], [1e-6, 2e-6]),
        ([1e3, 1e3, 1e3], [1e-6, 1e-6, 1e-6]),
        ([1e3, 1e4, 1e5], [float("inf")] * 3),
    ],
)
def test_underdetermined_samples_raise(sizes: list[float], times: list[float]) -> None:
    with pytest.raises(FitError):
        fit_alpha_beta(sizes, times)


def test_mismatched_lengths_raise() -> None:
    with pytest.raises(FitError, match="equally long"):
        fit_alpha_beta([1.0, 2.0, 3.0], [1.0, 2.0])
