"""The ridge baseline's closed form (:mod:`nbqat.train.baselines`): the centred normal
equations of a split's windows, their solution for a penalty, the point forecasts of several
solutions in one pass, and the residual quantiles.

Each forecast step is its own regression; a target entry ``fill_gaps`` invented
(:meth:`nbqat.data.SplitWindows.scored` False) has no weight in its step's fit, as in the
training loss: the step's means, cross products and residuals are those of the windows that
observed it. Without such entries (the default) the equations are shared by every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "CHUNK",
    "flatten_window",
    "normal_equations",
    "residual_quantiles",
    "solve",
    "stacked_means",
]

#: Windows per chunk when accumulating the normal equations (bounds the float64 design matrix).
CHUNK = 2048


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


def _chunks(n: int) -> list[np.ndarray]:
    return [np.arange(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]


def normal_equations(split: Any) -> tuple:
    """The centred normal equations of ``split``'s windows, accumulated over chunks of
    :data:`CHUNK` windows (float64; centred: numerically safer than raw sums).

    Parameters
    ----------
    split : nbqat.data.SplitWindows
        Its ``batch(idx)`` gives ``(static, historical, future, target)``, its ``scored(idx)``
        the observed target entries (None: all).

    Returns
    -------
    tuple
        ``(n, mean(X) (F,), mean(y) (tau,), Xc^T Xc (F, F), Xc^T yc (F, tau), part)``, ``Xc``
        centred on the mean over all ``n`` windows; ``mean(y)`` and ``Xc^T yc`` over each
        step's observed entries; ``part`` None, or ``(rows (d, F), kept (d, tau) bool)``: the
        centred rows of the ``d`` windows with an unobserved step, and which steps they
        observed (:func:`solve` takes them out of those steps' equations).

    Raises
    ------
    ValueError
        For fewer than 2 windows, or a step observed in fewer than 2 of them.
    """
    n = len(split)
    if n < 2:
        raise ValueError(f"the ridge baseline needs at least 2 training windows, got {n}")
    chunks = _chunks(n)
    every = split.scored()
    masked = every is not None and not every.all()
    sx: Any = 0.0
    sy: Any = 0.0
    cnt: Any = 0 if masked else n
    for idx in chunks:  # pass 1: the means
        s, h, f, y = split.batch(idx)
        sx = sx + flatten_window(s, h, f).sum(axis=0)
        if masked:
            keep = split.scored(idx)
            sy = sy + np.where(keep, y.astype(np.float64), 0.0).sum(axis=0)
            cnt = cnt + keep.sum(axis=0)
        else:
            sy = sy + y.astype(np.float64).sum(axis=0)
    if np.min(cnt) < 2:
        raise ValueError(
            f"the ridge baseline needs every forecast step observed in at least 2 training "
            f"windows, got {int(np.min(cnt))} (fill_gaps repaired the others): use more data"
        )
    mx, my = sx / n, sy / cnt
    xtx = np.zeros((mx.size, mx.size))
    xty = np.zeros((mx.size, my.size))
    rows, kept = [], []
    for idx in chunks:  # pass 2: the centred cross products
        s, h, f, y = split.batch(idx)
        xc = flatten_window(s, h, f) - mx
        xtx += xc.T @ xc
        if masked:
            keep = split.scored(idx)
            xty += xc.T @ np.where(keep, y.astype(np.float64) - my, 0.0)
            part = ~keep.all(axis=1)
            rows.append(xc[part])
            kept.append(keep[part])
        else:
            xty += xc.T @ (y.astype(np.float64) - my)
    return n, mx, my, xtx, xty, (np.concatenate(rows), np.concatenate(kept)) if masked else None


def solve(eq: tuple, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """``(coef (F, tau), intercept (tau,))`` float64 of the normal equations ``eq``
    (:func:`normal_equations`) with the penalty ``lam`` (``eq`` is not modified: a grid
    shares it). A step with unobserved entries is solved on its observed windows alone.

    Raises
    ------
    ValueError
        For ``lam`` 0 and collinear features.
    """
    n, mx, my, xtx0, xty, part = eq
    nf = mx.size
    xtx = xtx0.copy()
    xtx[np.diag_indices(nf)] += lam
    if lam == 0 and np.linalg.matrix_rank(xtx) < nf:
        raise ValueError(
            f"lam=0 (ordinary least squares) needs linearly independent features, but the "
            f"{nf} features of the {n} training windows are collinear (a constant input, or "
            "more features than windows): use lam > 0 (e.g. the default 1.0)"
        )
    coef = np.linalg.solve(xtx, xty)
    icpt = my - mx @ coef
    if part is None:
        return coef, icpt
    rows, kept = part
    for j in np.flatnonzero(~kept.all(axis=0)):  # the steps some windows did not observe
        out = rows[~kept[:, j]]
        nj = n - len(out)
        off = -out.sum(axis=0) / nj  # the observed windows' mean of Xc (Xc sums to 0)
        a = xtx - out.T @ out - nj * np.outer(off, off)
        coef[:, j] = np.linalg.solve(a, xty[:, j])
        icpt[j] = my[j] - (mx + off) @ coef[:, j]
    return coef, icpt


def stacked_means(
    split: Any, sols: Sequence[tuple[np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray]:
    """The point forecasts of several ridge solutions, in one pass over the windows.

    Parameters
    ----------
    split : nbqat.data.SplitWindows
    sols : sequence of (coef (F, tau), intercept (tau,))
        The L solutions (:func:`solve`).

    Returns
    -------
    means : ndarray float64 (n, tau, L)
        Standardised units.
    targets : ndarray float64 (n, tau)
        The windows' standardised targets, NaN where ``fill_gaps`` invented them
        (:meth:`~nbqat.data.SplitWindows.scored`).
    """
    coef = np.concatenate([c for c, _ in sols], axis=1)  # (F, L tau)
    icpt = np.concatenate([b for _, b in sols])
    tau = sols[0][1].size
    out, ys = [], []
    for idx in _chunks(len(split)):
        s, h, f, y = split.batch(idx)
        out.append((flatten_window(s, h, f) @ coef + icpt).reshape(len(idx), len(sols), tau))
        keep = split.scored(idx)
        y = y.astype(np.float64)
        ys.append(y if keep is None else np.where(keep, y, np.nan))
    return np.concatenate(out).transpose(0, 2, 1), np.concatenate(ys)


def residual_quantiles(y: np.ndarray, fit: np.ndarray, q: Sequence[float]) -> np.ndarray:
    """The empirical quantiles (tau, Q) float64 of the residuals ``y - fit`` (n, tau) per
    step, over the observed entries (``y`` NaN: not observed, :func:`stacked_means`)."""
    r = y - fit
    if np.isnan(r).any():
        return np.nanquantile(r, q, axis=0).T
    return np.quantile(r, q, axis=0).T
