"""TFT windows over :class:`SeriesData`: the split by time, standardisation, window batches.

Windows are index arrays (an entity and a forecast start) into shared per-row feature
matrices; :meth:`SplitWindows.batch` gathers one batch at a time, so no (N, k, m) copy of the
windows is ever made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nbqat.data._calendar import CALENDAR_FEATURES, season_of
from nbqat.data._scaling import (
    Scaling,
    constant_calendar,
    entity_features,
    fit_scaling,
    zscore_fit,
)
from nbqat.data._series import DataError, SeriesData
from nbqat.data._splits import SplitWindows, Windows

__all__ = ["SplitWindows", "Windows", "make_windows", "seasonal_naive_quantiles"]

_zscore_fit = zscore_fit  # the former private name


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
        The lag: one season, or ``k`` seasons for the steps ``k`` seasons after the last
        observed one (:func:`nbqat.train.baselines.seasonal_naive_forecast`).
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
        season, words = season_of(data, horizon)
        if season > history:
            raise ValueError(
                f"--history {history} is shorter than the seasonal-naive period of {season} "
                f"steps ({words} of the data's step {data.step}) that the baseline reads from "
                f"the history; use --history >= {season}"
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
    twice = sorted({c for c in calendar if calendar.count(c) > 1})
    if twice:  # the same derived inputs twice: two identical input variables
        raise ValueError(f"calendar features {twice} named twice; name each once")

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


@dataclass
class _EntityPart:
    """One entity's rows: its feature blocks, target statistics and split boundaries."""

    level: float
    scale: float
    hist: np.ndarray  # float32 (n, m_z)
    fut: np.ndarray  # float32 (n, m_x)
    ystd: np.ndarray  # (n,)
    naive_q: np.ndarray  # (Q,)
    cal_names: list[str]
    bounds: dict[str, tuple[int, int]]  # split -> [first row, end row) of the entity


def _cut_points(data: SeriesData, split: tuple[float, float]) -> tuple[object, object, object]:
    """``(t0, cut_val, cut_test)``: the first time and the cuts on the step grid,
    ``t0 + round(fraction * span / step) * step``."""
    t0 = min(t[0] for t in data.times)
    t1 = max(t[-1] for t in data.times)
    n_steps = (t1 - t0) / data.step
    cut_val = t0 + int(round(float(n_steps) * split[0])) * data.step
    cut_test = t0 + int(round(float(n_steps) * split[1])) * data.step
    return t0, cut_val, cut_test


def _entity_part(data: SeriesData, e: int, sc: Scaling, i_val: int, i_test: int, season,
                 quantiles) -> _EntityPart:  # fmt: skip
    """Entity ``e``'s standardised features (``sc``: fitted on the training rows only)."""
    t, y = data.times[e], data.target[e]
    hist, known, ystd = entity_features(sc, e, t, y, data.observed[e], data.known[e])
    return _EntityPart(
        level=sc.level[e],
        scale=sc.scale[e],
        hist=hist.astype(np.float32),
        fut=known.astype(np.float32),
        ystd=ystd,
        naive_q=seasonal_naive_quantiles(y[:i_val], int(season), quantiles),
        cal_names=list(sc.calendar_names),
        bounds={"train": (0, i_val), "val": (i_val, i_test), "test": (i_test, len(t))},
    )


def _min_length(history: int, horizon: int, split: tuple[float, float]) -> int:
    """About the shortest series with a window in every split: the training split holds a
    whole window, validation and test their forecast steps."""
    val, test = split[1] - split[0], 1.0 - split[1]
    return max(math.ceil((history + horizon) / split[0]), math.ceil(horizon / val),
               math.ceil(horizon / test))  # fmt: skip


def _split_rows(
    data: SeriesData, cuts: tuple, history: int, horizon: int, split: tuple[float, float]
) -> list[tuple[int, int]]:
    """Per entity, the first row of its validation and of its test split; an entity without
    two training rows is a DataError (saying how long a series the splits need)."""
    rows = []
    for e, t in enumerate(data.times):
        i_val = int(np.searchsorted(t, cuts[1], side="left"))
        if i_val < 2:
            raise DataError(
                f"entity {data.entity_names[e]!r} has {i_val} row(s) in the training split "
                f"(before {cuts[1]}); each entity needs training rows to fit its "
                f"standardisation, and a window of history + horizon = {history + horizon} "
                f"steps: at split fractions {split} that takes a series of about "
                f"{_min_length(history, horizon, split)} steps or more (use a longer series or a "
                "shorter --history / --horizon)"
            )
        rows.append((i_val, int(np.searchsorted(t, cuts[2], side="left"))))
    return rows


def _attach_splits(w: Windows, data: SeriesData, parts: list[_EntityPart], split) -> None:
    """Set ``w.split_bounds`` (each split's global rows per entity) and ``w.train``, ``w.val``,
    ``w.test`` (:meth:`Windows.make_split`); a split without a window is a DataError."""
    offsets = np.concatenate([[0], np.cumsum(data.lengths)[:-1]]).astype(np.int64)
    w.split_bounds = {
        name: np.array([np.add(p.bounds[name], offsets[e]) for e, p in enumerate(parts)],
                       dtype=np.int64).reshape(len(parts), 2)
        for name in ("train", "val", "test")
    }  # fmt: skip
    for name in ("train", "val", "test"):
        sw = w.make_split(name)
        if len(sw) == 0:
            lens = dict(zip(data.entity_names, data.lengths))
            raise DataError(
                f"the {name} split has no window: a window needs history + horizon = "
                f"{w.history + w.horizon} consecutive steps, all {w.horizon} forecast steps "
                "inside the split "
                f"(split fractions {split}, series lengths {lens}: about "
                f"{_min_length(w.history, w.horizon, split)} steps or more); use a longer "
                "series or a shorter --history / --horizon"
            )
        setattr(w, name, sw)
    _check_every_entity_has_a_window(w, data)


def _check_every_entity_has_a_window(w: Windows, data: SeriesData) -> None:
    """An entity without a window in any split would be in the model (scaling, entity id)
    but never trained, validated or tested on: a DataError naming it and the fix (an entity
    that starts late, with windows in validation or test only, is kept)."""
    seen = np.concatenate([w.train.entity, w.val.entity, w.test.entity])
    none = np.setdiff1d(np.arange(len(data.entity_names)), seen)
    if len(none):
        names = [data.entity_names[int(i)] for i in none]
        raise DataError(
            f"entity {names[0]!r} ({data.lengths[int(none[0])]} rows) has no window in any "
            f"split: a window needs history + horizon = {w.history + w.horizon} consecutive "
            f"steps, so the model would never see it (entities so: {names[:5]}"
            f"{' ...' if len(names) > 5 else ''}); leave their rows out, give them more rows, "
            "or use a shorter --history / --horizon"
        )


def _assemble(
    data: SeriesData,
    parts: list[_EntityPart],
    cuts: tuple,
    calendar: Sequence[str],
    quantiles: tuple[float, ...],
    history: int,
    horizon: int,
    season: int,
    scaling: Scaling,
) -> Windows:
    """The :class:`Windows` of the entities' parts (without splits)."""
    cal_names = parts[-1].cal_names
    future_names = (
        cal_names + (["time_index"] if "time_index" in calendar else []) + list(data.known_names)
    )
    if not future_names:
        raise DataError(
            "the decoder has no known input: keep a calendar feature or pass --known-cols"
        )
    level = np.array([p.level for p in parts])
    scale = np.array([p.scale for p in parts])
    static = np.asarray(scaling.static, dtype=np.float64)
    static_names = ["entity_id", *data.static_names]
    static_names += [f"{data.target_name}_level", f"{data.target_name}_scale"]
    return Windows(
        history=int(history),
        horizon=int(horizon),
        season=int(season),
        quantiles=quantiles,
        static=np.ascontiguousarray(static, dtype=np.float32),
        hist_features=np.concatenate([p.hist for p in parts]),
        future_features=np.concatenate([p.fut for p in parts]),
        target_std=np.concatenate([p.ystd for p in parts]).astype(np.float32),
        target_raw=np.concatenate(data.target).astype(np.float64),
        time=np.concatenate(data.times),
        level=level,
        scale=scale,
        entity_names=list(data.entity_names),
        static_names=static_names,
        historical_names=[data.target_name] + list(data.observed_names) + future_names,
        future_names=future_names,
        naive_residual_quantiles=np.array([p.naive_q for p in parts]).reshape(len(parts), -1),
        cutoffs=cuts[1:],
        target_name=data.target_name,
        source=data.source,
        filled={e: dict(c) for e, c in data.filled.items()},
        carried={e: list(c) for e, c in getattr(data, "carried", {}).items()},
        step=data.step,
        scaling=scaling,
        filled_target=np.concatenate(data.filled_target) if data.filled_target else None,
    )


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
        Period of the seasonal-naive baseline in steps. Default: one day of sub-daily steps,
        7 days, 52 weeks, a year of monthly or quarterly dates, else ``horizon``.
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
        Its docstring lists the inputs of a window.

    Raises
    ------
    DataError
        When a split gets no window, or an entity has no training rows to fit its
        standardisation or no window at all (the message gives the lengths needed).
    ValueError
        For a bad option (history, horizon, split, season, strides).

    Notes
    -----
    No leakage: a window belongs to the split that holds ALL of its forecast steps; its history
    may reach back into earlier splits (those values are observed before the forecast time).
    Every statistic (target level/scale, input standardisation, the naive residual quantiles)
    is computed on training rows only.
    """
    season, calendar = _check_options(
        data, history, horizon, split, season, train_stride, eval_stride, calendar
    )
    quantiles = tuple(float(q) for q in quantiles)
    cuts = _cut_points(data, split)
    rows = _split_rows(data, cuts, history, horizon, split)
    sc = fit_scaling(data, [r[0] for r in rows], cuts, tuple(calendar))
    if not sc.future_names:
        useful = [c for c in ("doy", "dow", "time_index") if c not in constant_calendar(data)]
        raise DataError(
            f"the decoder has no known input: --calendar {','.join(calendar)!r} gives no "
            f"feature for a time step of {data.step}; add one of {', '.join(useful)} to "
            "--calendar or pass --known-cols"
        )
    parts = [
        _entity_part(data, e, sc, *rows[e], season, quantiles)
        for e in range(len(data.entity_names))
    ]
    w = _assemble(data, parts, cuts, calendar, quantiles, history, horizon, season, sc)
    w.train_stride, w.eval_stride = int(train_stride), int(eval_stride)
    _attach_splits(w, data, parts, split)
    return w
