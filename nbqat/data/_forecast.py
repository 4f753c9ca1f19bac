"""Forecast windows over new data with a run's stored :class:`~nbqat.data.Scaling`.

``nbqat predict`` forecasts the ``horizon`` steps after each series' last target value (or
from an origin ``--at TIME``, or from every rolling origin of a backtest). The rows of the
forecast steps may be in the data (target empty, known columns filled) or not (then they are
generated from the time step; a model with known columns other than the calendar then needs
them). The model inputs are built by the training code's own path: the stored scaling's
:func:`~nbqat.data._scaling.entity_features` on each entity's rows, gathered by
:meth:`SplitWindows.batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from nbqat.data._calendar import axis_step
from nbqat.data._scaling import Scaling, entity_features
from nbqat.data._series import DataError, SeriesData
from nbqat.data._splits import SplitWindows, Windows

__all__ = ["ForecastWindows", "ShortSeriesError", "drop_short_entities", "forecast_windows"]


@dataclass
class ForecastWindows:
    """The forecast windows of ``nbqat predict`` and their raw inputs.

    Attributes
    ----------
    split : SplitWindows
        The windows over the data's rows (``batch()`` gives the model inputs, ``times()`` the
        forecast times, ``unscale()`` the target's units).
    run_entity : ndarray int64 (B,)
        Each window's entity as an index into the run's entity list.
    origin : ndarray int64 (B,)
        Each window's first forecast step as a row of its entity.
    time : ndarray (B, k + tau)
        The times of the history and forecast steps (``datetime64[s]`` or float64).
    history_raw : ndarray float64 (B, k, 1 + m_obs + m_known)
        The raw target, observed and known columns over the history steps.
    future_raw : ndarray float64 (B, tau, m_known)
        The raw known columns over the forecast steps.
    actual : ndarray float64 (B, tau)
        The target over the forecast steps (NaN where the data has none, and where
        ``fill_gaps`` repaired it: not an observation).
    skipped : dict
        ``{entity: reason}``: the entities too short to forecast, left out
        (:func:`drop_short_entities`).
    """

    split: SplitWindows
    run_entity: np.ndarray
    origin: np.ndarray
    time: np.ndarray
    history_raw: np.ndarray
    future_raw: np.ndarray
    actual: np.ndarray
    skipped: dict = field(default_factory=dict)


def _check_roles(data: SeriesData, sc: Scaling) -> None:
    got = (data.target_name, list(data.observed_names), list(data.known_names))
    want = (sc.target, list(sc.observed), list(sc.known))
    if got != want:
        raise DataError(
            f"the data's columns (target, observed, known) {got} are not the trained model's "
            f"{want}: give data with the training run's columns"
        )
    if data.is_datetime != sc.is_datetime:
        raise DataError(
            "the data's time column holds "
            + ("date times" if data.is_datetime else "numbers")
            + " but the model was trained on "
            + ("date times" if sc.is_datetime else "numbers")
        )
    got_s, want_s = axis_step(data), float(sc.step)
    got_m, want_m = bool(data.month_day), bool(sc.month_day)
    if got_m != want_m or abs(got_s - want_s) > 1e-9 * max(abs(got_s), abs(want_s)):
        step = _step_words(got_s, sc.is_datetime, got_m)
        trained = _step_words(want_s, sc.is_datetime, want_m)
        raise DataError(
            f"the data's time step is {step} but the model was trained on a time step of "
            f"{trained}: give data at the training run's step (resample it to {trained}), or "
            f"train a model on the {step} data"
        )


def _step_words(s: float, is_datetime: bool, months: bool = False) -> str:
    """A time step for messages: ``"1 hour"``, ``"15 minutes"`` (date times; ``s`` in
    seconds), ``"3 months"`` (``months``: a calendar-month axis, ``s`` in months), or the
    number (a numeric time axis)."""
    if months:
        return f"{s:g} month{'s' if s != 1 else ''}"
    if not is_datetime:
        return f"{s:g}"
    for n, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        k = s / n
        if k >= 1 and k == int(k):
            return f"{int(k)} {unit}{'s' if k != 1 else ''}"
    return f"{s:g} seconds"


def _spell(data: SeriesData, t: Any) -> str:
    """A time as the data spells it (for messages)."""
    from nbqat.data._timecol import format_times

    return format_times(np.asarray([t]), data.time_format, data.month_day)[0]


class ShortSeriesError(DataError):
    """An entity with too few rows with a target value for its forecast or backtest origins."""


def drop_short_entities(
    data: SeriesData, history: int, horizon: int, at: Any = None, backtest: Any = None
) -> tuple[SeriesData, dict[str, str]]:
    """``data`` without the entities too short to forecast (as :func:`forecast_windows` is
    asked to), and why each was dropped.

    Parameters
    ----------
    data : SeriesData
    history, horizon : int
        k and tau of the run.
    at, backtest
        As :func:`forecast_windows`.

    Returns
    -------
    (SeriesData, dict)
        The data of the other entities (``data`` itself when none is dropped) and ``{entity:
        reason}``.

    Raises
    ------
    DataError
        When no entity can be forecast (the first entity's reason), or another problem of an
        entity (an ``at`` off its grid ...).
    """
    keep, why = [], {}
    for e, name in enumerate(data.entity_names):
        try:
            _origins(data.times[e], _n_past(data, e), name, history, horizon, at, backtest)
        except ShortSeriesError as err:
            why[name] = str(err)
            continue
        keep.append(e)
    if not keep:
        raise ShortSeriesError(next(iter(why.values())))
    if not why:
        return data, {}
    names = [data.entity_names[e] for e in keep]

    def pick(per: list) -> list:
        return [per[e] for e in keep]

    sub = replace(
        data, entity_names=names, times=pick(data.times), target=pick(data.target),
        observed=pick(data.observed), known=pick(data.known), static=data.static[keep],
        filled={n: v for n, v in data.filled.items() if n in names},
        carried={n: v for n, v in data.carried.items() if n in names},
        filled_target=pick(data.filled_target) if data.filled_target else [],
    )  # fmt: skip
    return sub, why


def _n_past(data: SeriesData, e: int) -> int:
    """Rows of entity ``e`` up to its last target value (0 without one)."""
    has = np.flatnonzero(np.isfinite(data.target[e]))
    return int(has[-1]) + 1 if has.size else 0


def _origins(t: np.ndarray, n_past: int, name: str, k: int, tau: int, at: Any, bt: Any) -> Any:
    """The origin rows of one entity: after its last target value, at ``at``, or the rolling
    origins ``bt = (start, stride)`` whose forecast steps all have a target value (on the grid
    of ``start``: origins of that grid with fewer than ``k`` history rows are skipped, the grid
    is not moved); ``bt = (start, stride, True)``: from the entity's first row at or after
    ``start`` on its own grid (the default start, the run's test split start, which entities
    on another grid, e.g. quarters from February, do not hold)."""
    lo, hi = k, n_past  # an origin needs k history rows with a target value before it
    if n_past < k:
        raise ShortSeriesError(
            f"entity {name!r} has {n_past} rows with a target value; a forecast needs "
            f"--history {k} of them before its first step"
        )
    if at is None and bt is None:
        return np.array([n_past], dtype=np.int64)
    step = t[1] - t[0] if len(t) > 1 else None
    if bt is not None:
        start, stride, up = (*bt, False)[:3]
        first = lo if start is None else _row_of(t, start, step, name, "--start", up)
        if first < lo:  # the first origin of --start's grid with --history rows before it
            first += -(-(lo - first) // stride) * stride
        rows = np.arange(first, hi - tau + 1, stride, dtype=np.int64)
        if not len(rows):
            raise ShortSeriesError(
                f"entity {name!r}: no backtest origin from {start if start is not None else t[lo]}"
                f" has its {tau} forecast steps with target values (the last such origin is "
                f"{t[hi - tau] if hi - tau >= lo else 'none: the series is too short'}); use an "
                "earlier --start"
            )
        return rows
    o = _row_of(t, at, step, name, "--at")
    if not lo <= o <= hi:
        raise DataError(
            f"--at {at} is outside the data of entity {name!r}: an origin needs --history {k} "
            f"rows with a target value before it, so it must lie from {t[lo]} to "
            f"{_time_at(t, hi, step)}"
        )
    return np.array([o], dtype=np.int64)


def _time_at(t: np.ndarray, i: int, step: Any) -> Any:
    return t[i] if i < len(t) else t[-1] + (i - len(t) + 1) * step


def _row_of(t: np.ndarray, when: Any, step: Any, name: str, opt: str, up: bool = False) -> int:
    """The row of time ``when`` on the entity's regular axis (it may be past the end);
    ``up``: the first row at or after ``when`` (it may be before the start)."""
    d = (when - t[0]) / step if step is not None else 0.0
    if up:
        return int(np.ceil(float(d) - 1e-9))
    r = int(np.floor(float(d) + 1e-9))
    if abs(float(d) - r) > 1e-6:
        raise DataError(
            f"{opt} {when} is not on entity {name!r}'s time grid ({t[0]} + a multiple of "
            f"{step}): give one of its times, the nearest being "
            + " and ".join(str(_time_at(t, i, step)) for i in (r, r + 1) if i >= 0)
            + " (times with a UTC offset are read in UTC)"
        )
    if r < 0:
        raise DataError(f"{opt} {when} is before the data of entity {name!r} (from {t[0]})")
    return r


def _extend(data: SeriesData, e: int, n: int) -> tuple:
    """Entity ``e``'s times, target, observed and known columns extended to ``n`` rows (the
    generated rows: times from the step, values NaN); and the number of rows it had."""
    t, n0 = data.times[e], len(data.times[e])
    if n <= n0:
        return t, data.target[e], data.observed[e], data.known[e], n0
    extra = n - n0
    t = np.concatenate([t, t[-1] + np.arange(1, extra + 1) * data.step])

    def pad(a: np.ndarray) -> np.ndarray:
        return np.concatenate([a, np.full((extra,) + a.shape[1:], np.nan)])

    return t, pad(data.target[e]), pad(data.observed[e]), pad(data.known[e]), n0


def _check_future_known(data, sc, name, t, known, n0, origins, tau) -> None:
    """Every known column the forecast steps need has a value (no silent zero-fill)."""
    if not sc.known:
        return
    for o in origins:
        block = known[o : o + tau]
        bad = np.argwhere(~np.isfinite(block))
        if not len(bad):
            continue
        i, j = int(bad[0][0]) + int(o), int(bad[0][1])
        if i >= n0:
            raise DataError(
                f"the model uses the known column(s) {list(sc.known)}, which the data does "
                f"not give for the forecast steps of entity {name!r}: add the rows from "
                f"{_spell(data, t[max(n0, int(o))])} to {_spell(data, t[int(o) + tau - 1])} with "
                "those columns filled and "
                f"the target ({sc.target!r}) empty"
                + (f", or forecast from an origin whose {tau} steps the data holds, on or "
                   f"before {_spell(data, t[n0 - tau])} (--at TIME; Forecaster.predict(at=...))"
                   if n0 >= tau else "")
            )  # fmt: skip
        raise DataError(
            f"entity {name!r}: known column {sc.known[j]!r} has no value at {_spell(data, t[i])}, "
            "a forecast "
            "step; every known column needs a value in the rows to forecast"
        )


def forecast_windows(
    data: SeriesData,
    sc: Scaling,
    *,
    history: int,
    horizon: int,
    quantiles: Sequence[float],
    at: Any = None,
    backtest: tuple[Any, int] | None = None,
) -> ForecastWindows:
    """Forecast windows of every entity of ``data`` with the stored transform ``sc``.

    Parameters
    ----------
    data : SeriesData
        Loaded with ``future_rows=True`` (rows after the last target value are the steps to
        forecast) and the run's columns.
    sc : Scaling
        The run's stored transform (never refitted here).
    history, horizon : int
        k and tau of the run.
    quantiles : sequence of float
    at : numpy.datetime64 or float, optional
        The origin (first forecast step) of every entity's window; default the step after
        its last target value.
    backtest : (start, stride) or (start, stride, True), optional
        Rolling origins from ``start`` (None: the first possible) every ``stride`` steps,
        each with all its forecast steps holding target values; with ``True``, each entity's
        from its first row at or after ``start`` (a ``start`` off its grid is not refused).

    Returns
    -------
    ForecastWindows
        Its ``skipped``: the entities too short to forecast, left out.

    Raises
    ------
    DataError
        Columns other than the run's; a time axis of another kind (date times, numbers) or
        another time step than the run's; an entity the run does not know; too few history rows
        in every entity;
        an ``at`` outside the data or off its time grid; known values missing in the
        forecast steps (naming the column, the time and the rows to add).
    """
    _check_roles(data, sc)
    k, tau = int(history), int(horizon)
    data, skipped = drop_short_entities(data, k, tau, at, backtest)
    feats, raws, rows, ents = _entity_windows(data, sc, k, tau, at, backtest)
    idx = [sc.index(n) for n in data.entity_names]
    w = _windows(data, sc, idx, feats, raws, k, tau, quantiles)
    split = SplitWindows("forecast", np.concatenate(rows), np.concatenate(ents), w)
    hraw, kraw = np.concatenate([r[0] for r in raws]), np.concatenate([r[1] for r in raws])
    g = split.rows[:, None]
    return ForecastWindows(
        split=split,
        run_entity=np.asarray(idx, np.int64)[split.entity],
        origin=split.rows
        - np.concatenate([[0], np.cumsum([len(f[3]) for f in feats])])[split.entity],
        time=w.time[g + np.arange(-k, tau)],
        history_raw=hraw[g + np.arange(-k, 0)],
        future_raw=kraw[g + np.arange(tau)],
        actual=split.actual(),
        skipped=skipped,
    )


def _entity_windows(
    data: SeriesData, sc: Scaling, k: int, tau: int, at: Any, backtest: Any
) -> tuple[list, list, list, list]:
    """Each entity's ``(hist, fut, ystd, t)`` features, ``(raw inputs, known, y)`` columns,
    window origins (rows of the concatenated entities) and entity codes; each entity's data
    extended over its forecast steps, whose known values are checked."""
    feats, raws, rows, ents, offs = [], [], [], [], 0
    for e, name in enumerate(data.entity_names):
        r = sc.index(name)
        n_past = _n_past(data, e)
        o = _origins(data.times[e], n_past, name, k, tau, at, backtest)
        t, y, obs, known, n0 = _extend(data, e, int(o.max()) + tau)
        _check_future_known(data, sc, name, t, known, n0, o, tau)
        hist, fut, ystd = entity_features(sc, r, t, y, obs, known)
        feats.append((hist, fut, ystd, t))
        gap = np.zeros(len(t), bool)  # fill_gaps' repaired targets: no actual to score
        if data.filled_target:
            gap[:n0] = data.filled_target[e]
        obs = sc.observed_or_mean(r, obs)  # model.onnx reads the raw rows: the same inputs
        raws.append((np.concatenate([y[:, None], obs, known], axis=1), known, y, gap))
        rows.append(o + offs)
        ents.append(np.full(len(o), e, dtype=np.int64))
        offs += len(t)
    return feats, raws, rows, ents


def _windows(
    data: SeriesData, sc: Scaling, idx: list, feats: list, raws: list, k: int, tau: int,
    quantiles: Sequence[float],
) -> Windows:  # fmt: skip
    """The :class:`Windows` container over the concatenated entities (``idx``: their rows in
    the run's transform)."""
    return Windows(
        history=k, horizon=tau, season=k, quantiles=tuple(float(q) for q in quantiles),
        static=np.asarray(sc.static, np.float64)[idx].astype(np.float32),
        hist_features=np.concatenate([f[0] for f in feats]).astype(np.float32),
        future_features=np.concatenate([f[1] for f in feats]).astype(np.float32),
        target_std=np.concatenate([f[2] for f in feats]).astype(np.float32),
        target_raw=np.concatenate([r[2] for r in raws]), time=np.concatenate([f[3] for f in feats]),
        level=np.asarray(sc.level)[idx], scale=np.asarray(sc.scale)[idx],
        entity_names=list(data.entity_names), static_names=[], historical_names=[],
        future_names=sc.future_names, naive_residual_quantiles=np.zeros((len(idx), 0)),
        cutoffs=(None, None), target_name=sc.target, source=data.source, step=data.step,
        scaling=sc, filled_target=np.concatenate([r[3] for r in raws]),
    )  # fmt: skip
