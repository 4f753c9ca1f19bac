"""The shipped dataset and the TFT window builder.

Two steps:

1. :func:`load_csv` (CSV, CSV.gz or Parquet, read by pyarrow), :func:`from_dataframe` (a
   pandas DataFrame) or :func:`load_tmy3` (the shipped data) read a long-format table (one row
   per entity and time step) into a :class:`SeriesData`: per entity, a regular time axis, the
   target, the observed inputs, the known inputs and the static values. Bad input gets a clear
   :class:`DataError` naming the file, line and column: missing or duplicated columns,
   non-numeric, missing or huge values, duplicate or unsorted timestamps, mixed time zones,
   gaps (or, with ``fill_gaps=True``, a documented, counted and bounded repair), series too
   short.
2. :func:`make_windows` turns it into TFT windows (:class:`Windows`): a split by time into
   train / validation / test with no leakage, per-entity standardisation fitted on the training
   rows only, calendar features, static features, and a seasonal-naive baseline. Windows are
   index arrays into shared per-row matrices; batches are gathered lazily.

Modules: ``_reader`` (tables -> series: roles, checks, errors), ``_arrow`` (the pyarrow read
and its columns as NumPy), ``_values`` (the numeric columns' checks, copied into per-entity
arrays), ``_timecol`` (the time column), ``_months`` (monthly, quarterly and yearly dates: a
calendar-month axis), ``_regular`` (ordering, step, gaps), ``_tmy3`` (the shipped dataset),
``_calendar`` (calendar features), ``_windows`` (the window builder).

The shipped dataset (``tmy3_two_stations.csv.gz``) holds one year of hourly NREL TMY3 weather
observations for two US stations; see ``nbqat/data/README.md`` for its source and licence
(U.S. government data, public domain; copied from pvlib-python's test data, BSD-3-Clause).
"""

from __future__ import annotations

from nbqat.data._calendar import CALENDAR_FEATURES
from nbqat.data._reader import from_dataframe, load_csv
from nbqat.data._scaling import Scaling
from nbqat.data._series import MAX_ABS_VALUE, MAX_FILL_FRACTION, DataError, SeriesData
from nbqat.data._tmy3 import TMY3_COLUMNS, TMY3_FILE, TMY3_UNITS, load_tmy3, tmy3_path
from nbqat.data._windows import SplitWindows, Windows, make_windows, seasonal_naive_quantiles

__all__ = [
    "CALENDAR_FEATURES",
    "DataError",
    "MAX_ABS_VALUE",
    "MAX_FILL_FRACTION",
    "Scaling",
    "SeriesData",
    "SplitWindows",
    "Windows",
    "TMY3_COLUMNS",
    "TMY3_FILE",
    "TMY3_UNITS",
    "from_dataframe",
    "load_csv",
    "load_tmy3",
    "make_windows",
    "seasonal_naive_quantiles",
    "tmy3_path",
]
