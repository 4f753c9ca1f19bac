"""The main job's metrics: pinball loss, q-risk and the loss / gradient-norm statistics.

The formulas live in :mod:`nbqat.nn.loss` (``quantile_loss``, ``quantile_loss_grad``,
``q_risk``); this module only adapts them to the main job's layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from nbqat.nn.loss import q_risk_table as q_risk
from nbqat.nn.loss import quantile_loss, quantile_loss_grad

__all__ = ["diebold_mariano", "grad_stats", "loss_stats", "pinball_loss", "q_risk"]


def pinball_loss(
    pred: np.ndarray, target: np.ndarray, quantiles: Sequence[float]
) -> tuple[float, np.ndarray]:
    """Mean quantile (pinball) loss and its gradient with respect to ``pred``.

    ``QL(y, yhat, q) = q * max(y - yhat, 0) + (1 - q) * max(yhat - y, 0)`` averaged over all
    ``B * tau * Q`` entries (Lim et al. 2021, eq. 24, up to the normalisation), by
    :func:`nbqat.nn.quantile_loss` and :func:`nbqat.nn.quantile_loss_grad`.

    Parameters
    ----------
    pred : ndarray float (B, tau, Q)
    target : ndarray float (B, tau)
    quantiles : sequence of float (Q,)

    Returns
    -------
    loss : float
    grad : ndarray (B, tau, Q), dtype of ``pred``
        ``-q / n`` where ``y > yhat``, ``(1 - q) / n`` where ``y < yhat``, and ``0`` on a tie
        (a subgradient), ``n = B * tau * Q``.
    """
    t = target.astype(pred.dtype, copy=False)
    return quantile_loss(pred, t, quantiles), quantile_loss_grad(pred, t, quantiles)


def grad_stats(norms: Sequence[float], max_norm: float | None) -> dict:
    """Summary of a phase's per-step gradient norms (metrics.json ``grad_norm``).

    Parameters
    ----------
    norms : sequence of float
        The total gradient norm of every step (before clipping).
    max_norm : float or None
        The clipping threshold (None: no clipping, no step counted as clipped).

    Returns
    -------
    dict
        ``steps``, mean/std/min/median/p95/max, ``max_norm``, ``clipped_steps`` and
        ``clipped_fraction`` (``{"steps": 0}`` for no steps).
    """
    a = np.asarray(norms, dtype=np.float64)
    if len(a) == 0:
        return {"steps": 0}
    fired = int(np.sum(a > max_norm)) if max_norm is not None else 0
    return {
        "steps": len(a),
        "mean": float(a.mean()),
        "std": float(a.std()),
        "min": float(a.min()),
        "median": float(np.median(a)),
        "p95": float(np.quantile(a, 0.95)),
        "max": float(a.max()),
        "max_norm": max_norm,
        "clipped_steps": fired,
        "clipped_fraction": fired / len(a),
    }


def loss_stats(losses: Sequence[float]) -> dict:
    """Summary of a phase's per-step losses: steps, mean, std, final, all finite.

    Parameters
    ----------
    losses : sequence of float

    Returns
    -------
    dict
        ``{"steps": 0}`` for no steps.
    """
    a = np.asarray(losses, dtype=np.float64)
    if len(a) == 0:
        return {"steps": 0}
    return {
        "steps": len(a),
        "mean": float(a.mean()),
        "std": float(a.std()),
        "final": float(a[-1]),
        "finite": bool(np.all(np.isfinite(a))),
    }


def diebold_mariano(loss_a: np.ndarray, loss_b: np.ndarray, overlap: int = 1) -> dict:
    """Diebold-Mariano test of equal forecast accuracy of two forecasters on the same windows.

    The loss differential ``d_i = loss_a[i] - loss_b[i]`` (one value per forecast window, in
    time order) has mean ``dbar``; its long-run variance ``var = g_0 + 2 sum_k w_k g_k`` (``g_k``
    the lag-k autocovariance, divided by n) weighs the ``overlap - 1`` lags that overlapping
    windows correlate by construction fully (``w_k = 1``: Diebold & Mariano's truncated kernel)
    and tapers ``m = floor(4 (n / 100)^(2/9))`` further lags linearly (``w_k = 1 - (k - overlap
    + 1) / (m + 1)``: a trapezoidal flat-top kernel; with ``overlap`` 1 the Newey-West Bartlett
    estimate). ``L = overlap - 1 + m`` lags in all (at most n - 1); should that variance not be
    positive, the Bartlett weights ``1 - k / (L + 1)`` (never negative). ``DM = dbar / sqrt(var /
    n)`` is compared with the standard normal (two-sided). The Bartlett weights alone would
    shrink the overlap's covariances: with horizon 24 at stride 6 the test rejected a true null
    9 % of the time at p < 0.05. Diebold & Mariano, "Comparing Predictive Accuracy",
    J. Business & Economic Statistics 13 (1995); Politis & Romano, J. Time Series Analysis 16
    (1995) (flat-top kernels); Newey & West, Econometrica 55 (1987) and their lag rule,
    Rev. Econ. Studies 61 (1994).

    Parameters
    ----------
    loss_a, loss_b : array_like (n,)
        Per-window losses of the two forecasters (e.g. the mean P50 pinball loss of each
        window), ``n >= 2``.
    overlap : int, default 1
        How many consecutive windows share a forecast step (``ceil(horizon / stride)``):
        their errors are correlated by construction, so at least ``overlap - 1`` lags enter.

    Returns
    -------
    dict
        ``{"dm": statistic, "p_value": two-sided normal, "dm_hln": HLN-corrected statistic,
        "p_value_hln": two-sided Student-t (n - 1 df), "mean_diff": dbar, "lags": L, "n": n,
        "small_sample": n < 20 (L + 1)}``;
        negative ``dm``: ``a`` has the smaller loss. A constant differential has no variance:
        ``dm`` 0 and ``p_value`` 1 when it is 0, else ``dm`` None and ``p_value`` 0 (the HLN
        keys the same). ``dm_hln`` and ``p_value_hln`` are None when ``n`` is too small for the
        lags (HLN's factor not positive: ``n + 1 - 2h + h (h - 1) / n <= 0``, ``h = L + 1``).

    Notes
    -----
    The normal p-value is liberal at small ``n``: with 100 windows and overlap 24 it rejected
    a true null 29 % of the time at p < 0.05. Harvey, Leybourne & Newbold's correction
    (``dm_hln = dm * sqrt((n + 1 - 2h + h (h - 1) / n) / n)`` with ``h = L + 1``, the
    autocovariances the variance estimated, against Student's t with ``n - 1`` degrees of
    freedom) is what the job's verdicts use; it is still liberal when ``n`` is below about
    20 ``h`` (``small_sample``). The size by Monte Carlo at n = 30 / 100 / 432 is in
    ``benchmarks/dm_size.py`` and docs/semantics.md.

    Raises
    ------
    ValueError
        When the shapes differ, fewer than 2 windows are given or a loss is not finite.
    """
    a = np.asarray(loss_a, dtype=np.float64)
    b = np.asarray(loss_b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size < 2:
        raise ValueError(
            f"loss_a and loss_b must be 1-D of the same length >= 2, got {a.shape}, {b.shape}"
        )
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("loss_a and loss_b must be finite")
    d = a - b
    n = d.size
    var, lags = _long_run_variance(d, overlap)
    small = n < SMALL_SAMPLE_RATIO * (lags + 1)
    out = {"mean_diff": float(d.mean()), "lags": lags, "n": n, "small_sample": small}
    if var <= 0.0:  # a constant differential: no difference (p 1) or a certain one (p 0)
        same = bool(d.mean() == 0.0)
        dm, p = (0.0, 1.0) if same else (None, 0.0)
        return {"dm": dm, "p_value": p, "dm_hln": dm, "p_value_hln": p, **out}
    dm = float(d.mean()) / math.sqrt(var / n)
    p = math.erfc(abs(dm) / math.sqrt(2.0))
    return {"dm": dm, "p_value": p, **_hln(dm, n, lags + 1), **out}


def _long_run_variance(d: np.ndarray, overlap: int) -> tuple[float, int]:
    """``(var, L)``: the long-run variance of ``d`` over ``L`` lags, by the flat-top kernel or,
    should that not be positive, Bartlett's (:func:`diebold_mariano` has the formulas)."""
    n = d.size
    flat = max(int(overlap), 1) - 1  # lags correlated by construction: weight 1
    m = math.floor(4.0 * (n / 100.0) ** (2.0 / 9.0))
    lags = min(n - 1, flat + m)
    e = d - d.mean()
    g = [float(e[k:] @ e[: n - k]) / n for k in range(lags + 1)]
    var = g[0] + 2.0 * sum(
        min(1.0, 1.0 - (k - flat) / (m + 1.0)) * g[k] for k in range(1, lags + 1)
    )
    if var <= 0.0:  # the flat-top estimate is not always positive: Bartlett's is
        var = g[0] + 2.0 * sum((1.0 - k / (lags + 1.0)) * g[k] for k in range(1, lags + 1))
    return var, lags


#: Fewer windows than this many times the estimated lags (+1): ``small_sample`` (the measured
#: size at nominal 5 % was 7-18 % there, HLN-corrected; benchmarks/dm_size.py).
SMALL_SAMPLE_RATIO = 20


def _hln(dm: float, n: int, h: int) -> dict:
    """Harvey, Leybourne & Newbold's small-sample correction of a DM statistic of ``n``
    differentials whose variance used ``h - 1`` lags: ``dm * sqrt((n + 1 - 2h + h (h - 1) / n)
    / n)`` against Student's t with ``n - 1`` degrees of freedom (two-sided); ``None`` for both
    when the factor is not positive (too few windows). Int. J. Forecasting 13 (1997)."""
    from scipy import stats  # a dependency of this function only

    factor = (n + 1 - 2 * h + h * (h - 1) / n) / n
    if factor <= 0.0 or n < 2:
        return {"dm_hln": None, "p_value_hln": None}
    dm_hln = dm * math.sqrt(factor)
    return {"dm_hln": dm_hln, "p_value_hln": float(2.0 * stats.t.sf(abs(dm_hln), n - 1))}
