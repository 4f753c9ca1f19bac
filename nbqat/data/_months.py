"""Calendar-month time axes: monthly, quarterly and yearly dates.

Calendar months are 28 to 31 days long, so such dates have no common step in seconds. The
loader detects them (:func:`month_axis`) and keeps their axis as ``datetime64[M]``: NumPy's
month counter (int64 months since 1970-01) whose arithmetic (``t + n * step``, ``(t1 - t0) /
step``) is the one every other date-time axis uses, with a step of ``k`` months. The day of
month the data spells its dates on is kept in ``SeriesData.month_day`` (:func:`month_dates`
spells them back).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MONTH_END", "is_month_axis", "month_axis", "month_dates"]

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


def month_axis(t: np.ndarray, per: list[Any]) -> tuple[np.ndarray, int]:
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

    Returns
    -------
    (ndarray, int)
        ``(t as datetime64[M], day)`` with ``day`` the day of month (1 to 28) or
        :data:`MONTH_END`; ``(t, 0)`` unchanged for any other axis.
    """
    if t.dtype.kind != "M" or len(t) < 2:
        return t, 0
    day = _anchor(t)
    if day == 0:
        return t, 0
    diffs = [np.diff(t[rows]) for rows in per]
    nonempty = [d for d in diffs if len(d)]
    if not nonempty or all(bool(np.all(d == nonempty[0][0])) for d in nonempty):
        return t, 0
    return t.astype("datetime64[M]"), day


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
