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
    alld = np.concatenate(nonempty)
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


def regularise(
    t, codes, names, vals, stat, where: Callable[[int], str], src, target_col, observed, known,
    static, fill_gaps,
) -> SeriesData:  # fmt: skip
    """Group rows by entity (file order kept), check the order and the step, fill gaps."""
    is_dt = t.dtype.kind == "M"
    per: list[Any]
    if len(codes) < 2 or bool(np.all(codes[1:] >= codes[:-1])):  # grouped already: slices
        bounds = np.searchsorted(codes, np.arange(len(names) + 1))
        per = [slice(int(bounds[e]), int(bounds[e + 1])) for e in range(len(names))]
    else:
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        per = [order[bounds[e] : bounds[e + 1]] for e in range(len(names))]
    diffs, statics = _check_order(t, per, names, stat, static, where)
    step = _step(diffs, is_dt, src)
    numeric_cols = [target_col] + list(observed) + list(known)
    out_t, out_y, out_obs, out_known = [], [], [], []
    filled: dict[str, dict[str, int]] = {}
    n_filled = 0
    for e, rows in enumerate(per):
        pos = _positions(t[rows], diffs[e], step, is_dt, rows, names[e], where, fill_gaps)
        n = int(pos[-1]) + 1
        block = vals[:, rows]  # (m, N_e): a view for grouped rows
        if n == block.shape[1]:  # no missing step
            full = block
        else:
            full = np.full((vals.shape[0], n), np.nan)
            full[:, pos] = block
        if fill_gaps:  # (in place: vals is this call's own buffer)
            filled_e = _fill(full, numeric_cols, names[e], src)
            if filled_e:
                filled[names[e]] = filled_e
                n_filled += sum(filled_e.values())
        out_t.append(t[rows][0] + np.arange(n) * step)
        out_y.append(full[0].copy())
        out_obs.append(np.ascontiguousarray(full[1 : 1 + len(observed)].T))
        out_known.append(np.ascontiguousarray(full[1 + len(observed) :].T))
    return SeriesData(
        entity_names=list(names),
        times=out_t,
        step=step,
        target=out_y,
        observed=out_obs,
        known=out_known,
        static=statics,
        target_name=target_col,
        observed_names=list(observed),
        known_names=list(known),
        static_names=list(static),
        n_filled=n_filled,
        source=src,
        filled=filled,
    )


def _check_order(t, per, names, stat, static, where) -> tuple[list[np.ndarray], np.ndarray]:
    """Per entity: strictly increasing times (their differences) and constant statics."""
    statics = np.zeros((len(names), len(static)))
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
                "entity's rows must be in strictly increasing time order: sort the file by "
                "entity and time and drop duplicate rows"
            )
        diffs.append(d)
        for j, c in enumerate(static):
            v = stat[j, rows]
            ch = np.flatnonzero(v != v[0])
            if len(ch):
                k = int(ch[0])
                raise DataError(
                    f"{where(_row(rows, k))}: static column {c!r} changes within entity "
                    f"{names[e]!r} ({v[0]!r} then {v[k]!r}); a static input must be constant "
                    "per entity"
                )
            statics[e, j] = v[0] if len(v) else 0.0
    return diffs, statics


def _positions(ta, d, step, is_dt, rows, name, where, fill_gaps) -> np.ndarray:
    """The step index of each row of one entity (regular steps; gaps only with fill_gaps)."""
    nsteps, irregular = _n_steps(d, step, is_dt)
    if irregular.any():
        i = int(np.argmax(irregular))
        raise DataError(
            f"{where(_row(rows, i + 1))}: timestamp {ta[i + 1]} of entity {name!r} is "
            f"not a whole number of steps ({step}) after the previous one ({ta[i]}); the "
            "series must be regular"
        )
    gaps = np.flatnonzero(nsteps > 1)
    if len(gaps) and not fill_gaps:
        i = int(gaps[0])
        raise DataError(
            f"{where(_row(rows, i + 1))}: gap in entity {name!r}: {int(nsteps[i]) - 1} "
            f"missing step(s) of {step} between {ta[i]} and {ta[i + 1]} "
            f"({len(gaps)} gap(s) in this entity); fill them in the file, or pass "
            "--fill-gaps (fill_gaps=True) to insert the missing steps by linear interpolation"
        )
    return np.concatenate([[0], np.cumsum(nsteps)])


def _fill(full: np.ndarray, cols: list[str], entity: str, src: str) -> dict[str, int]:
    """Interpolate the NaN cells of each column (row of ``full``, (m, n)) in place; return the
    counts per column."""
    n = full.shape[1]
    xs = np.arange(n, dtype=np.float64)
    counts = {}
    for j, c in enumerate(cols):
        ok = np.isfinite(full[j])
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
        full[j] = np.interp(xs, xs[ok], full[j, ok])
        counts[c] = n_bad
    return counts
