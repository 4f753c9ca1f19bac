"""The data a forecast of a finished run reads (a path, a DataFrame, a SeriesData; by default
the run's own: its ``--csv``, or the ``data.parquet`` a :meth:`nbqat.Forecaster.fit` stored),
and the dtypes its key columns (``entity``, ``time``, ``origin``) come back in: a DataFrame's
own, the fitted DataFrame's for the run's own ``data.parquet``, text for a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nbqat.data import DataError, SeriesData

__all__ = ["fitted_keys", "keys_like", "read_data", "run_data_path"]


def read_data(cfg: dict, data: Any, fill_gaps: bool | None = None, run: Path | None = None
              ) -> SeriesData:  # fmt: skip
    """The data to forecast from: ``data`` (a path, a pandas DataFrame, a SeriesData; None:
    the run's own data, :func:`run_data_path`) read with the run's column roles and rows to
    forecast allowed.

    Raises
    ------
    FileNotFoundError
        A path that does not exist.
    TypeError
        ``data`` of another type.
    DataError
        As :func:`nbqat.data.load_csv` (the columns named by the run missing, bad values ...).
    """
    from nbqat.train.model import column_roles

    if isinstance(data, SeriesData):
        return data
    cols = column_roles(cfg)
    try:
        return _read(cfg, data, fill_gaps, run, cols)
    except DataError as e:
        if not any(f"--{k.replace('_', '-')}" in str(e) for k in cols):
            raise
        named = ", ".join(f"{k}={v!r}" for k, v in cols.items() if v)
        raise DataError(f"{e} (the options name the run's columns, which the data needs: "
                        f"{named})") from None  # fmt: skip


def _read(cfg: dict, data: Any, fill_gaps: bool | None, run: Path | None, cols: dict
          ) -> SeriesData:  # fmt: skip
    """:func:`read_data` less the context of its column errors."""
    from nbqat.data import from_dataframe, load_csv

    fill = bool(cfg.get("fill_gaps")) if fill_gaps is None else bool(fill_gaps)
    if data is not None and not isinstance(data, (str, os.PathLike)):
        import pandas as pd

        if not isinstance(data, pd.DataFrame):  # from_dataframe's message names its "df"
            raise TypeError(
                f"data must be a pandas DataFrame, a path or a SeriesData, got "
                f"{type(data).__name__}"
            )
        return from_dataframe(data, fill_gaps=fill, future_rows=True, **cols)
    path = Path(data) if data is not None else run_data_path(cfg, run)
    if not path.is_file():
        raise FileNotFoundError(f"--csv {str(path)!r} does not exist")
    return load_csv(path, fill_gaps=fill, future_rows=True, **cols)


def run_data_path(cfg: dict, run: Path | None) -> Path:
    """The file of the run's own data: its ``--csv`` (default the shipped data), or the run
    folder's ``data.parquet`` (a Forecaster's run reads its own copy: a saved copy's stored
    path names the folder it was fitted in, which a later fit there may have overwritten; a
    moved run folder too).

    Raises
    ------
    FileNotFoundError
        The run's data no longer exists (the message names ``--csv PATH``).
    """
    from nbqat.data import tmy3_path

    path = Path(cfg.get("csv") or tmy3_path())
    own = run / "data.parquet" if run is not None else None
    if own is not None and own.is_file() and (path.name == own.name or not path.is_file()):
        return own
    if run is not None and not path.is_file():
        raise FileNotFoundError(
            f"the run's data {str(path)!r} no longer exists: pass the data (--csv PATH)"
        )
    return path


def fitted_keys(run: Path, cfg: dict) -> Any:
    """The key columns (time, entity) of the DataFrame a :meth:`nbqat.Forecaster.fit` stored
    in the run folder (``data.parquet``, its dtypes kept by pandas' Parquet metadata), for
    :func:`keys_like`; None for a run of a file (its keys stay text, as the CLI writes them)."""
    own = run_data_path(cfg, run)
    if own != run / "data.parquet":
        return None
    import pandas as pd

    cols = [c for c in (cfg.get("time_col"), cfg.get("entity_col")) if c]
    return pd.read_parquet(own, columns=cols)


def keys_like(df: Any, data: Any, cfg: dict) -> Any:
    """``df`` with its ``entity``, ``time`` and ``origin`` columns in the dtypes of a
    DataFrame ``data``'s entity and time columns (or index levels) where those are not text:
    a pandas user's datetime64 (naive, aware or pyarrow) and integer or categorical keys come
    back as such, so that the forecasts merge with the frame; text keys stay the data's
    spelling (a path's too)."""
    import pandas as pd

    if not isinstance(data, pd.DataFrame):
        return df

    def dtype(col: Any) -> Any:
        if col is None:  # no entity column (a RangeIndex is named None too)
            return None
        if col in data.columns:
            return data[col].dtype
        return data.index.get_level_values(col).dtype if col in data.index.names else None

    t, e = dtype(cfg.get("time_col")), dtype(cfg.get("entity_col"))
    if t is not None and pd.api.types.is_datetime64_any_dtype(t):
        for c in ("time", "origin"):
            if c in df.columns:  # spelled as ISO 8601, with +00:00 where aware (UTC)
                df[c] = pd.to_datetime(df[c], format="ISO8601").astype(t)
    if e is not None and not pd.api.types.is_string_dtype(e):  # object too
        df["entity"] = df["entity"].astype(e)
    return df
