"""Long-format tables (CSV, CSV.gz, Parquet, pandas DataFrame) -> :class:`SeriesData`.

The file is read by pyarrow (:mod:`nbqat.data._arrow`) with only the needed columns; every
check then runs vectorised over the columns (:mod:`nbqat.data._values` for the numeric ones,
:mod:`nbqat.data._regular` for the order and the step), and each numeric column is copied
once, from the table's chunks into the per-entity output arrays. Errors are
:class:`DataError` naming the file, the line (CSV: the line number in the file, header = 1;
Parquet / DataFrame: the 0-based row) and the column.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nbqat.data._arrow import ArrowColumns, read_table
from nbqat.data._calendar import CALENDAR_FEATURES
from nbqat.data._months import month_axis
from nbqat.data._regular import entity_rows, regularise
from nbqat.data._series import DataError, SeriesData, _names
from nbqat.data._timecol import parse_time_column, time_spelling
from nbqat.data._values import numeric_pieces, place, static_values

__all__ = ["from_dataframe", "load_csv"]

#: Column names of a pandas index written with the data: a CSV's unnamed first column
#: (``""``; ``"Unnamed: 0"`` once read back by pandas) and Parquet's ``__index_level_0__``.
_INDEX_NAME = re.compile(r"|Unnamed: \d+(?:_level_\d+)?|__index_level_\d+__")

_READ_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    UnicodeDecodeError,
    zlib.error,
    csv.Error,
)


def _read_header(path: Path) -> list[str]:
    """The CSV header row (a UTF-8 byte-order mark removed), read without pandas."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as raw:  # type: ignore[operator]
            f = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
            row = next(csv.reader(f), None)
    except _READ_ERRORS as e:
        raise DataError(f"{path}: cannot read it as CSV text ({e})") from None
    if row is None:
        raise DataError(f"{path}: the file is empty (expected a header row)")
    return [h.strip() for h in row]


def _csv_rows(path: Path) -> Any:
    """(line number, fields) of each data row, as the csv module reads them (error paths)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as raw:  # type: ignore[operator]
        f = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        reader = csv.reader(f)
        next(reader, None)
        for row in reader:
            if row:  # pyarrow skips empty lines too
                yield reader.line_num, row


def _line_of_row(path: Path, i: int) -> int:
    """The file line of data row ``i`` (0-based; blank lines skipped as the reader does)."""
    try:
        for k, (line, _) in enumerate(_csv_rows(path)):
            if k == i:
                return line
    except _READ_ERRORS:
        pass
    return i + 2  # header on line 1, no blank lines


def _field_count_error(path: Path, ncol: int) -> str | None:
    """The old parser's message for a row with another number of fields than the header."""
    try:
        for line, row in _csv_rows(path):
            if len(row) != ncol:
                return f"{path}, line {line}: {len(row)} fields, the header has {ncol}"
    except _READ_ERRORS:
        return None
    return None


def _check_columns(
    src: str, header: list[str], roles: dict[str, list[str]], observed_cols: Any
) -> list[str]:
    """Check the named columns against the header; return the observed columns."""
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise DataError(
            f"{src}: the header names column(s) {dup} more than once; rename the duplicates "
            "(a column used twice would silently read only one of them)"
        )
    for opt, cols in roles.items():
        missing = [c for c in cols if c not in header]
        if missing:
            hint = ""
            if any(h.startswith("\ufeff") for h in header):
                hint = " (the header starts with a byte-order mark)"
            sep = next((d for d in (";", "\t", "|") if len(header) == 1 and d in header[0]), None)
            if sep is not None:  # a European or tab-separated file read as one column
                hint = (
                    f" (the file reads as one column: its header is separated by {sep!r}, and "
                    "nbqat reads comma-separated files; convert it, e.g. pandas.read_csv(path, "
                    f"sep={sep!r}{', decimal=' + repr(',') if sep == ';' else ''})"
                    ".to_csv('data.csv', index=False))"
                )
            cal = [c for c in missing if c in CALENDAR_FEATURES]
            if cal and not hint:  # --known-cols hour: the calendar derives it from the times
                hint = (
                    f" ({', '.join(map(repr, cal))}: a calendar feature, derived from the time "
                    f"stamps, not a column: --calendar {','.join(cal)} (calendar= in Python) "
                    "adds it)"
                )
            raise DataError(
                f"{src}: {opt} names column(s) {missing} that the header does not have{hint}; "
                f"the header's columns are {header}"
            )
    used = [c for opt, cols in roles.items() if opt != "--observed-cols" for c in cols]
    twice = sorted({c for c in used if used.count(c) > 1})
    if twice:
        raise DataError(f"{src}: column(s) {twice} are named for more than one role")
    if observed_cols is None:
        observed = [c for c in header if c not in used]
        index = [c for c in observed if _INDEX_NAME.fullmatch(c)]
        if index:
            raise DataError(
                f"{src}: column(s) {index} look like the table's index written with the data "
                "(DataFrame.to_csv / to_parquet without index=False); every column not named "
                "otherwise is an observed input, so the row numbers would be one: write the "
                "table with index=False, or name the inputs with --observed-cols"
            )
        return observed
    observed = _names(observed_cols)
    clash = [c for c in observed if c in used]
    if clash:
        raise DataError(f"{src}: --observed-cols {clash} already have another role")
    return observed


def load_csv(
    path: str | Path,
    *,
    time_col: str,
    target_col: str,
    entity_col: str | None = None,
    known_cols: Sequence[str] | str | None = None,
    static_cols: Sequence[str] | str | None = None,
    observed_cols: Sequence[str] | str | None = None,
    fill_gaps: bool = False,
    future_rows: bool = False,
) -> SeriesData:
    """Read a long-format CSV (optionally gzip-compressed) or Parquet file into SeriesData.

    Parameters
    ----------
    path : str or Path
        A ``.csv``, ``.csv.gz`` (header row, UTF-8 with or without byte-order mark) or
        ``.parquet`` file, one row per (entity, time step).
    time_col : str
        The time column: ISO 8601 date times (``2001-01-31T23:00``, ``2001-01-31 23:00``;
        time-zone-aware values are converted to UTC; a file mixing values with and without a
        UTC offset is refused) or plain numbers (a step counter, fractional steps allowed).
    target_col : str
        The column to forecast. It is also the first observed input.
    entity_col : str, optional
        The column naming the series (entity) of each row; without it the file is one series.
        Rows of one entity keep their file order, which must be by increasing time.
    known_cols : sequence of str or comma-separated str, optional
        Inputs known in advance (their future values are given to the decoder).
    static_cols : sequence of str or comma-separated str, optional
        Per-entity constants (latitude, ...); each must be constant within an entity.
    observed_cols : sequence of str or comma-separated str, optional
        Past-only inputs besides the target. Default: every column not named above.
    fill_gaps : bool, default False
        Repair instead of rejecting: missing time steps are inserted and missing cells (empty,
        ``NaN``, ``NA``) filled within the entity. The target and the observed columns carry
        their last value forward (a repaired step never reads a later value; before an observed
        column's first value: NaN, read as its training mean); the known columns are interpolated
        linearly, but a column of at most 16 whole-number levels (a flag, a category) is carried
        (``SeriesData.carried``), and before its first value gets its first value. Repaired
        target steps (``SeriesData.filled_target``) are inputs only, never trained on or scored.
        Rows before an entity's first target value are refused, with ``future_rows`` too.
        Counts: ``SeriesData.n_filled``, ``SeriesData.filled`` (per entity and column); more than
        :data:`~nbqat.data.MAX_FILL_FRACTION` of an entity's rows in one column is refused.
    future_rows : bool, default False
        Accept rows after each entity's last target value with an empty target (and empty
        observed columns): the rows to forecast, whose known columns ``nbqat predict`` reads.
        Their target and observed cells stay NaN, their known cells as given (NaN when
        empty); the checks and repairs above apply to the rows up to the last target value.

    Returns
    -------
    SeriesData

    Raises
    ------
    DataError
        (a ValueError) for a missing, unreadable or truncated file, a missing or duplicated
        column, a non-numeric, missing, non-finite or huge (beyond
        :data:`~nbqat.data.MAX_ABS_VALUE`) value, a duplicate, unsorted or irregular
        timestamp, a gap (without ``fill_gaps``), mixed date/number time values or mixed time
        zones, or a static column that varies within an entity. The message names the line
        and column and says the fix.
    """
    path = Path(path)
    parquet, header = _file_header(path)
    observed, known, static, cols = _columns(
        str(path), header, time_col, target_col, entity_col, known_cols, static_cols, observed_cols
    )
    numeric = _unique([target_col] + observed + known + static)
    df = _read_checked(path, cols, entity_col, parquet, len(header), numeric, time_col)
    data = _frame_to_series(
        df, _file_place(path, parquet), str(path), time_col, target_col, entity_col, observed,
        known, static, (fill_gaps, future_rows),
    )  # fmt: skip
    if not parquet:  # pyarrow parsed the times: the spelling from the file's first row
        data.time_format = _csv_time_spelling(path, header.index(time_col), data.time_format)
    return data


def _file_header(path: Path) -> tuple[bool, list[str]]:
    """``(parquet, header)`` of the file at ``path`` (a DataError when there is none)."""
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "no such file"
        raise DataError(f"--csv {str(path)!r}: {what}")
    parquet = path.suffix.lower() in (".parquet", ".pq")
    return parquet, _parquet_header(path) if parquet else _read_header(path)


def _file_place(path: Path, parquet: bool) -> Callable[[int], str]:
    """Where a row of the file is, for messages: ``"<path>, line <n>"`` (CSV: the line number
    in the file, header = 1) or ``"<path>, row <i>"`` (Parquet: the 0-based row)."""

    def where(i: int) -> str:
        return f"{path}, row {i}" if parquet else f"{path}, line {_line_of_row(path, i)}"

    return where


def _columns(
    src: str,
    header: list[str],
    time_col: str,
    target_col: str,
    entity_col: str | None,
    known_cols: Sequence[str] | str | None,
    static_cols: Sequence[str] | str | None,
    observed_cols: Sequence[str] | str | None,
) -> tuple[list[str], list[str], list[str], list[str]]:
    """``(observed, known, static, cols)`` of a table with ``header``, its column roles checked:
    the observed, known and static inputs and every column to read (time and target first)."""
    known, static = _names(known_cols), _names(static_cols)
    roles = _roles(time_col, target_col, entity_col, known, static, observed_cols)
    observed = _check_columns(src, header, roles, observed_cols)
    cols = _unique([time_col, target_col] + observed + known + static + _opt(entity_col))
    return observed, known, static, cols


def _csv_time_spelling(path: Path, j: int, parsed: str) -> str:
    """The time spelling of a CSV's first data row (column ``j``; pyarrow parsed the times, so
    the parsed column no longer shows it); ``parsed`` when there is no such cell."""
    row = next((r for _, r in _csv_rows(path)), None)
    if row is not None and len(row) > j:
        return time_spelling(_pd_series([row[j]]))
    return parsed


def _pd_series(values: list) -> Any:
    import pandas as pd

    return pd.Series(values, dtype=object)


def _parquet_header(path: Path) -> list[str]:
    try:
        import pyarrow.parquet as pq

        return [str(c) for c in pq.read_schema(path).names]
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a corrupt file
        raise DataError(f"{path}: cannot read it as Parquet ({e})") from None


def _read_checked(
    path: Path,
    cols: list[str],
    entity_col: str | None,
    parquet: bool,
    ncol: int,
    numeric: list,
    time_col: str,
) -> Any:
    """:func:`~nbqat.data._arrow.read_table`, its errors turned into DataErrors that say the fix."""
    import pandas as pd

    try:
        df = read_table(path, cols, entity_col, parquet, numeric, time_col)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file has a header but no data rows") from None
    except (*_READ_ERRORS, ValueError, pd.errors.ParserError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Expected" in msg and "columns" in msg:  # pyarrow: a row with another field count
            bad = _field_count_error(path, ncol)
            raise DataError(
                bad or f"{path}: {msg[:200]}; every row needs as many fields as the header has"
            ) from None
        raise DataError(
            f"{path}: cannot read it ({msg[:200]}); is the file truncated or not a "
            f"{'Parquet' if parquet else 'CSV'} file?"
        ) from None
    if len(df) == 0:
        raise DataError(f"{path}: the file has a header but no data rows")
    return df


def from_dataframe(
    df: Any,
    *,
    time_col: str,
    target_col: str,
    entity_col: str | None = None,
    known_cols: Sequence[str] | str | None = None,
    static_cols: Sequence[str] | str | None = None,
    observed_cols: Sequence[str] | str | None = None,
    fill_gaps: bool = False,
    source: str = "DataFrame",
    future_rows: bool = False,
) -> SeriesData:
    """A long-format pandas DataFrame -> :class:`SeriesData`, with :func:`load_csv`'s checks.

    Parameters
    ----------
    df : pandas.DataFrame
        One row per (entity, time step); the time column may be ``datetime64`` (naive or
        time-zone-aware), ISO 8601 strings or numbers. The time and entity columns may be
        index levels (a ``DatetimeIndex`` named ``time_col``); a ``Period`` time column reads
        as its periods' start times.
    time_col, target_col, entity_col, known_cols, static_cols, observed_cols, fill_gaps
        As in :func:`load_csv`.
    source : str, default "DataFrame"
        The name used in messages and in ``SeriesData.source``.
    future_rows : bool, default False
        As in :func:`load_csv`.

    Returns
    -------
    SeriesData

    Raises
    ------
    TypeError
        When ``df`` is not a pandas DataFrame.
    DataError
        As :func:`load_csv` (row numbers are 0-based positions in ``df``).
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    df = index_columns(df, time_col, entity_col)
    header = [str(c) for c in df.columns]
    observed, known, static, cols = _columns(
        source, header, time_col, target_col, entity_col, known_cols, static_cols, observed_cols
    )
    sub = df.reset_index(drop=True)
    sub.columns = header
    return _frame_to_series(
        sub[cols],
        lambda i: f"{source}, row {i}",
        source,
        time_col,
        target_col,
        entity_col,
        observed,
        known,
        static,
        (fill_gaps, future_rows),
    )


def index_columns(df: Any, time_col: str | None, *names: str | None) -> Any:
    """``df`` with the index levels that ``time_col`` and ``names`` name (and no column does)
    as columns (a time series' ``DatetimeIndex`` named ``time_col``, the levels of an
    ``(entity, time)`` MultiIndex), and a pandas ``Period`` time column as the periods' start
    times (``1959Q1``: 1959-01-01, a calendar-month axis). ``df`` itself when there is
    nothing to change; row positions stay."""
    import pandas as pd

    levels = [n for n in dict.fromkeys((time_col, *names)) if n is not None
              and n not in df.columns and n in df.index.names]  # fmt: skip
    if levels:
        df = df.reset_index(level=levels)
    if (
        time_col is not None
        and time_col in df.columns
        and isinstance(df[time_col].dtype, pd.PeriodDtype)
    ):
        df = df.assign(**{time_col: df[time_col].dt.to_timestamp()})
    return df


def _opt(c: str | None) -> list[str]:
    return [c] if c is not None else []


def _unique(cols: list[str]) -> list[str]:
    return list(dict.fromkeys(cols))


def _roles(time_col, target_col, entity_col, known, static, observed_cols) -> dict:
    roles = {"--time-col": [time_col], "--target-col": [target_col]}
    if entity_col is not None:
        roles["--entity-col"] = [entity_col]
    roles["--known-cols"] = known
    roles["--static-cols"] = static
    if observed_cols is not None:
        roles["--observed-cols"] = _names(observed_cols)
    return roles


def _frame_to_series(
    df, where, src, time_col, target_col, entity_col, observed, known, static, modes
) -> SeriesData:
    fill_gaps, future_rows = modes
    if len(df) == 0:  # a file's is refused in _read_checked: a DataFrame's
        raise DataError(f"{src}: no data rows (the table is empty)")
    t_col = df[time_col]
    t = parse_time_column(t_col, time_col, where)
    spelling = time_spelling(t_col)
    if entity_col is not None:
        coded = df.entity_codes(entity_col) if isinstance(df, ArrowColumns) else None
        if coded is None:
            ent_s = df[entity_col]
            miss = ent_s.isna().to_numpy()
            if miss.any():
                i = int(np.argmax(miss))
                raise DataError(f"{where(i)}: column {entity_col!r} (--entity-col) has no value")
            coded = _factorize(ent_s)
        codes, names = coded
    else:
        codes, names = np.zeros(len(df), dtype=np.int64), ["series"]
    per = entity_rows(codes, len(names))
    del codes
    # monthly, quarterly, yearly dates: datetime64[M]
    t, month_day = month_axis(t, per, names, where)
    # Each entity's own arrays, filled straight from the table's chunks (one copy).
    sizes = [r.stop - r.start if isinstance(r, slice) else len(r) for r in per]
    target = [np.empty(n) for n in sizes]
    obs = [np.empty((n, len(observed))) for n in sizes]
    kno = [np.empty((n, len(known))) for n in sizes]
    for role, cols_k, dest in (
        ("--target-col", [target_col], [a[:, None] for a in target]),
        ("", observed, obs),
        ("--known-cols", known, kno),
    ):
        place([numeric_pieces(df, c, where, fill_gaps or future_rows, role) for c in cols_k],
              per, dest)  # fmt: skip
    statics = np.zeros((len(names), len(static)))
    changes = []
    for j, c in enumerate(static):
        pieces = numeric_pieces(df, c, where, False, "--static-cols")
        statics[:, j], change = static_values(pieces, per)
        changes.append(change)
    data = regularise(
        t, per, names, target, obs, kno, statics, changes, where, src, target_col, observed,
        known, static, modes,
    )  # fmt: skip
    data.time_format = spelling
    data.month_day = month_day
    return data


def _factorize(s: Any) -> tuple[np.ndarray, list]:
    import pandas as pd

    codes, uniques = pd.factorize(s.astype(str).str.strip(), sort=False)
    return codes.astype(np.int64), [str(u).strip() for u in uniques]
