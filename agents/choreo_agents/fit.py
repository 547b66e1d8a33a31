"""Robust fit of the alpha-beta cost model t = alpha + beta * n to timed transfers.

Transfer-time noise is roughly proportional to the time itself (clock jitter on small
messages, contention on large ones), so residuals are weighted relative to the model, and
a few samples hit by preemption or a concurrent job can be many times too slow. Plain
least squares lets those drag both parameters; here iteratively reweighted least squares
with Huber weights on the relative residuals down-weights moderate outliers, and samples
beyond ``reject`` robust scales (median absolute deviation) are dropped outright.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from choreo_agents.model import Fit

HUBER_K = 1.345
"""Huber's tuning constant: 95% efficiency under Gaussian noise."""


class FitError(ValueError):
    """The samples cannot determine alpha and beta (too few, one size, or non-finite)."""


def fit_alpha_beta(
    sizes: Sequence[float] | np.ndarray,
    times: Sequence[float] | np.ndarray,
    *,
    reject: float = 3.5,
    iterations: int = 30,
) -> Fit:
    """Fit t = alpha + beta * n; alpha >= 0 and beta > 0 are enforced.

    ``residual_seconds`` is the RMS residual of the kept samples, ``relative_error`` the
    relative standard error of beta (hence of the bandwidth): the fit's confidence.
    """
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    if n.shape != t.shape or n.ndim != 1:
        raise FitError("sizes and times must be equally long 1-D sequences")
    ok = np.isfinite(n) & np.isfinite(t) & (n >= 0) & (t > 0)
    n, t = n[ok], t[ok]
    if len(n) < 3 or len(np.unique(n)) < 2:
        raise FitError(f"need at least 3 samples over 2 sizes, got {len(n)} usable")
    keep = np.ones(len(n), dtype=bool)
    weights = np.ones(len(n))
    alpha, beta = _wls(n, t, 1.0 / t**2)
    for _ in range(iterations):
        model = np.maximum(alpha + beta * n, 1e-15)
        rel = (t - model) / model
        scale = _mad_scale(rel[keep])
        keep = np.abs(rel) <= reject * scale if scale > 0 else np.ones(len(n), dtype=bool)
        if keep.sum() < 3 or len(np.unique(n[keep])) < 2:
            keep = np.ones(len(n), dtype=bool)
        u = np.abs(rel) / scale if scale > 0 else np.zeros(len(n))
        huber = np.where(u <= HUBER_K, 1.0, HUBER_K / np.maximum(u, 1e-300))
        weights = np.where(keep, huber / model**2, 0.0)
        new_alpha, new_beta = _wls(n, t, weights)
        converged = abs(new_beta - beta) <= 1e-9 * abs(beta) and abs(new_alpha - alpha) <= max(
            1e-9 * abs(alpha), 1e-18
        )
        alpha, beta = new_alpha, new_beta
        if converged:
            break
    return _summarize(n, t, keep, weights, alpha, beta)


def _wls(n: np.ndarray, t: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Weighted least squares with alpha clamped at 0 (a negative latency is noise)."""
    sw = np.sqrt(w)
    design = np.column_stack([np.ones_like(n), n]) * sw[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, t * sw, rcond=None)
    if alpha < 0:
        alpha = 0.0
        beta = float(np.sum(w * n * t) / max(np.sum(w * n * n), 1e-300))
    beta = max(float(beta), 1e-30)
    return float(alpha), beta


def _mad_scale(values: np.ndarray) -> float:
    """Robust standard deviation: 1.4826 * median absolute deviation from the median."""
    if len(values) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


def _summarize(
    n: np.ndarray, t: np.ndarray, keep: np.ndarray, w: np.ndarray, alpha: float, beta: float
) -> Fit:
    used = int(keep.sum())
    resid = t[keep] - (alpha + beta * n[keep])
    rms = float(np.sqrt(np.mean(resid**2))) if used else 0.0
    alpha_se, beta_se = _stderr(n[keep], t[keep], w[keep], alpha, beta)
    return Fit(
        alpha=alpha,
        beta=beta,
        samples=used,
        rejected=len(n) - used,
        residual_seconds=rms,
        relative_error=beta_se / beta if beta > 0 else float("inf"),
        alpha_stderr=alpha_se,
    )


def _stderr(
    n: np.ndarray, t: np.ndarray, w: np.ndarray, alpha: float, beta: float
) -> tuple[float, float]:
    """Standard errors of (alpha, beta) from the weighted normal equations."""
    dof = len(n) - 2
    if dof <= 0 or not np.any(w > 0):
        return 0.0, 0.0
    x = np.column_stack([np.ones_like(n), n])
    xtwx = x.T @ (x * w[:, None])
    sigma2 = float(np.sum(w * (t - alpha - beta * n) ** 2) / dof)
    try:
        cov = np.linalg.inv(xtwx) * sigma2
    except np.linalg.LinAlgError:
        return 0.0, 0.0
    return float(np.sqrt(max(cov[0, 0], 0.0))), float(np.sqrt(max(cov[1, 1], 0.0)))
