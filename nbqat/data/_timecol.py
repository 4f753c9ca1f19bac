"""The time column of a table -> ``datetime64[s]`` (UTC for aware values) or float64 numbers."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from nbqat.data._months import month_dates
from nbqat.data._series import DataError

__all__ = ["parse_time_column"]

_OFFSET = r"(?:Z|[+-]\d{2}(?::?\d{2})?)$"
_QUARTER = re.compile(r"(\d{4})-?[Qq]([1-4])")  # 2000Q1, 2000-Q1: pandas' quarter periods


def quarter_start(v: str) -> str | None:
    """The date a quarter ``v`` such as ``2000Q3`` (pandas' ``str`` of a quarterly
    ``Period``) starts on, ``2000-07-01``; None when ``v`` is not one. The loader reads dates,
    not periods (pandas' own parsing of quarter strings is deprecated): a message's fix."""
    m = _QUARTER.fullmatch(str(v).strip())
    return None if m is None else f"{m.group(1)}-{3 * int(m.group(2)) - 2:02d}-01"


def parse_time_column(s: Any, col: str, where: Callable[[int], str]) -> np.ndarray:
    """Convert a pandas Series of times; raise DataError naming the first bad line.

    Numbers (int or float) give float64. Date times (``datetime64``, aware or naive, or ISO 8601
    strings) give ``datetime64[s]``; aware values are converted to UTC. Values with and
    without a UTC offset in one column are refused (they cannot be put on one time axis
    without guessing the zone of the naive ones).
    """
    import pandas as pd

    miss = s.isna().to_numpy()
    if miss.any():
        i = int(np.argmax(miss))
        raise DataError(
            f"{where(i)}: column {col!r} (--time-col) has a missing value; every row needs a "
            "time stamp"
        )
    if pd.api.types.is_numeric_dtype(s.dtype) and s.dtype != bool:
        return _finite(s.to_numpy(dtype=np.float64), col, where)
    if isinstance(s.dtype, pd.DatetimeTZDtype):
        return _naive_utc(s)
    if pd.api.types.is_datetime64_dtype(s.dtype):
        return s.to_numpy().astype("datetime64[s]", copy=False)
    st = s.astype(str).str.strip()
    try:  # the common case: one ISO 8601 column, naive or all with the same offset
        with warnings.catch_warnings():  # pandas < 3: mixed offsets warn (sent on below)
            warnings.simplefilter("ignore", FutureWarning)
            dt = pd.to_datetime(st, format="ISO8601")
    except (ValueError, TypeError, OverflowError):
        return _diagnose(st, col, where)
    # pandas reads a blank value as NaT without an error; pandas < 3 returns mixed offsets
    # (naive with aware, or a DST change) as an object column where pandas 3 raises
    if dt.dtype == object or dt.isna().any():
        return _diagnose(st, col, where)
    if isinstance(dt.dtype, pd.DatetimeTZDtype):
        return _naive_utc(dt)
    return dt.to_numpy().astype("datetime64[s]")


def _diagnose(st: Any, col: str, where: Callable[[int], str]) -> np.ndarray:
    """The slow path: blank values, mixed time zones, numbers among dates, unparsable values."""
    import pandas as pd

    blank = (st == "").to_numpy()
    if blank.any():
        i = int(np.argmax(blank))
        raise DataError(
            f"{where(i)}: column {col!r} (--time-col) has a missing value; every row needs a "
            "time stamp"
        )

    num = pd.to_numeric(st, errors="coerce")
    if num.notna().all():
        return _finite(num.to_numpy(dtype=np.float64), col, where)
    # after the date (10 characters): a date's '-02' (the day) is no UTC offset
    has_tz = st.str.slice(10).str.contains(_OFFSET, regex=True).to_numpy()
    if has_tz.any() and not has_tz.all():
        i, j = int(np.argmax(has_tz)), int(np.argmax(~has_tz))
        raise DataError(
            f"{where(max(i, j))}: column {col!r} mixes time zones: {st.iloc[i]!r} "
            f"({where(i).rsplit(', ', 1)[-1]}) has a UTC offset, {st.iloc[j]!r} "
            f"({where(j).rsplit(', ', 1)[-1]}) has none; give every time stamp an offset "
            "(or none) so all series share one time zone"
        )
    dt = pd.to_datetime(st, format="ISO8601", errors="coerce", utc=bool(has_tz.all()))
    bad = dt.isna().to_numpy()
    if bad.any():
        numeric = num.notna().to_numpy()
        if numeric.any() and (~numeric & ~bad).any():
            i = int(np.argmax(numeric))
            raise DataError(
                f"{where(i)}: column {col!r} mixes date times and plain numbers ({st.iloc[i]!r})"
            )
        i = int(np.argmax(bad))
        date = quarter_start(st.iloc[i])
        if date is not None:
            raise DataError(
                f"{where(i)}: time value {st.iloc[i]!r} is a quarter, not a date time; give "
                f"each quarter as the date it starts ({date}), e.g. with pandas df[{col!r}] = "
                f"pd.PeriodIndex(df[{col!r}], freq='Q').to_timestamp(): quarterly dates step "
                "by 3 calendar months"
            )
        raise DataError(
            f"{where(i)}: time value {st.iloc[i]!r} is neither a number nor an ISO 8601 date "
            f"time (e.g. 2001-01-31T23:00); fix the value, convert the column with pandas first "
            f"(df[{col!r}] = pd.to_datetime(df[{col!r}], format=...): a DataFrame's datetime "
            "column is read as it is), or choose another --time-col"
        )
    if isinstance(dt.dtype, pd.DatetimeTZDtype):
        return _naive_utc(dt)
    return dt.to_numpy().astype("datetime64[s]")


def _naive_utc(s: Any) -> np.ndarray:
    return s.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy().astype("datetime64[s]")


def _finite(x: np.ndarray, col: str, where: Callable[[int], str]) -> np.ndarray:
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{where(i)}: column {col!r} (--time-col) has a non-finite time value "
            f"{float(x[i])!r}; a numeric time axis needs finite step numbers"
        )
    return x


def time_spelling(s: Any) -> str:
    """How the time column ``s`` spells its values, read from its first value.

    Returns
    -------
    str
        A :meth:`datetime.strftime` format (``%Y-%m-%dT%H:%M``, ``%Y-%m-%d %H:%M:%S``,
        ``%Y-%m-%d``, ``%Y/%m/%d`` or ``%Y.%m.%d`` for dates spelled so, ``%Y-%m`` for
        year-month values such as ``2024-03``; with the first value's UTC offset appended as
        it spells it (``Z``, ``+02:00``, ``-0500``) when the values carry one, so that
        :func:`format_times` writes the times, read as UTC, back at that offset; a
        time-zone-aware ``datetime64`` column gets its first value's offset, ``+01:00``),
        ``"integer"`` for whole numbers or ``"number"``.
    """
    import pandas as pd

    if len(s) == 0:
        return "%Y-%m-%dT%H:%M:%S"
    if pd.api.types.is_numeric_dtype(s.dtype) and s.dtype != bool:
        x = s.to_numpy(dtype=np.float64)
        return "integer" if bool(np.all(np.mod(x[np.isfinite(x)], 1.0) == 0)) else "number"
    aware = getattr(getattr(s.dtype, "pyarrow_dtype", None), "tz", None)  # timestamp[pyarrow]
    if isinstance(s.dtype, pd.DatetimeTZDtype) or aware:  # read as UTC (parse_time_column)
        first = pd.Timestamp(s.dropna().iloc[0]) if s.notna().any() else None
        off = int(first.utcoffset().total_seconds()) if first is not None else 0
        sign, off = "-" if off < 0 else "+", abs(off)
        return f"%Y-%m-%dT%H:%M:%S{sign}{off // 3600:02d}:{off % 3600 // 60:02d}"
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        return "%Y-%m-%dT%H:%M:%S"
    v = str(s.iloc[0]).strip()
    if re.fullmatch(r"[+-]?\d+", v):
        return "integer"
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", v):
        return "number"
    if re.fullmatch(r"\d{4}-\d{2}", v):  # ISO 8601 year and month (monthly data)
        return "%Y-%m"
    tz = re.search(_OFFSET, v[10:]) if len(v) > 10 else None
    zone = "" if tz is None else tz.group(0)  # as spelled: format_times writes at it
    clock = v[11 : len(v) - (len(tz.group(0)) if tz else 0)]
    d = v[4] if re.match(r"\d{4}([/.])\d{2}\1\d{2}", v) else "-"  # 2024/03/01, 2024.03.01
    if len(v) <= 10 or not clock:
        return f"%Y{d}%m{d}%d" + zone
    sep = v[10]
    fmt = "%H:%M:%S" if clock.count(":") >= 2 else ("%H:%M" if ":" in clock else "%H")
    return f"%Y{d}%m{d}%d{sep}{fmt}{zone}"


def format_times(t: np.ndarray, spelling: str, month_day: int = 0) -> list[str]:
    """Times ``t`` (``datetime64`` or float64) as strings spelled ``spelling`` (see
    :func:`time_spelling`); months of a calendar-month axis (``datetime64[M]``) as their
    dates on day ``month_day`` (``SeriesData.month_day``). The spelling is read from the data's
    first value, so one that would drop a part of some time is widened: ``"integer"`` times
    that are not all whole numbers are spelled as ``"number"`` (``0, 0.5, 1, ...``), and date
    times that a date-only (``2024-03-01`` for midnight, then hourly) or coarser clock spelling
    cannot hold are spelled ``%Y-%m-%dT%H:%M:%S`` (with the spelling's UTC offset, at which
    the times, UTC on the axis, are written); a
    year-month spelling (``%Y-%m``) of times not all on the 1st at midnight is widened the same
    way (through ``%Y-%m-%d``)."""
    import pandas as pd

    t = month_dates(t, month_day)
    if spelling == "integer" and np.all(np.mod(np.asarray(t, np.float64), 1.0) == 0):
        return [str(int(round(float(v)))) for v in np.asarray(t, np.float64)]
    if spelling == "integer":
        spelling = "number"
    if spelling == "number":
        return [repr(float(v)) for v in np.asarray(t, np.float64)]
    zone = re.search(_OFFSET, spelling)  # the data's UTC offset: the UTC times shifted to it
    zone_text = zone.group(0) if zone else ""
    secs = np.asarray(t, "datetime64[s]") + np.timedelta64(_offset_seconds(zone_text), "s")
    if "%d" not in spelling and np.any(secs != secs.astype("datetime64[M]")):
        spelling = "%Y-%m-%d"  # year-month values: dates off the 1st need their day
    unit = next((u for part, u in (("%H", 86400), ("%M", 3600), ("%S", 60)) if part not in
                 spelling), 1)  # fmt: skip
    if unit > 1 and np.any(secs.astype(np.int64) % unit):
        spelling = spelling[:8] + "T%H:%M:%S" + zone_text  # the date as spelled
    return list(pd.DatetimeIndex(secs).strftime(spelling))


def _offset_seconds(zone: str) -> int:
    """The seconds east of UTC of an offset as spelled (``Z``, ``+02``, ``+0200``, ``-05:30``;
    ``""``: 0)."""
    m = re.fullmatch(r"([+-])(\d{2}):?(\d{2})?", zone)
    if m is None:
        return 0
    off = 3600 * int(m.group(2)) + 60 * int(m.group(3) or 0)
    return -off if m.group(1) == "-" else off
