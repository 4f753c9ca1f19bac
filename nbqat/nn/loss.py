"""Quantile (pinball) loss, its gradient, and the q-risk metric of the TFT paper."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check(y_pred: np.ndarray, target: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    y_pred = np.asarray(y_pred)
    target = np.asarray(target)
    q = np.asarray(quantiles, dtype=np.float64)
    if q.ndim != 1 or q.size == 0 or not np.all((q > 0) & (q < 1)):  # NaN is not in (0, 1)
        raise ValueError(f"quantiles must be a non-empty 1-D sequence in (0, 1), got {quantiles}")
    if y_pred.dtype.kind != "f" or target.dtype.kind not in "fiu":
        raise ValueError("y_pred must be a float array and target a real array")
    if y_pred.shape != target.shape + (q.size,):
        raise ValueError(
            f"y_pred must have shape target.shape + (num_quantiles,) = "
            f"{target.shape + (q.size,)}, got {y_pred.shape}"
        )
    return q


def _errors(
    y_pred: np.ndarray, target: np.ndarray, quantiles: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Checked ``(e, q)``: ``e = target[..., None] - y_pred`` (..., Q) and the quantile levels
    (Q,), both in ``y_pred``'s dtype."""
    q = _check(y_pred, target, quantiles)
    if np.size(target) == 0:
        raise ValueError(f"target is empty {np.shape(target)}: the mean loss needs an element")
    dt = y_pred.dtype
    return np.asarray(target, dtype=dt)[..., None] - y_pred, q.astype(dt)


def _pinball_terms(e: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The pinball terms ``QL = max(q * e, (q - 1) * e)`` of the errors ``e = y - yhat``
    (..., Q) at the levels ``q`` (Q,), in ``e``'s dtype: ``q * max(e, 0) + (1 - q) *
    max(-e, 0)``."""
    return np.maximum(q * e, (q - e.dtype.type(1)) * e)


def _mask(mask: np.ndarray | None, target: np.ndarray) -> np.ndarray | None:
    """``mask`` checked: None, or bool of ``target``'s shape."""
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != bool or m.shape != np.shape(target):
        raise ValueError(
            f"mask must be a bool array of the target's shape {np.shape(target)}, got "
            f"{m.dtype} {m.shape}; e.g. SplitWindows.scored(idx)"
        )
    return m


def quantile_loss(
    y_pred: np.ndarray,
    target: np.ndarray,
    quantiles: Sequence[float],
    mask: np.ndarray | None = None,
) -> float:
    """Mean pinball loss over every element and quantile (the elements of ``mask`` only).

    ``QL(y, yhat, q) = q * max(y - yhat, 0) + (1 - q) * max(yhat - y, 0)``, averaged over
    ``target.size * Q`` terms (Lim et al. eq. 24, normalised by the number of terms); with
    ``mask``, over the ``mask.sum() * Q`` terms of the entries it keeps (torch's
    ``(ql * mask).sum() / (mask.sum() * Q)``), 0.0 when it keeps none.

    Parameters
    ----------
    y_pred : ndarray (..., Q) float32 or float64
        Predicted quantiles; the last axis holds one prediction per quantile.
    target : ndarray (...) real
        Observed values, ``y_pred.shape[:-1]``; cast to ``y_pred``'s dtype.
    quantiles : sequence of Q floats in (0, 1)
        The quantile levels of ``y_pred``'s last axis, in that order.
    mask : ndarray of bool (...), optional
        ``target``'s shape: the entries that count (False: no weight in the loss or its
        gradient, e.g. a target ``fill_gaps`` invented); None (default): every entry.

    Returns
    -------
    float
        The loss; the terms are computed in ``y_pred``'s dtype and summed in float64.

    Raises
    ------
    ValueError
        On mismatched shapes (``mask``'s too, or a ``mask`` not bool), non-float predictions,
        quantiles outside (0, 1) (NaN included) or an empty ``target``.
    """
    e, qq = _errors(y_pred, target, quantiles)
    keep = _mask(mask, target)
    terms = _pinball_terms(e, qq)
    if keep is None:
        return float(np.sum(terms, dtype=np.float64) / terms.size)
    n = int(np.count_nonzero(keep)) * qq.size
    return float(np.sum(terms[keep], dtype=np.float64) / n) if n else 0.0


def quantile_loss_grad(
    y_pred: np.ndarray,
    target: np.ndarray,
    quantiles: Sequence[float],
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Gradient of :func:`quantile_loss` w.r.t. ``y_pred`` (same shape and dtype).

    ``d/dyhat = -q / n`` where ``y > yhat``, ``(1 - q) / n`` where ``y < yhat``, and 0 at a tie
    ``y == yhat`` (the subgradient torch gives for ``q * relu(e) + (1 - q) * relu(-e)``);
    ``n = target.size * Q``; with ``mask``, ``n = mask.sum() * Q`` and 0 where it is False.

    Parameters
    ----------
    y_pred, target, quantiles, mask
        As :func:`quantile_loss`.

    Returns
    -------
    ndarray (..., Q)
        ``d quantile_loss / d y_pred``, in ``y_pred``'s dtype.

    Raises
    ------
    ValueError
        As :func:`quantile_loss`.
    """
    e, qq = _errors(y_pred, target, quantiles)
    keep = _mask(mask, target)
    dt = e.dtype
    g = np.where(e > 0, -qq, np.where(e < 0, dt.type(1) - qq, dt.type(0))).astype(dt)
    if keep is None:
        return g * dt.type(1.0 / e.size)
    n = int(np.count_nonzero(keep)) * qq.size
    return np.where(keep[..., None], g * dt.type(1.0 / max(n, 1)), dt.type(0))


def q_risk(y_pred: np.ndarray, target: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Normalised quantile risk per quantile, ``2 * sum QL(y, yhat_q, q) / sum |y|``
    (Lim et al. sec. 6, "q-Risk"; use the unscaled target).

    Parameters
    ----------
    y_pred : ndarray (..., Q) float32 or float64
        Predicted quantiles, on the target's original (unscaled) scale.
    target : ndarray (...) real
        Observed values, ``y_pred.shape[:-1]``; ``sum(|target|)`` must not be 0.
    quantiles : sequence of Q floats in (0, 1)
        The quantile levels of ``y_pred``'s last axis, in that order.

    Returns
    -------
    ndarray (Q,) float64
        The q-risk of each quantile, computed in float64 (e.g. P50 and P90 risk for
        ``quantiles=(0.1, 0.5, 0.9)`` are entries 1 and 2).

    Raises
    ------
    ValueError
        On mismatched shapes, non-float predictions, quantiles outside (0, 1), or
        ``sum(|target|) == 0``.
    """
    q = _check(y_pred, target, quantiles)
    y = np.asarray(target, dtype=np.float64)
    e = y[..., None] - np.asarray(y_pred, dtype=np.float64)
    terms = _pinball_terms(e, q)
    denom = np.sum(np.abs(y))
    if denom == 0:
        raise ValueError("q_risk is undefined when sum(|target|) == 0")
    axes = tuple(range(terms.ndim - 1))
    return 2.0 * terms.sum(axis=axes) / denom


def q_risk_table(
    pred: np.ndarray,
    target: np.ndarray,
    quantiles: Sequence[float],
    scored: np.ndarray | None = None,
) -> dict[str, float]:
    """Normalised quantile loss ("q-risk") per quantile on the unscaled target.

    ``q-risk_q = 2 * sum QL(y, yhat_q, q) / sum |y|`` over all windows and forecast steps
    (Lim et al. 2021, Section 7), computed in float64 by :func:`q_risk`, one
    quantile at a time (each quantile's sum runs over its own contiguous terms).

    Parameters
    ----------
    pred : ndarray (n, tau, Q)
        Unscaled quantile forecasts.
    target : ndarray (n, tau)
        Unscaled actual values.
    quantiles : sequence of float
    scored : ndarray of bool (n, tau), optional
        The entries to score (both sums run over them only); default all. The main job passes
        :meth:`nbqat.data.SplitWindows.scored`: the steps ``fill_gaps`` repaired are not
        observations.

    Returns
    -------
    dict
        ``{"P10": ..., "P50": ..., "P90": ...}`` (keys ``P<round(100 q)>``).

    Raises
    ------
    ValueError
        Mismatched shapes (``scored``'s too), or a target that is zero everywhere it is
        scored (q-risk undefined).
    """
    p = np.asarray(pred, dtype=np.float64)
    y = np.asarray(target, dtype=np.float64)
    if scored is not None:
        keep = np.asarray(scored)
        if keep.dtype != bool or keep.shape != y.shape or p.shape[:-1] != y.shape:
            raise ValueError(
                f"scored must be a bool array of the target's shape {y.shape} (pred "
                f"{p.shape}), got {keep.dtype} {keep.shape}"
            )
        if not keep.all():  # every entry scored: the sums as without a mask, bit for bit
            p, y = p[keep], y[keep]
    return {
        f"P{round(100 * q)}": float(q_risk(p[..., j : j + 1], y, (q,))[0])
        for j, q in enumerate(quantiles)
    }
