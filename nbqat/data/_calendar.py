"""Calendar features (hour of day, day of year, day of week), the time axis's step and the
default seasonal period."""

from __future__ import annotations

import numpy as np

from nbqat.data._months import is_month_axis
from nbqat.data._series import SeriesData

__all__ = [
    "CALENDAR_FEATURES",
    "axis_step",
    "calendar_features",
    "default_season",
    "month_features",
]

#: Derived known inputs (``calendar`` option of :func:`make_windows`).
CALENDAR_FEATURES = ("hour", "doy", "dow", "time_index")
_CAL_GROUP = {
    "hour_sin": "hour",
    "hour_cos": "hour",
    "doy_sin": "doy",
    "doy_cos": "doy",
    "day_of_week": "dow",
}


def axis_step(data: SeriesData) -> float:
    """The time step on the stored axis (``Scaling.seconds``'s units): in seconds (date
    times), in months (a calendar-month axis) or in the time column's units (numbers)."""
    if is_month_axis(data.times[0]):
        return float(data.step.astype(np.int64))  # type: ignore[union-attr]
    if data.is_datetime:
        return float(data.step / np.timedelta64(1, "s"))  # type: ignore[operator]
    return float(data.step)


def default_season(data: SeriesData, horizon: int) -> int:
    """The seasonal-naive period in steps (:func:`season_of`)."""
    return season_of(data, horizon)[0]


def season_of(data: SeriesData, horizon: int) -> tuple[int, str]:
    """The seasonal-naive period ``(steps, in words)``: one day of sub-daily date times, one
    week of daily ones, one year of weekly ones (52 weeks), of monthly or quarterly ones (a
    step of k months with k dividing 12, k < 12), else one horizon."""
    if is_month_axis(data.times[0]):
        k = int(data.step.astype(np.int64))  # type: ignore[union-attr]
        if 0 < k < 12 and 12 % k == 0:
            return 12 // k, "one year"
        return horizon, "one horizon"
    if data.is_datetime:
        step_s = int(axis_step(data))
        if step_s > 0 and 86400 % step_s == 0 and step_s < 86400:
            return 86400 // step_s, "one day"
        if step_s == 86400:
            return 7, "one week"
        if step_s == 7 * 86400:  # weekly: the same week of the last year
            return 52, "one year (52 weeks)"
    return horizon, "one horizon"


def calendar_features(t: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Calendar features of datetime64[s] times: hour of day and day of year as sin/cos,
    day of week scaled to [-1, 1]. On a calendar-month axis (``datetime64[M]`` times) only
    the month of year as sin/cos (named ``doy_sin``, ``doy_cos``: the ``doy`` group).

    Parameters
    ----------
    t : ndarray (n,)
        ``datetime64`` times.

    Returns
    -------
    (ndarray float64 (n, m), list of str)
        The features and their names.
    """
    if is_month_axis(t):
        return month_features(t.astype(np.int64))
    secs = t.astype("datetime64[s]").astype(np.int64)
    day = np.floor_divide(secs, 86400)
    sec_of_day = secs - day * 86400
    year_start = t.astype("datetime64[Y]").astype("datetime64[s]").astype(np.int64)
    next_year = (t.astype("datetime64[Y]") + 1).astype("datetime64[s]").astype(np.int64)
    frac_year = (secs - year_start) / (next_year - year_start)
    frac_day = sec_of_day / 86400.0
    dow = (day + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    feats = [
        np.sin(2 * np.pi * frac_day),
        np.cos(2 * np.pi * frac_day),
        np.sin(2 * np.pi * frac_year),
        np.cos(2 * np.pi * frac_year),
        dow / 3.0 - 1.0,
    ]
    names = ["hour_sin", "hour_cos", "doy_sin", "doy_cos", "day_of_week"]
    return np.stack(feats, axis=1), names


def month_features(months: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """The month of year as sin/cos of ``2 pi m / 12`` (``m`` = 0 for January) of the month
    numbers ``months`` (int64 months since 1970-01: ``datetime64[M]`` as integers).

    Parameters
    ----------
    months : ndarray int64 (n,)

    Returns
    -------
    (ndarray float64 (n, 2), list of str)
        The features and their names ``["doy_sin", "doy_cos"]``.
    """
    frac = np.mod(np.asarray(months, np.int64), 12) / 12.0
    feats = [np.sin(2 * np.pi * frac), np.cos(2 * np.pi * frac)]
    return np.stack(feats, axis=1), ["doy_sin", "doy_cos"]


# old private names (kept for callers of the former single module)
_default_season = default_season
_calendar = calendar_features
