"""Per-entity ordering, the common time step, gaps and their repair (``fill_gaps``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nbqat.data._series import MAX_FILL_FRACTION, DataError, SeriesData

__all__ = ["regularise"]

#: Relative tolerance of "a whole number of steps" for a numeric (float) time axis.
_STEP_RTOL = 1e-6


def _row(rows: Any, i: int) -> int:
    """The file row of an entity's i-th row (``rows``: a slice or an index array)."""
    return rows.start + i if isinstance(rows, slice) else int(rows[i])


def _step(diffs: list[np.ndarray], is_dt: bool, src: str):
    nonempty = [d for d in diffs if len(d)]
    if not nonempty:
        raise DataError(f"{src}: every series has a single row; a series needs many time steps")
    if is_dt:  # the common case, one step nearly everywhere: a strict majority is the mode
        cand = nonempty[0][0]
        agree = sum(int(np.count_nonzero(d == cand)) for d in nonempty)
        if 2 * agree > sum(len(d) for d in nonempty):
            return cand
    alld = np.concatenate(nonempty)
    if alld.dtype == np.dtype("timedelta64[M]"):  # calendar months: pandas has no such unit
        months = np.unique(alld.astype(np.int64), return_counts=True)
        return np.timedelta64(int(months[0][np.argmax(months[1])]), "M")
    if not is_dt:  # float steps: group differences equal up to rounding
        alld = np.round(alld, 9 - int(np.floor(np.log10(np.max(np.abs(alld))))))
    import pandas as pd

    counts = pd.Series(alld).value_counts(sort=False)  # hashing: O(n), no sort of all rows
    best = counts[counts == counts.max()].index.to_numpy()
    return best.min()  # the most common difference (ties: the smallest)


def _n_steps(d: np.ndarray, step, is_dt: bool) -> tuple[np.ndarray, np.ndarray]:
    """(whole steps, irregular mask) of the differences ``d``."""
    if is_dt:
        return (d // step).astype(np.int64), (d % step) != d.dtype.type(0)
    r = d / step
    n = np.round(r)
    return n.astype(np.int64), np.abs(r - n) > _STEP_RTOL * np.maximum(1.0, np.abs(r))


def entity_rows(codes: np.ndarray, n_entities: int) -> list[Any]:
    """The rows of each entity (``codes``: numbered by first appearance): slices when the
    file is grouped by entity, else index arrays (file order kept within an entity)."""
    if len(codes) < 2 or bool(np.all(codes[1:] >= codes[:-1])):  # grouped already: slices
        bounds = np.searchsorted(codes, np.arange(n_entities + 1, dtype=codes.dtype))
        return [slice(int(bounds[e]), int(bounds[e + 1])) for e in range(n_entities)]
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(n_entities + 1))
    return [order[bounds[e] : bounds[e + 1]] for e in range(n_entities)]


def regularise(
    t, per, names, target, obs, kno, statics, changes, where: Callable[[int], str], src,
    target_col, observed, known, static, modes,
) -> SeriesData:  # fmt: skip
    """Check each entity's order and the common step, insert missing steps and fill gaps.

    ``per``: :func:`entity_rows`; ``target``, ``obs``, ``kno``: per entity, its rows' values in
    file order (``(N_e,)``, ``(N_e, m_obs)``, ``(N_e, m_known)`` float64, owned here: an
    entity without missing steps keeps them, repairs are made in place); ``statics``
    ``(n_entities, m_static)`` and ``changes`` (per static column, per entity ``(row, first,
    other)`` or ``None``): :func:`nbqat.data._values.static_values`. ``modes``: ``(fill_gaps,
    future_rows)`` (a bare bool: ``fill_gaps``), see :func:`nbqat.data.load_csv`.
    """
    fill_gaps, future_rows = modes if isinstance(modes, tuple) else (modes, False)
    is_dt = t.dtype.kind == "M"
    diffs = _check_order(t, per, names, changes, static, where)
    step = _step(diffs, is_dt, src)
    numeric_cols = [target_col] + list(observed) + list(known)
    out_t = []
    filled: dict[str, dict[str, int]] = {}
    carried: dict[str, list[str]] = {}
    n_filled = 0
    gap_rows: list[np.ndarray] = []
    for e, rows in enumerate(per):
        pos = _positions(t[rows], diffs[e], step, is_dt, rows, names[e], where, fill_gaps)
        n = len(diffs[e]) + 1 if pos is None else int(pos[-1]) + 1
        gap_rows.append(np.zeros(n, dtype=bool))
        if pos is not None and n != len(pos):  # missing steps: NaN rows, filled below
            target[e], obs[e], kno[e] = (_spread(a, pos, n) for a in (target[e], obs[e], kno[e]))
        times_e = t[rows][0] + np.arange(n) * step
        if fill_gaps or future_rows:
            m = _n_past(target[e], names[e], src, target_col)
            first = int(np.argmax(np.isfinite(target[e])))
            if (m < n and not future_rows) or first > 0:  # no extrapolation, nor back-fill
                raise _unbounded(names[e], times_e, first, m if not future_rows else n, src,
                                 target_col, future_rows)  # fmt: skip
            columns = [target[e][:m]] + [obs[e][:m, j] for j in range(obs[e].shape[1])]
            columns += [kno[e][:m, j] for j in range(kno[e].shape[1])]
            if fill_gaps:
                gap_rows[e][:m] = ~np.isfinite(columns[0])  # the target's repaired steps
                filled_e, carried_e = _fill(columns, numeric_cols, 1 + obs[e].shape[1],
                                            names[e], src)  # fmt: skip
                if filled_e:
                    filled[names[e]] = filled_e
                    n_filled += sum(filled_e.values())
                if carried_e:
                    carried[names[e]] = carried_e
            else:
                _check_missing(columns, numeric_cols, names[e], times_e, src)
        out_t.append(times_e)
    return SeriesData(
        entity_names=list(names),
        times=out_t,
        step=step,
        target=target,
        observed=obs,
        known=kno,
        static=statics,
        target_name=target_col,
        observed_names=list(observed),
        known_names=list(known),
        static_names=list(static),
        n_filled=n_filled,
        source=src,
        filled=filled,
        carried=carried,
        filled_target=gap_rows if any(g.any() for g in gap_rows) else [],
    )


def _n_past(y: np.ndarray, entity: str, src: str, col: str) -> int:
    """The number of rows up to the last one with a target value (``future_rows``)."""
    ok = np.flatnonzero(np.isfinite(y))
    if not len(ok):
        raise DataError(f"{src}: entity {entity!r} has no value of the target {col!r} at all")
    return int(ok[-1]) + 1


def _unbounded(entity: str, times: np.ndarray, first: int, m: int, src: str, col: str,
               predict: bool) -> DataError:  # fmt: skip
    """The error for rows before an entity's first target value (rows ``:first``; training,
    predict and backtest alike: a history there would read that later value) or, in training,
    after its last (row ``m`` on; ``m`` is ``len(times)`` for predict data, whose rows after
    the last value are the rows to forecast: ``predict``), which ``fill_gaps`` would fill with
    that value."""
    if m < len(times):
        where = (
            f"{len(times) - m} row(s) after its last {col!r} value, from {times[m]} to "
            f"{times[-1]}: rows to forecast (nbqat predict reads them), not training data"
        )
    else:
        where = (f"{first} row(s) before its first {col!r} value, from {times[0]} to "
                 f"{times[first - 1]}: a history there would read that later value")  # fmt: skip
    fix = (f"start the entity at {times[first]} (drop the rows before it, whose {col!r} is "
           "empty)" if predict else f"train on the rows from {times[first]} to {times[m - 1]} "
           f"(drop the rows at the ends whose {col!r} is empty)")  # fmt: skip
    return DataError(
        f"{src}: entity {entity!r} has {where}, and --fill-gaps repairs between values, "
        f"it does not extend the series; {fix}"
    )


def _check_missing(columns, cols, entity, times, src) -> None:
    """DataError for the first missing cell before an entity's last target value."""
    for x, c in zip(columns, cols):
        bad = np.flatnonzero(~np.isfinite(x))
        if len(bad):
            raise DataError(
                f"{src}: column {c!r} of entity {entity!r} has a missing value at {times[bad[0]]} "
                f"({len(bad)} missing value(s) up to the entity's last target value, the rows "
                "a forecast reads); fill it, or pass --fill-gaps (fill_gaps=True) to repair it"
            )


def _spread(a: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray:
    """``a``'s rows at the step indices ``pos`` of ``n`` steps, NaN at the missing ones."""
    full = np.full((n,) + a.shape[1:], np.nan)
    full[pos] = a
    return full


def _check_order(t, per, names, changes, static, where) -> list[np.ndarray]:
    """Per entity: strictly increasing times (their differences) and constant statics."""
    diffs = []
    for e, rows in enumerate(per):
        ta = t[rows]
        d = np.diff(ta)
        bad = np.flatnonzero(d <= d.dtype.type(0)) if len(d) else np.zeros(0, np.int64)
        if len(bad):
            i = int(bad[0])
            what = (
                "duplicate" if d[i] == d.dtype.type(0) else "unsorted (earlier than the row before)"
            )
            raise DataError(
                f"{where(_row(rows, i + 1))}: {what} timestamp {ta[i + 1]} for entity "
                f"{names[e]!r} ({where(_row(rows, i)).rsplit(', ', 1)[-1]} has {ta[i]}); each "
                "entity's rows must be in strictly increasing time order: sort the rows by "
                "entity and time and drop duplicate rows"
            )
        diffs.append(d)
        for j, c in enumerate(static):
            if changes[j][e] is not None:
                k, first, other = changes[j][e]
                raise DataError(
                    f"{where(_row(rows, k))}: static column {c!r} changes within entity "
                    f"{names[e]!r} ({_plain(first)} then {_plain(other)}); a static input must "
                    "be constant "
                    "per entity"
                )
    return diffs


def _positions(ta, d, step, is_dt, rows, name, where, fill_gaps) -> np.ndarray | None:
    """The step index of each row of one entity (regular steps; gaps only with fill_gaps);
    ``None`` when every difference is one step (the rows are the steps)."""
    if not bool((d != step).any()):
        return None
    nsteps, irregular = _n_steps(d, step, is_dt)
    if irregular.any():
        i = int(np.argmax(irregular))
        raise DataError(
            f"{where(_row(rows, i + 1))}: timestamp {ta[i + 1]} of entity {name!r} is "
            f"not a whole number of steps ({step}) after the previous one ({ta[i]}); the "
            "series must be regular" + _month_hint(step, ta) + _dst_hint(step, d[i])
        )
    gaps = np.flatnonzero(nsteps > 1)
    hint = "" if is_dt or not len(gaps) else _compact_date_hint(ta)
    if len(gaps) and (hint or not fill_gaps):  # compact dates: no repair is right
        i = int(gaps[0])
        raise DataError(
            f"{where(_row(rows, i + 1))}: gap in entity {name!r}: {int(nsteps[i]) - 1} "
            f"missing step(s) of {step} between {ta[i]} and {ta[i + 1]} "
            f"({len(gaps)} gap(s) in this entity); "
            + (hint or "add the rows of the missing steps, or pass --fill-gaps "
               "(fill_gaps=True) to insert them (see its help: the last value carried forward, "
               "known columns interpolated)")
        )  # fmt: skip
    return np.concatenate([[0], np.cumsum(nsteps)])


def _compact_date_hint(ta: np.ndarray) -> str:
    """The fix for numeric times that are dates spelled as numbers (``20120131``: YYYYMMDD,
    ``201201``: YYYYMM), whose month and year ends read as gaps of 69 or 88 steps; ``""`` for
    other numbers."""
    if not np.all(np.mod(ta, 1.0) == 0):
        return ""
    for digits, fmt, name, example in ((8, "%Y%m%d", "YYYYMMDD", "2012-01-31"),
                                       (6, "%Y%m", "YYYYMM", "2012-01")):  # fmt: skip
        lo, hi = 10 ** (digits - 1), 10**digits
        if np.all((ta >= lo) & (ta < hi)):
            v = ta.astype(np.int64)
            month = v // 100 % 100 if digits == 8 else v % 100
            day = v % 100 if digits == 8 else np.ones_like(v)
            if np.all((month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)):
                return (
                    f"the time column holds numbers such as {int(v[0])}, dates spelled "
                    f"{name}: give it as dates (pandas.to_datetime(df[col]"
                    f".astype(str), format={fmt!r}), or ISO 8601 such as {example}) and they "
                    "step by days or calendar months"
                )
    return ""


def _dst_hint(step, gap) -> str:
    """The fix for days (a step of 1 to 27 days) one that ``gap`` misses by at most an hour:
    local midnights with a UTC offset across a daylight-saving change (read in UTC)."""
    if not isinstance(step, np.timedelta64) or step.dtype == np.dtype("timedelta64[M]"):
        return ""
    if not np.timedelta64(1, "D") <= step < np.timedelta64(28, "D"):
        return ""
    off = gap % step
    if not np.timedelta64(0, "s") < min(off, step - off) <= np.timedelta64(1, "h"):
        return ""
    return (
        f"; {gap / np.timedelta64(1, 'h'):g} hours apart: a daylight-saving change, since "
        "date times with a UTC offset are read in UTC (local midnights move by an hour); "
        "give the dates without an offset (pandas: df[col] = df[col].dt.tz_localize(None) "
        "keeps the local dates)"
    )


def _month_hint(step, ta: np.ndarray) -> str:
    """A hint for dates about a month, a quarter or a year apart (``step``) that are not
    calendar-month dates, naming the first of the entity's dates ``ta`` not at midnight (UTC:
    an aware local midnight is not), else the first off its first date's day of month."""
    if not isinstance(step, np.timedelta64) or step.dtype == np.dtype("timedelta64[M]"):
        return ""
    days = step / np.timedelta64(1, "D")
    if days != int(days) or not 28 <= days <= 366:
        return ""
    day, month = ta.astype("datetime64[D]"), ta.astype("datetime64[M]")
    end = day == (month + 1).astype("datetime64[D]") - 1
    dom = (day - month).astype(np.int64) + 1
    odd = np.flatnonzero(~end if end[0] else dom != dom[0])
    like = "the last day of its month" if end[0] else f"day {dom[0]}"
    where = f" ({ta[odd[0]]} is not on {like} like {ta[0]})" if len(odd) else ""
    late = np.flatnonzero(day != ta)
    if len(late):  # a clock time: often local midnights given with a UTC offset
        where = (
            f" ({ta[late[0]]} is not at midnight; date times with a UTC offset are read in "
            "UTC, so a local 2000-01-01T00:00+01:00 is 1999-12-31T23:00: give monthly dates "
            "without an offset)"
        )
    return (
        "; monthly, quarterly or yearly dates are read as calendar months when they are all "
        "at midnight and all on the same day of month (at most 28) or all on the last day "
        f"of their month{where}: spell every date that way (e.g. 2000-01-01, 2000-02-01, "
        "... or 2000-01-31, 2000-02-29, ...)"
    )


#: A column of whole numbers with at most this many distinct values (a 0/1 flag, a category, a
#: small count) is repaired by carrying its last value, not by interpolation.
MAX_CARRIED_LEVELS = 16


def _is_levels(vals: np.ndarray) -> bool:
    """Whether ``vals`` (the finite values of a column) are whole numbers with at most
    :data:`MAX_CARRIED_LEVELS` distinct values."""
    if not np.all(vals == np.round(vals)):
        return False
    return len(np.unique(vals)) <= MAX_CARRIED_LEVELS


def _fill(columns: list[np.ndarray], cols: list[str], n_past: int, entity: str, src: str
          ) -> tuple:  # fmt: skip
    """Repair the NaN cells of each column (``columns[j]``, 1-D views of length n, named
    ``cols[j]``) in place and return the counts per column and the interpolated columns that
    were carried instead.

    The first ``n_past`` columns (the target and the observed inputs, known only up to each
    time) get their last value carried forward, so a repaired step never reads a value after
    it (an interpolation across a gap read the value after the gap: a forecast origin in or
    just after the gap saw its own future). The known columns (known in advance) are
    interpolated linearly, except a column of a few whole-number levels (a flag, a category;
    :func:`_is_levels`), whose last value is carried forward. Before an observed column's
    first value the cells stay NaN (counted): the value after them would be a later one, and
    the model reads the column's training mean there, 0 once standardised
    (:meth:`nbqat.data.Scaling.observed_or_mean`); a known column gets its first value."""
    n = len(columns[0])
    xs = np.arange(n, dtype=np.float64)
    counts, carried = {}, []
    for j, c in enumerate(cols):
        x = columns[j]
        ok = np.isfinite(x)
        n_bad = int(n - ok.sum())
        if n_bad == 0:
            continue
        if not ok.any():
            raise DataError(
                f"{src}: column {c!r} of entity {entity!r} has no value at all; nothing to "
                "interpolate from"
            )
        if n_bad > MAX_FILL_FRACTION * n:
            raise DataError(
                f"{src}: --fill-gaps would invent {n_bad} of {n} values "
                f"({100 * n_bad / n:.0f}%) of column {c!r} in entity {entity!r}, more than the "
                f"{100 * MAX_FILL_FRACTION:.0f}% it repairs (nbqat.data.MAX_FILL_FRACTION); "
                "fix the data at its source"
            )
        vals = x[ok]
        if j < n_past or _is_levels(vals):  # past-only, a flag or levels: carry, never look
            idx = np.maximum.accumulate(np.where(ok, np.arange(n), -1))  # ahead or invent 0.5
            lead = int(np.argmax(ok)) if 0 < j < n_past else 0  # observed: NaN before it
            idx[idx < 0] = int(np.argmax(ok))  # a known one before its first: the first value
            x[lead:] = x[idx[lead:]]
            if j >= n_past:
                carried.append(c)
        else:
            x[:] = np.interp(xs, xs[ok], x[ok])
        counts[c] = n_bad
    return counts, carried


def _plain(v: object) -> str:
    """A value for messages: a NumPy scalar as its Python value (``0.85``, not
    ``np.float64(0.85)``)."""
    return repr(v.item() if isinstance(v, np.generic) else v)
