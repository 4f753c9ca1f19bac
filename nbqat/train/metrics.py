"""The main job's metrics: pinball loss, q-risk and the loss / gradient-norm statistics.

The formulas live in :mod:`nbqat.nn.loss` (``quantile_loss``, ``quantile_loss_grad``,
``q_risk``); this module only adapts them to the main job's layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nbqat.nn.loss import q_risk_table as q_risk

__all__ = ["grad_stats", "loss_stats", "pinball_loss", "q_risk"]


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
    from nbqat.nn import quantile_loss, quantile_loss_grad

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
