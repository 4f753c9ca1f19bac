"""Baselines of the main job: the seasonal naive and a ridge regression on the flattened window.

A forecaster worth quantizing must beat a linear model on its own windows (Zeng et al., "Are
Transformers Effective for Time Series Forecasting?", AAAI 2023: linear forecasters beat several
transformer forecasters). :class:`RidgeBaseline` is that yardstick: one closed-form ridge
regression from every input of a window (all history steps' observed and known inputs, the
known future inputs and the static inputs) to the tau standardised targets, with P10/P90 (any
quantile) from the empirical quantiles of its training residuals per forecast step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RidgeBaseline", "flatten_window", "seasonal_naive_forecast"]

#: Windows per chunk when accumulating the normal equations (bounds the float64 design matrix).
_CHUNK = 2048


def flatten_window(static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
    """The flat feature vector of each window: ``[historical, future, static]``.

    The order is the one of the TFT's linear skip (:attr:`TFTConfig.linear_skip
    <nbqat.nn.TFTConfig>`): ``concat([historical.reshape(B, -1), future.reshape(B, -1), static],
    axis=1)``.

    Parameters
    ----------
    static : ndarray (B, m_s)
    historical : ndarray (B, k, m_z)
    future : ndarray (B, tau, m_x)

    Returns
    -------
    ndarray float64 (B, k * m_z + tau * m_x + m_s)

    Raises
    ------
    ValueError
        When the batch sizes differ or an input has the wrong number of dimensions.
    """
    s, h, f = (np.asarray(a) for a in (static, historical, future))
    if s.ndim != 2 or h.ndim != 3 or f.ndim != 3:
        raise ValueError(
            "static, historical and future must be 2-, 3- and 3-dimensional, got shapes "
            f"{s.shape}, {h.shape}, {f.shape}"
        )
    if not s.shape[0] == h.shape[0] == f.shape[0]:
        raise ValueError(
            f"static, historical and future must share the batch size, got {s.shape[0]}, "
            f"{h.shape[0]}, {f.shape[0]}"
        )
    n = s.shape[0]
    return np.concatenate(
        [h.reshape(n, -1), f.reshape(n, -1), s.reshape(n, -1)], axis=1, dtype=np.float64
    )


def seasonal_naive_forecast(split: Any) -> tuple[np.ndarray, np.ndarray]:
    """The seasonal-naive quantile forecast of a split, unscaled.

    ``P_q = y[t - season] + r_q`` with ``r_q`` the q-quantile of the seasonal residual on each
    entity's training rows (:func:`nbqat.data.seasonal_naive_quantiles`).

    Parameters
    ----------
    split : nbqat.data.SplitWindows

    Returns
    -------
    quantiles : ndarray float64 (n, tau, Q)
    point : ndarray float64 (n, tau)
        ``y[t - season]`` (the plotted naive line).
    """
    point = split.seasonal_naive()
    res = split.parent.naive_residual_quantiles[split.entity]  # (n, Q)
    return point[..., None] + res[:, None, :], point


class RidgeBaseline:
    """Ridge regression on the flattened window with empirical residual quantiles.

    ``yhat = X @ beta + b`` with ``X`` = :func:`flatten_window` (float64) and the standardised
    target of the tau forecast steps as ``y`` (n, tau); ``beta`` minimises
    ``||y - X beta - b||^2 + lam ||beta||^2`` (the intercept ``b`` is not penalised), in closed
    form: ``beta = (Xc^T Xc + lam I)^-1 Xc^T yc`` on the centred ``Xc, yc``, ``b = mean(y) -
    mean(X) beta`` (Hoerl & Kennard 1970; scikit-learn's ``Ridge(alpha=lam)``). The quantile q
    of step h is ``yhat_h + r_{q,h}``, ``r_{q,h}`` the empirical q-quantile (linear
    interpolation) of the training residuals ``y_h - yhat_h``.

    Parameters
    ----------
    lam : float, default 1.0
        The ridge penalty (>= 0; 0 is ordinary least squares, needs a full-rank design).
    quantiles : sequence of float, default (0.1, 0.5, 0.9)
        Strictly increasing, in (0, 1).

    Attributes
    ----------
    coef : ndarray float64 (F, tau) or None
        ``beta`` after :meth:`fit_split` (F = k m_z + tau m_x + m_s).
    intercept : ndarray float64 (tau,) or None
    residual_quantiles : ndarray float64 (tau, Q) or None

    Raises
    ------
    ValueError
        On a negative or non-finite ``lam`` or bad quantiles; from :meth:`fit_split`, for
        fewer than 2 windows, or ``lam=0`` with collinear features.
    """

    def __init__(self, lam: float = 1.0, quantiles: Sequence[float] = (0.1, 0.5, 0.9)) -> None:
        lam = float(lam)
        if not (np.isfinite(lam) and lam >= 0):
            raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
        q = tuple(float(x) for x in quantiles)
        if not q or any(not 0 < x < 1 for x in q) or any(a >= b for a, b in zip(q, q[1:])):
            raise ValueError(f"quantiles must be strictly increasing values in (0, 1), got {q}")
        self.lam = lam
        self.quantiles = q
        self.coef: np.ndarray | None = None
        self.intercept: np.ndarray | None = None
        self.residual_quantiles: np.ndarray | None = None

    def fit_split(self, split: Any) -> RidgeBaseline:
        """Fit on every window of ``split`` (a :class:`nbqat.data.SplitWindows`), in chunks."""
        n = len(split)
        if n < 2:
            raise ValueError(f"the ridge baseline needs at least 2 training windows, got {n}")
        chunks = [np.arange(i, min(i + _CHUNK, n)) for i in range(0, n, _CHUNK)]
        # pass 1: means; pass 2: centred normal equations (numerically safer than raw sums)
        sx: Any = 0.0
        sy: Any = 0.0
        for idx in chunks:
            s, h, f, y = split.batch(idx)
            sx = sx + flatten_window(s, h, f).sum(axis=0)
            sy = sy + y.astype(np.float64).sum(axis=0)
        mx, my = sx / n, sy / n
        nf = mx.size
        xtx = np.zeros((nf, nf))
        xty = np.zeros((nf, my.size))
        for idx in chunks:
            s, h, f, y = split.batch(idx)
            xc = flatten_window(s, h, f) - mx
            xtx += xc.T @ xc
            xty += xc.T @ (y.astype(np.float64) - my)
        xtx[np.diag_indices(nf)] += self.lam
        if self.lam == 0 and np.linalg.matrix_rank(xtx) < nf:
            raise ValueError(
                f"lam=0 (ordinary least squares) needs linearly independent features, but the "
                f"{nf} features of the {n} training windows are collinear (a constant input, or "
                "more features than windows): use lam > 0 (e.g. the default 1.0)"
            )
        self.coef = np.linalg.solve(xtx, xty)
        self.intercept = my - mx @ self.coef
        res = np.concatenate(
            [split.batch(idx)[3].astype(np.float64) - self._mean(split, idx) for idx in chunks]
        )
        self.residual_quantiles = np.quantile(res, self.quantiles, axis=0).T  # (tau, Q)
        return self

    def _mean(self, split: Any, idx: np.ndarray) -> np.ndarray:
        s, h, f, _ = split.batch(idx)
        return self.predict_mean(s, h, f)

    def predict_mean(
        self, static: np.ndarray, historical: np.ndarray, future: np.ndarray
    ) -> np.ndarray:
        """The point forecast ``X @ coef + intercept`` (B, tau) float64, standardised units.

        Raises
        ------
        RuntimeError
            Before :meth:`fit_split`.
        ValueError
            When the inputs do not flatten to the fitted number of features.
        """
        if self.coef is None or self.intercept is None:
            raise RuntimeError("RidgeBaseline: call fit_split() before predicting")
        x = flatten_window(static, historical, future)
        if x.shape[1] != self.coef.shape[0]:
            raise ValueError(
                f"the window flattens to {x.shape[1]} features, the baseline was fitted on "
                f"{self.coef.shape[0]}"
            )
        return x @ self.coef + self.intercept

    def predict(self, static: np.ndarray, historical: np.ndarray, future: np.ndarray) -> np.ndarray:
        """Quantile forecasts (B, tau, Q) float64 in standardised units (like the TFT's).

        Raises
        ------
        RuntimeError
            Before :meth:`fit_split`.
        """
        mean = self.predict_mean(static, historical, future)
        assert self.residual_quantiles is not None
        return mean[..., None] + self.residual_quantiles[None]

    def predict_split(self, split: Any, bs: int = _CHUNK) -> np.ndarray:
        """Unscaled quantile forecasts (n, tau, Q) float64 of every window of ``split``."""
        outs = []
        for i in range(0, len(split), bs):
            idx = np.arange(i, min(i + bs, len(split)))
            s, h, f, _ = split.batch(idx)
            outs.append(self.predict(s, h, f))
        return split.unscale(np.concatenate(outs))
