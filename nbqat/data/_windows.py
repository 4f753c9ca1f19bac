"""TFT windows over :class:`SeriesData`: the split by time, standardisation, window batches.

Windows are index arrays (an entity and a forecast start) into shared per-row feature
matrices; :meth:`SplitWindows.batch` gathers one batch at a time, so no (N, k, m) copy of the
windows is ever made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nbqat.data._calendar import _CAL_GROUP, CALENDAR_FEATURES, calendar_features, default_season
from nbqat.data._series import DataError, SeriesData

__all__ = ["SplitWindows", "Windows", "make_windows", "seasonal_naive_quantiles"]


@dataclass
class SplitWindows:
    """The windows of one split (train, validation or test).

    A window is an (entity, forecast start) pair; :meth:`batch` gathers its arrays from the
    shared feature matrices of :class:`Windows`, so no window is stored twice.

    Parameters
    ----------
    name : str
        ``"train"``, ``"val"`` or ``"test"``.
    rows : ndarray
        int64 (n,): the global row (into the concatenated series) of each window's first
        forecast step.
    entity : ndarray
        int64 (n,): the entity of each window.
    parent : Windows
        The windows' shared feature matrices.
    """

    name: str
    rows: np.ndarray
    entity: np.ndarray
    parent: Windows = field(repr=False)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, idx: np.ndarray | slice | None = None):
        """Model inputs and standardised target of the windows ``idx``.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all; a large split then gathers large arrays,
            so training and evaluation pass batches of indices).

        Returns
        -------
        static : ndarray float32 (B, m_s)
        historical : ndarray float32 (B, k, m_z)
            Observed inputs (target first) and known inputs over the k history steps.
        future : ndarray float32 (B, tau, m_x)
            Known inputs over the tau forecast steps.
        target : ndarray float32 (B, tau)
            The standardised target (per-entity level/scale of the training split).
        """
        p = self.parent
        rows = self.rows if idx is None else self.rows[idx]
        ent = self.entity if idx is None else self.entity[idx]
        hist_idx = rows[:, None] + np.arange(-p.history, 0)
        fut_idx = rows[:, None] + np.arange(p.horizon)
        return (
            p.static[ent],
            p.hist_features[hist_idx],
            p.future_features[fut_idx],
            p.target_std[fut_idx],
        )

    def target(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """float32 (B, tau): the standardised target only (no input arrays gathered).

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all).
        """
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.target_std[rows[:, None] + np.arange(self.parent.horizon)]

    def target_raw(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """float64 (B, tau): the unscaled target over the forecast steps.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all).
        """
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.target_raw[rows[:, None] + np.arange(self.parent.horizon)]

    def history_raw(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """float64 (B, k): the unscaled target over the history steps.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all).
        """
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.target_raw[rows[:, None] + np.arange(-self.parent.history, 0)]

    def unscale(self, pred: np.ndarray, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """Undo the per-entity standardisation of predictions (B, tau[, Q]) -> float64.

        Parameters
        ----------
        pred : ndarray (B, tau) or (B, tau, Q)
            Standardised values (model outputs).
        idx : ndarray of int, slice or None
            The windows ``pred`` belongs to (default: all of the split, in order).
        """
        ent = self.entity if idx is None else self.entity[idx]
        lvl = self.parent.level[ent].reshape((-1,) + (1,) * (pred.ndim - 1))
        scl = self.parent.scale[ent].reshape((-1,) + (1,) * (pred.ndim - 1))
        return pred.astype(np.float64) * scl + lvl

    def seasonal_naive(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """float64 (B, tau): the seasonal-naive point forecast, ``y[t - season]``.

        For forecast step h (0-based) it is the target ``season * ceil((h + 1) / season)``
        steps earlier, i.e. the last observed season repeated; with hourly data, season 24 and
        tau 24 it is the value 24 hours earlier.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all).
        """
        p = self.parent
        rows = self.rows if idx is None else self.rows[idx]
        h = np.arange(p.horizon)
        lag = p.season * ((h // p.season) + 1)
        return p.target_raw[rows[:, None] + h - lag]

    def times(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """The time stamps (B, tau) of the forecast steps.

        Parameters
        ----------
        idx : ndarray of int, slice or None
            Which windows of the split (default: all).
        """
        rows = self.rows if idx is None else self.rows[idx]
        return self.parent.time[rows[:, None] + np.arange(self.parent.horizon)]


@dataclass
class Windows:
    """TFT windows over :class:`SeriesData` (the output of :func:`make_windows`).

    The series of all entities are concatenated row-wise into shared feature matrices;
    the splits hold only row indices (see :class:`SplitWindows`).

    Parameters
    ----------
    history, horizon, season : int
        k (encoder steps), tau (forecast steps), seasonal-naive period (steps).
    quantiles : tuple of float
    static : ndarray float32 (n_entities, m_s)
    hist_features : ndarray float32 (n_rows, m_z)
    future_features : ndarray float32 (n_rows, m_x)
    target_std : ndarray float32 (n_rows,)
    target_raw : ndarray float64 (n_rows,)
    time : ndarray (n_rows,)
    level, scale : ndarray float64 (n_entities,)
        Per-entity mean and standard deviation of the target on the training rows.
    entity_names, static_names, historical_names, future_names : list of str
    naive_residual_quantiles : ndarray float64 (n_entities, Q)
        Empirical quantiles of the seasonal-naive residual ``y[t] - y[t - season]`` on the
        training rows of each entity (see :func:`seasonal_naive_quantiles`).
    cutoffs : tuple
        The first time of the validation split and of the test split.
    target_name, source : str
        The target column and where the data came from.
    filled : dict
        ``SeriesData.filled``: the cells ``fill_gaps`` repaired per entity and column.
    step : numpy.timedelta64 or float
        The time step.
    train_stride, eval_stride : int
        Steps between consecutive windows of the training / evaluation splits.

    Attributes
    ----------
    train, val, test : SplitWindows
        The splits (set by :func:`make_windows`).
    """

    history: int
    horizon: int
    season: int
    quantiles: tuple[float, ...]
    static: np.ndarray
    hist_features: np.ndarray
    future_features: np.ndarray
    target_std: np.ndarray
    target_raw: np.ndarray
    time: np.ndarray
    level: np.ndarray
    scale: np.ndarray
    entity_names: list[str]
    static_names: list[str]
    historical_names: list[str]
    future_names: list[str]
    naive_residual_quantiles: np.ndarray
    cutoffs: tuple
    target_name: str
    source: str
    filled: dict = field(default_factory=dict)
    step: object = None
    train_stride: int = 1
    eval_stride: int = 1
    train: SplitWindows = field(init=False, repr=False)
    val: SplitWindows = field(init=False, repr=False)
    test: SplitWindows = field(init=False, repr=False)

    def summary(self) -> dict:
        """A JSON-friendly description (sizes, names, cutoffs)."""
        return {
            "source": self.source,
            "target": self.target_name,
            "entities": self.entity_names,
            "history": self.history,
            "horizon": self.horizon,
            "season": self.season,
            "train_stride": self.train_stride,
            "eval_stride": self.eval_stride,
            "static_inputs": self.static_names,
            "historical_inputs": self.historical_names,
            "future_inputs": self.future_names,
            "windows": {"train": len(self.train), "val": len(self.val), "test": len(self.test)},
            "val_start": str(self.cutoffs[0]),
            "test_start": str(self.cutoffs[1]),
            "step": str(self.step),
            "filled": self.filled,
        }


def _zscore_fit(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu = x.mean(axis=0)
    sd = x.std(axis=0)
    sd = np.where(sd > 1e-12 * np.maximum(1.0, np.abs(mu)), sd, 1.0)
    return mu, sd


def seasonal_naive_quantiles(
    y_train: np.ndarray, season: int, quantiles: Sequence[float]
) -> np.ndarray:
    """Empirical quantiles of the seasonal-naive residual ``y[t] - y[t - season]``.

    The seasonal-naive baseline predicts the quantile q as ``y[t - season] + r_q`` with
    ``r_q`` these residual quantiles, so it is a probabilistic baseline (a point forecast with a
    residual spread) and its P50 is the classic seasonal-naive point forecast shifted by the
    median residual (about 0).

    Parameters
    ----------
    y_train : ndarray (N,)
        The training rows of one entity's target.
    season : int
    quantiles : sequence of float

    Returns
    -------
    ndarray float64 (Q,)
        ``numpy.quantile(residuals, q)`` (linear interpolation), or zeros when the training
        rows are not longer than one season.
    """
    if len(y_train) <= season:
        return np.zeros(len(quantiles))
    r = y_train[season:] - y_train[:-season]
    return np.quantile(r, np.asarray(quantiles, dtype=np.float64))


def _check_options(data, history, horizon, split, season, train_stride, eval_stride, calendar):
    """Validate make_windows' options; return (season, calendar) resolved."""
    for name, v in (("history", history), ("horizon", horizon)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    for name, v in (("train_stride", train_stride), ("eval_stride", eval_stride)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if len(split) != 2 or not (0.0 < split[0] < split[1] < 1.0):
        raise ValueError(f"split must be two fractions 0 < a < b < 1, got {split!r}")
    if season is None:
        season = default_season(data, horizon)
        if season > history:
            raise ValueError(
                f"--history {history} is shorter than the seasonal-naive period of {season} "
                f"steps (one {'day' if season != horizon else 'horizon'} of the data's step "
                f"{data.step}) that the baseline reads from the history; use --history "
                f">= {season}"
            )
    if not isinstance(season, (int, np.integer)) or not (1 <= season <= history):
        raise ValueError(
            f"season must be an integer in [1, history={history}] (the seasonal-naive forecast "
            f"reads the history), got {season!r}"
        )
    calendar = tuple(calendar)
    bad = [c for c in calendar if c not in CALENDAR_FEATURES]
    if bad:
        raise ValueError(f"calendar features {bad} unknown; choose from {CALENDAR_FEATURES}")

    if (
        not data.known_names
        and "time_index" not in calendar
        and not (data.is_datetime and set(calendar) - {"time_index"})
    ):
        raise DataError(
            "the decoder has no known input: "
            + (
                "the time axis is numeric, so the calendar features (hour, dow, doy) do not "
                "apply; add time_index to --calendar or pass --known-cols"
                if not data.is_datetime
                else "keep a calendar feature (--calendar) or pass --known-cols"
            )
        )
    return int(season), calendar


def _known_inputs(data, e, i_val, calendar, t0, cut_val) -> tuple[np.ndarray, list[str]]:
    """Entity e's known inputs (calendar, time index, the user's standardised known columns)."""
    t = data.times[e]
    known_parts = []
    if data.is_datetime:
        cal, cal_names = calendar_features(t)
        step_s = int(data.step / np.timedelta64(1, "s"))  # type: ignore[operator]
        keep = [
            j
            for j, c in enumerate(cal_names)
            if _CAL_GROUP[c] in calendar and not (step_s >= 86400 and _CAL_GROUP[c] == "hour")
        ]
        cal = cal[:, keep]
        cal_names = [cal_names[j] for j in keep]
        known_parts.append(cal)
        tnum = (t - t0) / np.timedelta64(1, "s")
        tval = (cut_val - t0) / np.timedelta64(1, "s")
    else:
        cal_names = []
        tnum = t - t0
        tval = cut_val - t0
    if "time_index" in calendar:
        known_parts.append((2.0 * tnum / max(float(tval), 1e-300) - 1.0)[:, None])
    if data.known[e].shape[1]:
        mu_k, sd_k = _zscore_fit(data.known[e][:i_val])
        known_parts.append((data.known[e] - mu_k) / sd_k)
    if not known_parts:
        raise DataError(
            f"the decoder has no known input: --calendar {','.join(calendar)!r} gives no "
            f"feature for a time step of {data.step}; add doy, dow or time_index to "
            "--calendar or pass --known-cols"
        )
    return np.concatenate(known_parts, axis=1), cal_names


def _static_features(data, level, scale) -> tuple[np.ndarray, list[str]]:
    """Entity id, the user's static columns, target level and scale; z-scored across entities."""
    n_ent = len(data.entity_names)
    static_cols = [np.linspace(-1.0, 1.0, n_ent) if n_ent > 1 else np.zeros(1)]
    static_names = ["entity_id"]
    for j, c in enumerate(data.static_names):
        static_cols.append(data.static[:, j])
        static_names.append(c)
    static_cols += [level, scale]
    static_names += [f"{data.target_name}_level", f"{data.target_name}_scale"]
    s = np.stack(static_cols, axis=1)
    mu_s = s.mean(axis=0)
    sd_s = s.std(axis=0)
    s = np.where(sd_s > 0, (s - mu_s) / np.where(sd_s > 0, sd_s, 1.0), 0.0)
    return s, static_names


def _attach_splits(w: Windows, data: SeriesData, split_rows, split_ent, split) -> None:
    """Set ``w.train``, ``w.val``, ``w.test``; a split without a window is a DataError."""
    for name in ("train", "val", "test"):
        rows = np.concatenate(split_rows[name])
        ent = np.concatenate(split_ent[name])
        if len(rows) == 0:
            lens = dict(zip(data.entity_names, data.lengths))
            raise DataError(
                f"the {name} split has no window: a window needs history + horizon = "
                f"{w.history + w.horizon} consecutive steps, all {w.horizon} forecast steps "
                "inside the split "
                f"(split fractions {split}, series lengths {lens}); use a longer series, a "
                "shorter --history / --horizon, or other split fractions"
            )
        setattr(w, name, SplitWindows(name=name, rows=rows, entity=ent, parent=w))


def make_windows(
    data: SeriesData,
    *,
    history: int = 168,
    horizon: int = 24,
    split: tuple[float, float] = (0.7, 0.85),
    season: int | None = None,
    quantiles: Sequence[float] = (0.1, 0.5, 0.9),
    train_stride: int = 1,
    eval_stride: int = 1,
    calendar: Sequence[str] = CALENDAR_FEATURES,
) -> Windows:
    """Build TFT windows: features, standardisation fitted on train rows, split by time.

    Parameters
    ----------
    data : SeriesData
    history : int, default 168
        k, the encoder length in steps (one week of hours).
    horizon : int, default 24
        tau, the number of steps forecast.
    split : (float, float), default (0.7, 0.85)
        Cut points as fractions of the global time range ``[t_min, t_max]`` over all entities:
        rows with time before the first cut are training rows, before the second validation
        rows, the rest test rows. Cutting by time (not by row count) keeps every entity's
        training rows before every entity's validation and test rows.
    season : int, optional
        Period of the seasonal-naive baseline in steps. Default: one day for sub-daily date
        times (24 for hourly data), 7 for daily data, else ``horizon``.
    quantiles : sequence of float, default (0.1, 0.5, 0.9)
    train_stride, eval_stride : int, default 1
        Distance in steps between the forecast starts of consecutive windows in the training
        split and in the validation/test splits.
    calendar : sequence of str, default CALENDAR_FEATURES
        The derived known inputs: ``hour`` (hour of day, sub-daily steps), ``doy`` (day of
        year), ``dow`` (day of week), ``time_index``; the calendar ones need date times.

    Returns
    -------
    Windows

    Raises
    ------
    DataError
        When a split gets no window, or an entity has no training rows to fit its
        standardisation (the message gives the lengths needed).
    ValueError
        For a bad option (history, horizon, split, season, strides).

    Notes
    -----
    No leakage: a window belongs to the split that holds ALL of its forecast steps; its history
    may reach back into earlier splits (those values are observed before the forecast time).
    Every statistic (target level/scale, input standardisation, the naive residual quantiles)
    is computed on training rows only.

    Inputs of a window:

    * static (per entity): entity id (scaled to [-1, 1]), the user's static columns, the
      target's training level and scale; each standardised across entities (z-score; a column
      constant across entities becomes 0).
    * historical (k steps): the standardised target, the standardised observed inputs, then
      the known inputs below (the encoder also sees the past values of known inputs).
    * future (tau steps): the known inputs: for date times hour of day (sin, cos; only for
      sub-daily steps), day of year (sin, cos), day of week (scaled to [-1, 1]); always the time
      index (scaled so the training range maps to [-1, 1]) and the user's known columns
      (standardised per entity on training rows).

    A column with zero spread on the training rows (Sand Point's constant pressure) gets scale
    1 (it is centred only).
    """
    season, calendar = _check_options(
        data, history, horizon, split, season, train_stride, eval_stride, calendar
    )
    quantiles = tuple(float(q) for q in quantiles)
    t0 = min(t[0] for t in data.times)
    t1 = max(t[-1] for t in data.times)
    # Cut points on the step grid: t0 + round(fraction * span / step) * step.
    n_steps = (t1 - t0) / data.step
    cut_val = t0 + int(round(float(n_steps) * split[0])) * data.step
    cut_test = t0 + int(round(float(n_steps) * split[1])) * data.step

    n_ent = len(data.entity_names)
    level = np.zeros(n_ent)
    scale = np.ones(n_ent)
    hist_blocks, fut_blocks, ystd_blocks = [], [], []
    split_rows: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    split_ent: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    naive_q = np.zeros((n_ent, len(quantiles)))
    offset = 0
    cal_names: list[str] = []
    for e in range(n_ent):
        t = data.times[e]
        y = data.target[e]
        n = len(t)
        i_val = int(np.searchsorted(t, cut_val, side="left"))
        i_test = int(np.searchsorted(t, cut_test, side="left"))
        if i_val < 2:
            raise DataError(
                f"entity {data.entity_names[e]!r} has {i_val} row(s) in the training split "
                f"(before {cut_val}); each entity needs training rows to fit its standardisation"
            )
        lvl, scl = _zscore_fit(y[:i_val, None])
        level[e], scale[e] = lvl[0], scl[0]
        obs = np.concatenate([y[:, None], data.observed[e]], axis=1)
        mu, sd = _zscore_fit(obs[:i_val])
        obs_std = (obs - mu) / sd
        known, cal_names = _known_inputs(data, e, i_val, calendar, t0, cut_val)
        hist_blocks.append(np.concatenate([obs_std, known], axis=1).astype(np.float32))
        fut_blocks.append(known.astype(np.float32))
        ystd_blocks.append((y - level[e]) / scale[e])
        naive_q[e] = seasonal_naive_quantiles(y[:i_val], int(season), quantiles)
        # Forecast starts s (row index of the first forecast step) per split.
        bounds = {"train": (0, i_val), "val": (i_val, i_test), "test": (i_test, n)}
        for name, (lo, hi) in bounds.items():
            stride = train_stride if name == "train" else eval_stride
            first = max(lo, history)
            starts = np.arange(first, hi - horizon + 1, stride, dtype=np.int64)
            split_rows[name].append(starts + offset)
            split_ent[name].append(np.full(len(starts), e, dtype=np.int64))
        offset += n

    s, static_names = _static_features(data, level, scale)

    future_names = (
        cal_names + (["time_index"] if "time_index" in calendar else []) + list(data.known_names)
    )
    if not future_names:
        raise DataError(
            "the decoder has no known input: keep a calendar feature or pass --known-cols"
        )
    historical_names = [data.target_name] + list(data.observed_names) + future_names

    w = Windows(
        history=int(history),
        horizon=int(horizon),
        season=int(season),
        quantiles=quantiles,
        static=np.ascontiguousarray(s, dtype=np.float32),
        hist_features=np.ascontiguousarray(np.concatenate(hist_blocks), dtype=np.float32),
        future_features=np.ascontiguousarray(np.concatenate(fut_blocks), dtype=np.float32),
        target_std=np.concatenate(ystd_blocks).astype(np.float32),
        target_raw=np.concatenate(data.target).astype(np.float64),
        time=np.concatenate(data.times),
        level=level,
        scale=scale,
        entity_names=list(data.entity_names),
        static_names=static_names,
        historical_names=historical_names,
        future_names=future_names,
        naive_residual_quantiles=naive_q,
        cutoffs=(cut_val, cut_test),
        target_name=data.target_name,
        source=data.source,
        filled={e: dict(c) for e, c in data.filled.items()},
        step=data.step,
        train_stride=int(train_stride),
        eval_stride=int(eval_stride),
    )
    _attach_splits(w, data, split_rows, split_ent, split)
    return w
