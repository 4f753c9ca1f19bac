"""Calendar-month time axes: monthly, quarterly and yearly dates.

Calendar months are 28 to 31 days long, so such dates have no common step in seconds. The
loader detects them (:func:`month_axis`) and keeps their axis as ``datetime64[M]``: NumPy's
month counter (int64 months since 1970-01) whose arithmetic (``t + n * step``, ``(t1 - t0) /
step``) is the one every other date-time axis uses, with a step of ``k`` months. The day of
month the data spells its dates on is kept in ``SeriesData.month_day`` (:func:`month_dates`
spells them back).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from nbqat.data._series import DataError, SeriesData

__all__ = ["MONTH_END", "is_month_axis", "month_axis", "month_dates", "to_month_axis"]

#: ``SeriesData.month_day`` of dates on the last day of their month.
MONTH_END = -1


def is_month_axis(t: np.ndarray) -> bool:
    """Whether the times ``t`` are on a calendar-month axis (``datetime64[M]``).

    Parameters
    ----------
    t : ndarray

    Returns
    -------
    bool
    """
    return np.asarray(t).dtype == np.dtype("datetime64[M]")


def _anchor(t: np.ndarray) -> int:
    """The common day of month of the midnight dates ``t`` (``datetime64[s]``): 1 to 28,
    :data:`MONTH_END`, or 0 when they have none."""
    days = t.astype("datetime64[D]")
    if not bool(np.all(days == t)):  # a time of day other than midnight
        return 0
    months = t.astype("datetime64[M]")
    dom = (days - months.astype("datetime64[D]")).astype(np.int64) + 1
    if dom[0] <= 28 and bool(np.all(dom == dom[0])):
        return int(dom[0])
    if bool(np.all(days == (months + 1).astype("datetime64[D]") - 1)):
        return MONTH_END
    return 0


def month_axis(
    t: np.ndarray,
    per: list[Any],
    names: list[str] | None = None,
    where: Callable[[int], str] | None = None,
) -> tuple[np.ndarray, int]:
    """The calendar-month axis of the times ``t``, when they are monthly, quarterly or yearly.

    Dates (``datetime64[s]``) at midnight, all on the same day of month (at most 28) or all on
    the last day of their month, are whole numbers of months apart; they take this axis
    unless every difference within an entity is the same number of seconds (such data has a
    step in seconds already, and keeps it).

    Parameters
    ----------
    t : ndarray
        The parsed time column (``datetime64[s]`` or float64).
    per : list of slice or ndarray
        The rows of each entity (:func:`nbqat.data._regular.entity_rows`).
    names : list of str, optional
        The entity names (for the error below).
    where : callable, optional
        ``where(row)``: the row's place for messages (e.g. ``"data.csv, line 5"``).

    Returns
    -------
    (ndarray, int)
        ``(t as datetime64[M], day)`` with ``day`` the day of month (1 to 28) or
        :data:`MONTH_END`; ``(t, 0)`` unchanged for any other axis.

    Raises
    ------
    DataError
        (with ``names`` and ``where``) When every entity's dates are calendar-month dates but
        not all on the same day (one entity on the 1st, another on the last day of the month).
    """
    if t.dtype.kind != "M" or len(t) < 2:
        return t, 0
    day = _anchor(t)
    if day == 0:
        if names is not None and where is not None:
            _check_one_day(t, per, names, where)
        return t, 0
    if _one_step_in_seconds(t, per):
        return t, 0
    return t.astype("datetime64[M]"), day


def _one_step_in_seconds(t: np.ndarray, per: list[Any]) -> bool:
    """Whether every difference within an entity is the same number of seconds."""
    diffs = [np.diff(t[rows]) for rows in per]
    nonempty = [d for d in diffs if len(d)]
    return not nonempty or all(bool(np.all(d == nonempty[0][0])) for d in nonempty)


def _day_words(day: int) -> str:
    return "the last day of their month" if day == MONTH_END else f"day {day} of the month"


def _check_one_day(
    t: np.ndarray, per: list[Any], names: list[str], where: Callable[[int], str]
) -> None:
    """Refuse entities whose dates are each on one day of month, but not all on the same
    one (the table as a whole has no day to spell its months on)."""
    days = []  # (day, entity, first row) of each entity with rows
    for e, rows in enumerate(per):
        if len(t[rows]):
            days.append((_anchor(t[rows]), e, rows.start if isinstance(rows, slice) else rows[0]))
            if days[-1][0] == 0:
                return  # not monthly on its own: the step check's message says why
    other = next((p for p in days if p[0] != days[0][0]), None)
    if other is None or _one_step_in_seconds(t, per):  # one step in seconds: kept as before
        return
    (d0, e0, _), (d1, e1, row) = days[0], other
    raise DataError(
        f"{where(int(row))}: entity {names[e1]!r} has its dates "
        f"on {_day_words(d1)} and entity {names[e0]!r} on {_day_words(d0)}: monthly, "
        "quarterly or yearly dates are read as calendar months when every entity's dates are "
        "on the same day of month (at most 28) or all on the last day of their month; spell "
        "every entity's dates that way (e.g. all on the 1st: 2000-01-01, 2000-02-01, ...)"
    )


def month_dates(t: np.ndarray, day: int) -> np.ndarray:
    """The dates (``datetime64[s]``, midnight) of the months ``t`` spelled on ``day``.

    Parameters
    ----------
    t : ndarray
        ``datetime64[M]`` months; any other array is returned unchanged.
    day : int
        The day of month (1 to 28) or :data:`MONTH_END`.

    Returns
    -------
    ndarray
    """
    t = np.asarray(t)
    if not is_month_axis(t):
        return t
    if day == MONTH_END:
        return ((t + 1).astype("datetime64[D]") - 1).astype("datetime64[s]")
    return (t.astype("datetime64[D]") + (max(int(day), 1) - 1)).astype("datetime64[s]")


def to_month_axis(data: SeriesData) -> SeriesData:
    """``data`` on a calendar-month axis, for a run trained on one, when its dates are
    calendar-month dates that :func:`month_axis` left on their step in seconds (each entity's
    differences all the same number of seconds: a few rows, e.g. three yearly dates 365 days
    apart); else ``data`` itself.

    Parameters
    ----------
    data : SeriesData

    Returns
    -------
    SeriesData
    """
    if data.month_day or not data.is_datetime:
        return data
    day = _anchor(np.concatenate(data.times).astype("datetime64[s]"))
    if day == 0:
        return data
    months = [t.astype("datetime64[M]") for t in data.times]
    steps = {int(d) for m in months for d in np.diff(m).astype(np.int64)}
    if len(steps) != 1:  # single rows only, or not one step in months
        return data
    return replace(data, times=months, step=np.timedelta64(steps.pop(), "M"), month_day=day)
