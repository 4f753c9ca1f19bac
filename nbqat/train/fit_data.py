"""The DataFrame of :meth:`nbqat.Forecaster.fit` in its run folder (``OUT/data.parquet``):
the columns ``fit``'s arguments name checked, the frame checked, stored, and set aside / put
back around the run (a failed fit leaves a previous run with its own data)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["check_columns", "check_list_name", "put_back", "store_frame", "to_parquet"]


def store_frame(df: Any, cfg: Any, out: Path, overwrite: bool) -> Path | None:
    """Check ``df`` with the reader's checks on the DataFrame itself (so a data error names
    ``"DataFrame, row N"``, N the 0-based position in ``df``, as ``predict`` does, not the copy
    written below), and the options against it (``nbqat train --check`` on a staged copy), then
    write it to ``cfg.csv`` (``OUT/data.parquet``), the file the run reads: a refused fit leaves
    the folder, a previous run's data included, as it was. A previous run's data is kept aside
    (returned: the hidden file; None without one) until the fit ends (:func:`put_back`); a
    ``data.parquet`` in ``out`` that is no run's (no ``checkpoint/`` beside it) is refused, not
    replaced."""
    import dataclasses

    from nbqat.data import from_dataframe
    from nbqat.train import preflight, run
    from nbqat.train.model import column_roles

    preflight.check_out(out, overwrite)
    if Path(cfg.csv).exists() and not (out / "checkpoint").is_dir():
        raise ValueError(
            f"out={str(out)!r} holds a {Path(cfg.csv).name} that is no run's data: fit stores "
            "its DataFrame there; choose another out (or move that file)"
        )
    from_dataframe(df, fill_gaps=bool(cfg.fill_gaps), **column_roles(vars(cfg)))
    with tempfile.TemporaryDirectory(prefix="nbqat-fit-") as tmp:
        staged = Path(tmp) / "data.parquet"
        to_parquet(df, staged)
        run(dataclasses.replace(cfg, csv=str(staged)), check_only=True)
        out.mkdir(parents=True, exist_ok=True)
        prev = None
        if Path(cfg.csv).is_file():
            prev = out / ".nbqat-data-previous.parquet"
            os.replace(cfg.csv, prev)
        shutil.move(str(staged), cfg.csv)
    return prev


def put_back(data: Path, prev: Path | None) -> None:
    """After a failed fit: the previous run's data (``prev``, :func:`store_frame`'s) back to
    ``data``, or ``data`` removed when there was none (the folder it is in may be gone)."""
    if prev is not None:
        os.replace(prev, data)
    elif data.is_file():
        data.unlink()


def to_parquet(df: Any, path: Path) -> None:
    """``df.to_parquet(path)``; a frame pyarrow cannot store is a DataError."""
    from nbqat.data import DataError

    try:
        df.to_parquet(path, index=False)
    except (ValueError, TypeError) as e:  # pyarrow's ArrowInvalid / ArrowTypeError
        msg = " ".join(str(a) for a in e.args) if e.args else type(e).__name__
        raise DataError(
            f"DataFrame: cannot store it in the run folder as Parquet ({msg[:300]}); give each "
            "column one type (e.g. df[col] = pd.to_numeric(df[col]) for a column mixing numbers "
            "and numeric strings), or drop the columns the run does not use"
        ) from None


def check_columns(df: Any, **named: Any) -> None:
    """Every column that ``fit``'s arguments name is a string (a TypeError saying how to name
    the columns) and is in the DataFrame: a DataError naming the argument, the missing column, a
    close match and the DataFrame's columns (before anything is written or trained)."""
    import difflib

    from nbqat.data import DataError

    have = [str(c) for c in df.columns]
    for arg, cols in named.items():
        if cols is None:
            continue
        if isinstance(cols, str):  # one name; a list argument may spell its names "a,b"
            cols = [c.strip() for c in cols.split(",")] if arg.endswith("_cols") else [cols]
        elif not arg.endswith("_cols") or not isinstance(cols, Iterable):
            cols = [cols]
        cols = list(cols)
        bad = next((c for c in cols if not isinstance(c, str)), None)
        if bad is not None:
            raise TypeError(
                f"fit: {arg} names the column {bad!r} ({type(bad).__name__}); column names must "
                f"be strings: give the DataFrame string column names (df.columns = "
                f"df.columns.map(str), e.g. after pd.read_csv(header=None)) and pass them as "
                f"strings ({arg}={str(bad)!r})"
            )
        for col in cols:
            check_list_name(arg, col)
            if str(col) not in have:
                close = difflib.get_close_matches(str(col), have, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise DataError(
                    f"fit: {arg}={col!r} is not a column of the DataFrame{hint}; its columns: "
                    f"{have}"
                )


def check_list_name(arg: str, col: str) -> None:
    """A DataError for a name in a list argument (``known_cols=[...]``) that the run cannot
    keep: the run stores each list comma-separated and strips its names (``--known-cols
    "a, b"``), so ``"price, EUR"`` became two columns and ``"price "`` another one."""
    from nbqat.data import DataError

    if not arg.endswith("_cols") or ("," not in col and col == col.strip()):
        return
    why = "a comma" if "," in col else "leading or trailing whitespace"
    fixed = col.strip().replace(",", "")
    raise DataError(
        f"fit: {arg} names the column {col!r}, which has {why}: the run stores its column "
        f"lists as comma-separated names with the spaces around them stripped; rename it "
        f"(df = df.rename(columns={{{col!r}: {fixed!r}}})) and name it so"
    )
