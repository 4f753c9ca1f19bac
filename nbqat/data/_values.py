"""The numeric columns of a table -> checked values, written straight into per-entity arrays.

A column comes as *pieces*: the chunks of an Arrow column (read-only views of its buffers, no
copy) or one float64 array (:func:`numeric_column`'s checked path). Each piece is checked with
two reductions and then copied once, entity by entity, into its place in the loader's output
arrays (:func:`place`): no intermediate row-by-column matrix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from nbqat.data._series import MAX_ABS_VALUE, DataError

__all__ = ["numeric_column", "numeric_pieces", "place", "static_values"]


def numeric_column(
    s: Any, col: str, where: Callable[[int], str], allow_missing: bool, role: str = ""
) -> np.ndarray:
    """One column (a pandas Series) as float64, with the first bad value reported by line.

    ``role`` is the option that named the column (``"--static-cols"``, ``"--known-cols"``,
    ``"--target-col"``; ``""`` for an observed input): a non-numeric value of a column named
    so gets that option's fix, and a static column's missing value, which ``fill_gaps`` does
    not fill, its own message. A boolean input reads as 0/1; a boolean target is refused (a
    classification target; the message names ``astype(float)`` for a 0/1 series).
    """
    import pandas as pd

    static = role == "--static-cols"

    if pd.api.types.is_bool_dtype(s.dtype):
        if role == "--target-col":
            raise DataError(_bool_target(where(0), col))
        s = s.astype(np.float64)  # an input flag: 0/1
    if pd.api.types.is_numeric_dtype(s.dtype):
        x = s.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        x = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.flatnonzero(np.isnan(x) & ~s.isna().to_numpy())
        if len(bad):
            raise DataError(_non_numeric(where(int(bad[0])), col, s.iloc[int(bad[0])], role))
    nan = np.isnan(x)
    if not allow_missing and nan.any():
        i = int(np.argmax(nan))
        if static:
            raise DataError(
                f"{where(i)}: column {col!r} (--static-cols) has a missing value (empty, NA or "
                "NaN); a static column needs its entity's value on every row, the rows to "
                "forecast included (--fill-gaps does not fill it): fill it in"
            )
        raise DataError(
            f"{where(i)}: column {col!r} has a missing value (empty, NA or NaN); fill it in, or "
            "pass --fill-gaps (fill_gaps=True) to repair missing values"
        )
    big = ~nan & ~(np.abs(x) <= MAX_ABS_VALUE)
    if big.any():
        i = int(np.argmax(big))
        what = "a non-finite" if not np.isfinite(x[i]) else "a huge"
        raise DataError(
            f"{where(i)}: column {col!r} has {what} value {float(x[i])!r}; values must be "
            f"finite with magnitude at most {MAX_ABS_VALUE:g} (the network computes in "
            "float32): rescale the column (other units) or fix the value"
        )
    return x


def _bool_target(place: str, col: str) -> str:
    """The message for a boolean target column: a classification target, which a quantile
    forecaster does not predict."""
    return (
        f"{place}: column {col!r} (--target-col) is boolean (True/False), a classification "
        "target: nbqat forecasts quantiles of numbers; if a 0/1 series is really meant, convert "
        f"it (pandas: df[{col!r}] = df[{col!r}].astype(float); in a file: write 0 and 1)"
    )


def _non_numeric(place: str, col: str, value: Any, role: str) -> str:
    """The message for a non-numeric ``value`` of column ``col`` (``role``: see
    :func:`numeric_column`)."""
    head = f"{place}: column {col!r} has a non-numeric value {value!r}"
    if re.fullmatch(r"\s*[+-]?\d*,\d+\s*", str(value)):  # 1,5: a number, spelled with a comma
        return (
            f"{head}: a decimal comma (or a thousands separator)? nbqat reads numbers with a "
            f"decimal point: convert the column (pandas: pd.read_csv(path, decimal=',') or "
            f"thousands=',', or df[{col!r}] = df[{col!r}].str.replace(',', '.').astype(float))"
        )
    if role == "--target-col":
        return f"{head} (--target-col); the target must hold numbers: choose a numeric one"
    if role:  # a category the user named as an input
        return (
            f"{head} ({role}); inputs must hold numbers: code a category as numbers (one 0/1 "
            f"column per category: pandas.get_dummies(df, columns=[{col!r}], dtype=int), and "
            f"name those columns in {role}) or leave {col!r} out of {role}"
        )
    return (
        f"{head}; every input column must hold numbers (choose the input columns with "
        "--observed-cols / --known-cols / --static-cols; a column that names the series is "
        "the --entity-col)"
    )


def numeric_pieces(
    df: Any, col: str, where: Callable[[int], str], allow_missing: bool, role: str = ""
) -> list[np.ndarray]:
    """Column ``col`` of ``df`` (a pandas DataFrame or :class:`~nbqat.data._arrow.ArrowColumns`),
    checked, as pieces that follow each other row by row. An Arrow column of plain numbers
    gives its chunks, each checked with two reductions (NaN fails both comparisons); any other
    column, or one that fails that check, goes through :func:`numeric_column`, which raises
    naming the row (or, ``allow_missing``, lets its missing values through; ``role``: as
    :func:`numeric_column`'s)."""
    from nbqat.data._arrow import ArrowColumns

    if isinstance(df, ArrowColumns):
        pieces = df.numeric_chunks(col)
        if pieces is not None:
            if all(-MAX_ABS_VALUE <= p.min() and p.max() <= MAX_ABS_VALUE for p in pieces):
                return pieces
            import pandas as pd

            x = np.concatenate(pieces, dtype=np.float64)
            return [numeric_column(pd.Series(x), col, where, allow_missing, role)]
    return [numeric_column(df[col], col, where, allow_missing, role)]


def _segments(lengths: list[int], per: list[Any]) -> Iterator[tuple[int, int, int, int, int]]:
    """``(piece, start, stop, entity, offset)`` for grouped rows (``per``: slices in file
    order): rows ``start:stop`` of a piece are the entity's rows ``offset:offset + stop -
    start``."""
    e, row = 0, 0
    for i, n in enumerate(lengths):
        lo = 0
        while lo < n:
            while per[e].stop <= row:
                e += 1
            hi = min(n, lo + per[e].stop - row)
            yield i, lo, hi, e, row - per[e].start
            row += hi - lo
            lo = hi


def _is_grouped(per: list[Any]) -> bool:
    return all(isinstance(r, slice) for r in per)


def place(columns: list[list[np.ndarray]], per: list[Any], dest: list[np.ndarray]) -> None:
    """Write columns (``columns[j]``: column ``j`` as pieces) into ``dest[e][:, j]``
    (``dest[e]``: ``(N_e, len(columns))``, one entity's rows in file order) for the rows
    ``per[e]`` (a slice, or an index array for interleaved entities).

    Grouped rows are written segment by segment, all columns of a segment together, so each
    block of the destination is written while it is in cache."""
    if not columns:
        return
    lengths = [len(p) for p in columns[0]]
    if any([len(p) for p in pieces] != lengths for pieces in columns):  # mixed sources
        columns = [[np.concatenate(pieces)] if len(pieces) > 1 else pieces for pieces in columns]
        lengths = [len(columns[0][0])]
    if _is_grouped(per):
        for i, lo, hi, e, off in _segments(lengths, per):
            block = dest[e][off : off + hi - lo]
            for j, pieces in enumerate(columns):
                block[:, j] = pieces[i][lo:hi]
        return
    for j, pieces in enumerate(columns):
        x = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        for e, rows in enumerate(per):
            dest[e][:, j] = x[rows]


def static_values(
    pieces: list[np.ndarray], per: list[Any]
) -> tuple[np.ndarray, list[tuple[int, np.float64, np.float64] | None]]:
    """Per entity: the first value of a static column (float64), and ``(k, first, other)``
    for the first of its rows ``k`` whose value differs from the first (``None`` when the
    column is constant within the entity)."""
    first = np.zeros(len(per))
    change: list[tuple[int, np.float64, np.float64] | None] = [None] * len(per)
    if _is_grouped(per):
        for i, lo, hi, e, off in _segments([len(p) for p in pieces], per):
            seg = pieces[i][lo:hi]
            if off == 0:
                first[e] = seg[0]
            if change[e] is None:
                ch = np.flatnonzero(seg != first[e])
                if len(ch):
                    k = int(ch[0])
                    change[e] = (off + k, first[e], np.float64(seg[k]))
        return first, change
    x = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    for e, rows in enumerate(per):
        v = x[rows].astype(np.float64, copy=False)
        first[e] = v[0]
        ch = np.flatnonzero(v != v[0])
        if len(ch):
            k = int(ch[0])
            change[e] = (k, v[0], v[k])
    return first, change
