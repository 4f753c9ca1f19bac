"""Baselines of the main job: the seasonal naive and a ridge regression on the flattened window.

A forecaster worth quantizing must beat a linear model on its own windows (Zeng et al., "Are
Transformers Effective for Time Series Forecasting?", AAAI 2023: linear forecasters beat several
transformer forecasters). :class:`RidgeBaseline` is that yardstick: one closed-form ridge
regression from every input of a window (all history steps' observed and known inputs, the
known future inputs and the static inputs) to the tau standardised targets, with P10/P90 (any
quantile) from the empirical quantiles of its training residuals per forecast step.

The main job's ``ridge`` row is the strongest such model a practitioner would fit:
:func:`tune_ridge` chooses its history length (whole seasons, up to the longest the data
allows) and its penalty on the validation split (:class:`TunedRidge`). The fixed configuration
(the windows' history: the model's, or its ``--skip-history``; penalty 1) is the ``ridge_fixed``
row, and the start of the TFT's linear skip
(:func:`nbqat.train.recipe.init_linear_skip_from_ridge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbqat.train.ridge_solve import (
    CHUNK,
    flatten_window,
    normal_equations,
    residual_quantiles,
    solve,
    stacked_means,
)

__all__ = [
    "HISTORY_SEASONS",
    "LAMBDAS",
    "RidgeBaseline",
    "TunedRidge",
    "flatten_window",
    "ridge_histories",
    "seasonal_naive_forecast",
    "tune_ridge",
]


def seasonal_naive_forecast(split: Any) -> tuple[np.ndarray, np.ndarray]:
    """The seasonal-naive quantile forecast of a split, unscaled.

    ``P_q = y[t - k season] + r_{q,k}`` for a step ``k`` seasons after the last observed
    season (``k = h // season + 1`` at step ``h``, 0-based: 1 unless the horizon is longer
    than a season), with ``r_{q,k}`` the q-quantile of the residual ``y[t] - y[t - k season]``
    on each entity's training rows (:func:`nbqat.data.seasonal_naive_quantiles`). The one-season
    residual's spread under-covered the steps further back (a daily random walk, season 7,
    horizon 21: P10-P90 held 82 %, 72 %, 60 % of the actuals one, two, three weeks back).

    Parameters
    ----------
    split : nbqat.data.SplitWindows
        A split of :func:`nbqat.data.make_windows`' windows (their ``split_bounds`` name the
        training rows).

    Returns
    -------
    quantiles : ndarray float64 (n, tau, Q)
    point : ndarray float64 (n, tau)
        ``y[t - k season]`` (the plotted naive line).
    """
    from nbqat.data import seasonal_naive_quantiles

    p = split.parent
    point = split.seasonal_naive()
    back = np.arange(p.horizon) // p.season + 1  # seasons back of each step
    # (entities, seasons back, Q): each entity's training rows [a, b)
    res = np.array([
        [seasonal_naive_quantiles(p.target_raw[a:b], k * p.season, p.quantiles)
         for k in range(1, int(back[-1]) + 1)]
        for a, b in p.split_bounds["train"]
    ])  # fmt: skip
    return point[..., None] + res[split.entity][:, back - 1], point


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
        eq = normal_equations(split)
        self.coef, self.intercept = solve(eq, self.lam)
        fit, y = stacked_means(split, [(self.coef, self.intercept)])
        self.residual_quantiles = residual_quantiles(y, fit[..., 0], self.quantiles)
        return self

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

    def predict_split(self, split: Any, bs: int = CHUNK) -> np.ndarray:
        """Unscaled quantile forecasts (n, tau, Q) float64 of every window of ``split``."""
        outs = []
        for i in range(0, len(split), bs):
            idx = np.arange(i, min(i + bs, len(split)))
            s, h, f, _ = split.batch(idx)
            outs.append(self.predict(s, h, f))
        return split.unscale(np.concatenate(outs))


#: The history lengths :func:`tune_ridge` searches, in seasons (``Windows.season`` steps: one
#: day for sub-daily date times, 24 for hourly data; 7 for daily data; else the horizon).
HISTORY_SEASONS = (1, 2, 4, 7)
#: The ridge penalties :func:`tune_ridge` searches (log-spaced; 1 is the fixed baseline's).
LAMBDAS = (0.1, 1.0, 10.0, 100.0, 1000.0)


def ridge_histories(w: Any, seasons: Sequence[int] = HISTORY_SEASONS) -> tuple[dict, dict]:
    """The history lengths the tuned ridge may use on the windows ``w``, with their windows.

    The candidates are ``s * w.season`` for each ``s`` in ``seasons`` and the model's own
    ``w.history``. A candidate is allowed when its windows (:meth:`Windows.with_history
    <nbqat.data.Windows.with_history>`) have exactly the model's validation and test forecast
    starts (so every grid point is scored, and the chosen one tested, on the model's targets)
    and at least 2 training windows; the others are returned with the reason.

    Parameters
    ----------
    w : nbqat.data.Windows
        The model's windows (from :func:`nbqat.data.make_windows`).
    seasons : sequence of int, default HISTORY_SEASONS
        Positive multiples of the season.

    Returns
    -------
    allowed : dict of int to Windows
        By history, ascending; always holds ``w.history`` (with ``w`` itself).
    excluded : dict of int to str
        The candidates the data does not allow, and why.

    Raises
    ------
    ValueError
        For a season multiple that is not a positive integer.
    """
    if not seasons or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1
                          for s in seasons):  # fmt: skip
        raise ValueError(f"seasons must be positive integers, got {tuple(seasons)!r}")
    allowed: dict[int, Any] = {}
    excluded: dict[int, str] = {}
    for h in sorted({int(s) * int(w.season) for s in seasons} | {int(w.history)}):
        if h == w.history:
            allowed[h] = w
            continue
        if h >= len(w.target_std):
            excluded[h] = "longer than the data"
            continue
        wh = w.with_history(h)
        same = all(np.array_equal(getattr(wh, n).rows, getattr(w, n).rows) for n in ("val", "test"))
        if not same:
            excluded[h] = "a validation or test forecast start of the model has fewer earlier rows"
        elif len(wh.train) < 2:
            excluded[h] = f"{len(wh.train)} training window(s)"
        else:
            allowed[h] = wh
    return allowed, excluded


@dataclass
class TunedRidge:
    """The ridge baseline with the history and penalty chosen on validation (:func:`tune_ridge`).

    Attributes
    ----------
    ridge : RidgeBaseline
        The chosen fit (on every training window of :attr:`windows`).
    windows : nbqat.data.Windows
        The model's windows with the chosen history (the feature matrices are shared).
    history : int
    lam : float
    season : int
        The season the history grid is counted in.
    criterion : str
        What chose: ``"val_P50"`` (the P50 q-risk on the validation split), or
        ``"val_mean_q_risk"`` (the mean over the quantiles) when 0.5 is not a quantile.
    grid : list of dict
        Every grid point in search order: ``history``, ``lambda``, ``train_windows`` and the
        criterion's value.
    excluded : dict of int to str
        The history candidates the data does not allow (:func:`ridge_histories`).
    """

    ridge: RidgeBaseline
    windows: Any
    history: int
    lam: float
    season: int
    criterion: str
    grid: list = field(default_factory=list)
    excluded: dict = field(default_factory=dict)

    def predict_split(self, split: Any) -> np.ndarray:
        """Unscaled quantile forecasts (n, tau, Q) of the model's windows ``split``.

        The same forecast starts and targets, read with the chosen history.

        Parameters
        ----------
        split : nbqat.data.SplitWindows
            A split of the windows the baseline was tuned on (any history).

        Raises
        ------
        ValueError
            For windows of other data, or a start with fewer than :attr:`history` earlier rows
            in its entity.
        """
        from nbqat.data import SplitWindows

        w = self.windows
        if split.parent.target_std is not w.target_std:
            raise ValueError("the split is not one of the windows the ridge was tuned on")
        first = w.split_bounds["train"][split.entity, 0]
        if np.any(split.rows - first < self.history):
            raise ValueError(
                f"a window of the {split.name} split has fewer than history={self.history} "
                "earlier rows in its entity"
            )
        return self.ridge.predict_split(SplitWindows(split.name, split.rows, split.entity, w))

    def summary(self) -> dict:
        """The choice for metrics.json (strict JSON): history, lambda, grid, exclusions."""
        return {
            "history": self.history,
            "lambda": self.lam,
            "season": self.season,
            "history_seasons": self.history / self.season,
            "criterion": self.criterion,
            "grid": list(self.grid),
            "excluded_histories": {str(h): why for h, why in self.excluded.items()},
        }


def tune_ridge(
    w: Any,
    *,
    seasons: Sequence[int] = HISTORY_SEASONS,
    lambdas: Sequence[float] = LAMBDAS,
) -> TunedRidge:
    """The ridge baseline with its history and penalty chosen on the validation split.

    For every allowed history (:func:`ridge_histories`) the centred normal equations of its
    training windows are accumulated once; every penalty in ``lambdas`` solves them
    (:class:`RidgeBaseline`, residual quantiles included) and is scored on the model's
    validation windows by the P50 q-risk (unscaled, as on test). The lowest score wins (the
    first in the order history ascending, penalty ascending on a tie). Nothing of the test
    split is read.

    Parameters
    ----------
    w : nbqat.data.Windows
        The model's windows.
    seasons : sequence of int, default HISTORY_SEASONS
        The history grid in seasons (``w.season`` steps), plus ``w.history``.
    lambdas : sequence of float, default LAMBDAS
        The penalties (each finite, >= 0).

    Returns
    -------
    TunedRidge

    Raises
    ------
    ValueError
        For an empty or bad grid, or too few training windows (:class:`RidgeBaseline`).
    """
    from nbqat.nn.loss import q_risk_table

    if not lambdas:
        raise ValueError("lambdas must hold at least one penalty")
    q = tuple(w.quantiles)
    criterion = "val_P50" if 0.5 in q else "val_mean_q_risk"
    allowed, excluded = ridge_histories(w, seasons)
    grid: list[dict] = []
    best: tuple | None = None
    for h, wh in allowed.items():
        eq = normal_equations(wh.train)
        rs = [RidgeBaseline(lam, q) for lam in lambdas]  # validates the penalties
        sols = [solve(eq, r.lam) for r in rs]
        fit, yt = stacked_means(wh.train, sols)  # one pass over the windows for every penalty
        val = stacked_means(wh.val, sols)[0]
        y = wh.val.target_raw()
        for j, r in enumerate(rs):
            r.coef, r.intercept = sols[j]
            r.residual_quantiles = residual_quantiles(yt, fit[..., j], q)  # (tau, Q)
            qr = q_risk_table(wh.val.unscale(val[..., j, None] + r.residual_quantiles), y, q,
                              wh.val.scored())  # fmt: skip
            score = qr["P50"] if criterion == "val_P50" else float(np.mean(list(qr.values())))
            grid.append({"history": h, "lambda": r.lam, "train_windows": len(wh.train),
                         criterion: score})  # fmt: skip
            if best is None or score < best[0]:
                best = (score, r, wh)
    assert best is not None
    _, r, wh = best
    return TunedRidge(r, wh, int(wh.history), r.lam, int(w.season), criterion, grid, excluded)
